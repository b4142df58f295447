#include "server/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

// The leaf (first) certificate of a PEM chain; nullptr when there is none.
std::unique_ptr<X509, decltype(&X509_free)> FirstCertificate(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr, X509_free);
  ERR_clear_error();
  return cert;
}

std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> PrivateKey(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr, EVP_PKEY_free);
  ERR_clear_error();
  return key;
}

// Reads the PEM file of `flag` and checks that it parses as what it should be: certificates
// (the first one not expired) or an unencrypted private key.
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path, bool private_key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s: cannot read %s: %s", flag, path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (private_key) {
    if (!PrivateKey(pem)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s: %s is not an unencrypted PEM private key", flag, path));
    }
    return pem;
  }
  auto cert = FirstCertificate(pem);
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s: %s holds no PEM certificate", flag, path));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s: the certificate in %s has expired", flag, path));
  }
  return pem;
}

// Reads whichever of the three files are named.
absl::StatusOr<TlsConfig> ReadAll(const TlsFlags& flags) {
  TlsConfig c;
  c.enabled = flags.any();
  if (!flags.cert.empty()) {
    auto pem = ReadPem("tls-cert", flags.cert, /*private_key=*/false);
    if (!pem.ok()) return pem.status();
    c.cert_pem = std::move(*pem);
  }
  if (!flags.key.empty()) {
    auto pem = ReadPem("tls-key", flags.key, /*private_key=*/true);
    if (!pem.ok()) return pem.status();
    c.key_pem = std::move(*pem);
    if (X509_check_private_key(FirstCertificate(c.cert_pem).get(), PrivateKey(c.key_pem).get()) !=
        1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrFormat(
          "--tls-key: %s is not the private key of the certificate in --tls-cert %s", flags.key,
          flags.cert));
    }
  }
  if (!flags.ca.empty()) {
    auto pem = ReadPem("tls-ca", flags.ca, /*private_key=*/false);
    if (!pem.ok()) return pem.status();
    c.ca_pem = std::move(*pem);
  }
  return c;
}

absl::Status CheckPair(const TlsFlags& flags) {
  if (!flags.cert.empty() && flags.key.empty()) {
    return absl::InvalidArgumentError("--tls-key is required with --tls-cert");
  }
  if (flags.cert.empty() && !flags.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert is required with --tls-key");
  }
  return absl::OkStatus();
}

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

absl::StatusOr<TlsConfig> LoadServerTls(const TlsFlags& flags) {
  if (absl::Status s = CheckPair(flags); !s.ok()) return s;
  if (!flags.ca.empty() && flags.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca needs --tls-cert and --tls-key (mutual TLS: this server's own certificate)");
  }
  return ReadAll(flags);
}

absl::StatusOr<TlsConfig> LoadClientTls(const TlsFlags& flags) {
  if (absl::Status s = CheckPair(flags); !s.ok()) return s;
  return ReadAll(flags);
}

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
