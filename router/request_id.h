// Request ids. The router tracks each request in flight by an id no other request in flight
// has: one it draws itself (128 random bits: nobody can name, and so squat, an id before the
// router hands it out), or the id the client chose, scoped to the client's own namespace (its
// API key, or its connection when the router has no keys), so that one caller's ids never
// collide with another's nor with the router's. The client sees its own id echoed unchanged;
// the router's logs and the workers see the scoped one. Pure functions: no gRPC.
#ifndef TANDEM_ROUTER_REQUEST_ID_H_
#define TANDEM_ROUTER_REQUEST_ID_H_

#include <string>
#include <string_view>

namespace tandem {

// "req-" and 32 hex digits from the operating system's cryptographic random source.
std::string NewRequestId();

// The namespace of a caller's own request ids. With an API key: "key:" and 32 hex digits of its
// SHA-256 (never the key itself: scoped ids reach the logs), the same for every connection that
// presents it. Without: "peer:" and its connection (gRPC's peer, "ipv4:127.0.0.1:52314"), with
// '%' and '/' escaped. Neither holds a '/'.
std::string CallerNamespace(std::string_view api_key, std::string_view peer);

// The id the router tracks a request by: `client_id` scoped to `caller` ("CALLER/ID"; a caller
// without a namespace is "local"), or a new id (NewRequestId) when the client chose none.
// Different (caller, id) pairs give different ids, and none is ever one the router draws
// (those hold no '/').
std::string ScopedRequestId(std::string_view caller, std::string_view client_id);

}  // namespace tandem

#endif  // TANDEM_ROUTER_REQUEST_ID_H_
