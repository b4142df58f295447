#include "rpc/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <cstdlib>

namespace tandem {
namespace {

std::shared_ptr<grpc::ChannelCredentials> SslChannel(const TlsConfig& tls, bool present_cert) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls.ca_pem;  // empty: gRPC's default roots
  if (present_cert && !tls.cert_pem.empty()) {
    o.pem_cert_chain = tls.cert_pem;
    o.pem_private_key = tls.key_pem;
  }
  return grpc::SslCredentials(o);
}

}  // namespace

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& tls) {
  if (!tls.enabled) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      tls.ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                         : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls.ca_pem;
  o.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> MakePeerChannelCredentials(const TlsConfig& server_tls) {
  return SslChannel(server_tls, /*present_cert=*/server_tls.mutual());
}

std::shared_ptr<grpc::ChannelCredentials> MakeClientChannelCredentials(
    const TlsConfig& client_tls) {
  return SslChannel(client_tls, /*present_cert=*/true);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const TlsFlags& flags) {
  auto tls = LoadClientTls(flags);
  if (!tls.ok()) return tls.status();
  return MakeClientChannelCredentials(*tls);
}

std::string ApiKeyFromFlagOrEnv(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  const char* env = std::getenv("TANDEM_API_KEY");
  return env ? std::string(env) : std::string();
}

void AddApiKey(const std::string& api_key, grpc::ClientContext* ctx) {
  if (!api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + api_key);
}

}  // namespace tandem
