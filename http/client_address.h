// Who a request comes from, for fairness between tenants: its API key when it carries one,
// else the client's address. Behind a proxy (an ingress, a load balancer) every client shares
// the proxy's address, so the address the proxy reports (X-Forwarded-For, or Forwarded's for=)
// is believed, but only when the peer is one of the operator's trusted proxies: the rightmost
// address in the chain that is not itself a trusted proxy. A client reaching the router directly
// cannot name itself anyone else.
#ifndef TANDEM_HTTP_CLIENT_ADDRESS_H_
#define TANDEM_HTTP_CLIENT_ADDRESS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "http/http_parser.h"

namespace tandem {

class TrustedProxies {
 public:
  // A comma-separated list of addresses and CIDR ranges, IPv4 or IPv6 ("10.0.0.0/8,
  // 192.168.1.7, fd00::/8"); empty: none. INVALID_ARGUMENT naming the bad entry.
  static absl::StatusOr<TrustedProxies> Parse(std::string_view list);
  bool Contains(std::string_view address) const;
  bool empty() const { return ranges_.empty(); }

 private:
  struct Range {
    std::array<uint8_t, 16> bytes{};  // IPv4 as ::ffff:a.b.c.d
    int prefix_bits = 128;
  };
  std::vector<Range> ranges_;
};

// The client's address: `head.peer`, or from a trusted proxy the forwarded one.
std::string ClientAddress(const HttpRequest& head, const TrustedProxies& proxies);

// The tenant a request counts for: with `by_key` (the server checks API keys, so only valid
// ones get this far) its key's namespace (router/request_id.h CallerNamespace: "key:" and a
// digest, the same a gRPC call with the key counts for; the key itself is not kept); else, or
// without the header, "addr:" and ClientAddress. Without API keys a client could name itself a new
// tenant with every request, so keys count only when they are checked.
std::string TenantOf(const HttpRequest& head, const TrustedProxies& proxies, bool by_key);

}  // namespace tandem

#endif  // TANDEM_HTTP_CLIENT_ADDRESS_H_
