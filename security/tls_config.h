// TLS configuration from PEM files (`--tls-cert`, `--tls-key`, `--tls-ca`) and the cluster roles
// a certificate names. No gRPC here: the gRPC credentials are made in rpc/tls.h, the raw
// sockets' (KV transfer, HTTP) in security/secure_socket.h.
//
// A server with a certificate and key serves TLS. With a CA as well it is mutual TLS: every
// connection must present a certificate that the CA signed, and the process's own calls to its
// peers present its certificate and verify the peer against the CA.
//
// Roles. Under mutual TLS the cluster's internal surfaces (the registry, the worker services,
// the KV transfer) accept a peer only when its certificate names a role that may make the call,
// as a URI subject alternative name "urn:tandem:role:router", "urn:tandem:role:prefill" or
// "urn:tandem:role:decode" (one process may hold several). A certificate without a role (a
// client of the public API) reaches the public API only.
#ifndef TANDEM_SECURITY_TLS_CONFIG_H_
#define TANDEM_SECURITY_TLS_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

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
  std::string ca_pem;  // empty: the default roots (and, on a server, no client certificates)

  bool mutual() const { return enabled && !ca_pem.empty() && !cert_pem.empty(); }
};

// A server's flags: none (plaintext), --tls-cert with --tls-key (TLS), or all three (mTLS).
// Errors name the flag: one of cert/key without the other, --tls-ca without them, an unreadable
// file, a file that is not the PEM it should be.
absl::StatusOr<TlsConfig> LoadServerTls(const TlsFlags& flags);

// A client's flags: none (plaintext), or TLS verifying the server against --tls-ca (the default
// roots without it), presenting --tls-cert/--tls-key (both or neither) when given.
absl::StatusOr<TlsConfig> LoadClientTls(const TlsFlags& flags);

// The roles of a cluster process, as a bit set.
enum class PeerRole : uint8_t { kRouter = 1, kPrefill = 2, kDecode = 4 };
class RoleSet {
 public:
  constexpr RoleSet() = default;
  constexpr RoleSet(PeerRole r) : bits_(static_cast<uint8_t>(r)) {}  // NOLINT: implicit
  constexpr RoleSet operator|(RoleSet o) const { return RoleSet(bits_ | o.bits_); }
  constexpr bool Has(PeerRole r) const { return bits_ & static_cast<uint8_t>(r); }
  constexpr bool Intersects(RoleSet o) const { return (bits_ & o.bits_) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr bool operator==(const RoleSet&) const = default;
  // "router,prefill" ("none" when empty).
  std::string ToString() const;

 private:
  constexpr explicit RoleSet(int bits) : bits_(static_cast<uint8_t>(bits)) {}
  uint8_t bits_ = 0;
};
inline constexpr RoleSet operator|(PeerRole a, PeerRole b) { return RoleSet(a) | RoleSet(b); }

const char* RoleName(PeerRole role);
// "urn:tandem:role:NAME".
std::string RoleUri(PeerRole role);
// The roles named by URIs of the "urn:tandem:role:" form; other URIs are ignored.
RoleSet RoleOfUri(std::string_view uri);
// The roles the leaf certificate of `cert_pem` names (empty when it names none or does not
// parse).
RoleSet RolesOfCertificate(std::string_view cert_pem);

}  // namespace tandem

#endif  // TANDEM_SECURITY_TLS_CONFIG_H_
