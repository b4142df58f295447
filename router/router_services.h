// The router's two gRPC services, thin adaptors over Router's methods: the public Generation API
// (every call passes the API keys first) and the internal Registry (every call proves the
// cluster's credentials first).
#ifndef TANDEM_ROUTER_ROUTER_SERVICES_H_
#define TANDEM_ROUTER_ROUTER_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include <memory>

namespace tandem {

class Router;
class InternalAuth;

std::unique_ptr<grpc::Service> MakeGenerationService(Router* router);
// `auth` null: every call is refused UNAUTHENTICATED (the router has no cluster credentials).
std::unique_ptr<grpc::Service> MakeRegistryService(Router* router, InternalAuth* auth);

}  // namespace tandem

#endif  // TANDEM_ROUTER_ROUTER_SERVICES_H_
