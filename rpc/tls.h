// The gRPC credentials of Tandem's ports and channels, made from a TlsConfig
// (security/tls_config.h), and the client side's API key. No gRPC headers here: the CLI's plain
// headers carry these structs; the credentials come from rpc/tls.cc.
//
// Without a CA, a process's outgoing calls verify peers against gRPC's default roots (the
// system's, or the file named by GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) and present no certificate.
#ifndef TANDEM_RPC_TLS_H_
#define TANDEM_RPC_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "security/tls_config.h"

namespace grpc {
class ChannelCredentials;
class ClientContext;
class ServerCredentials;
}  // namespace grpc

namespace tandem {

// The credentials of a server's listening port.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& tls);

// The credentials of a server process's own calls to its peers: TLS when it serves TLS,
// presenting its certificate only under mutual TLS.
std::shared_ptr<grpc::ChannelCredentials> MakePeerChannelCredentials(const TlsConfig& server_tls);

// The credentials of a client (LoadClientTls): its certificate, when it has one, is presented.
std::shared_ptr<grpc::ChannelCredentials> MakeClientChannelCredentials(const TlsConfig& client_tls);

// LoadClientTls, then MakeClientChannelCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const TlsFlags& flags);

// How a client reaches the public API: TLS and a bearer token.
struct ClientSecurity {
  TlsFlags tls;
  std::string api_key;  // empty: none sent
};

// The API key a client sends: `flag_value` when given, else $TANDEM_API_KEY, else none.
std::string ApiKeyFromFlagOrEnv(const std::string& flag_value);

// Adds `authorization: Bearer KEY` to a call (nothing for an empty key).
void AddApiKey(const std::string& api_key, grpc::ClientContext* ctx);

}  // namespace tandem

#endif  // TANDEM_RPC_TLS_H_
