// TLS and mutual TLS for Tandem's gRPC ports and channels, configured from PEM files
// (`--tls-cert`, `--tls-key`, `--tls-ca`), and the client side's API key. No gRPC headers here:
// the CLI's plain headers carry these structs; the credentials come from server/tls.cc.
//
// A server with a certificate and key serves TLS. With a CA as well it is mutual TLS: every
// connection must present a client certificate that the CA signed, and the process's own
// outgoing calls to its peers (router -> workers, worker -> router) present its certificate and
// verify the peer against the CA. Without a CA, outgoing calls verify peers against gRPC's
// default roots (the system's, or the file named by GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) and
// present no certificate.
#ifndef TANDEM_SERVER_TLS_H_
#define TANDEM_SERVER_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
class ClientContext;
class ServerCredentials;
}  // namespace grpc

namespace tandem {

// PEM file paths as given on a command line; empty: not given.
struct TlsFlags {
  std::string cert;  // --tls-cert: this side's certificate chain
  std::string key;   // --tls-key: its private key
  std::string ca;    // --tls-ca: the roots peers are verified against

  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The PEM contents.
struct TlsConfig {
  bool enabled = false;  // false: plaintext
  std::string cert_pem;  // empty for a client without a certificate
  std::string key_pem;
  std::string ca_pem;  // empty: gRPC's default roots (and, on a server, no client certificates)

  bool mutual() const { return enabled && !ca_pem.empty() && !cert_pem.empty(); }
};

// A server's flags: none (plaintext), --tls-cert with --tls-key (TLS), or all three (mTLS).
// Errors name the flag: one of cert/key without the other, --tls-ca without them, an unreadable
// file, a file that is not the PEM it should be.
absl::StatusOr<TlsConfig> LoadServerTls(const TlsFlags& flags);

// A client's flags: none (plaintext), or TLS verifying the server against --tls-ca (gRPC's
// default roots without it), presenting --tls-cert/--tls-key (both or neither) when given.
absl::StatusOr<TlsConfig> LoadClientTls(const TlsFlags& flags);

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

#endif  // TANDEM_SERVER_TLS_H_
