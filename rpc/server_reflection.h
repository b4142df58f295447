// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), which grpcurl and the newer
// gRPC tools try before v1alpha. gRPC 1.51's reflection plugin
// (grpcpp/ext/proto_server_reflection_plugin.h) serves only v1alpha; the two protocols are the
// same messages under two package names, and this service answers from what the plugin reads:
// the process's generated descriptor pool, so every message and service compiled into the binary
// can be described. Served beside v1alpha on the router's public port only: the internal ports
// do not describe themselves to strangers (WithoutReflection).
#ifndef TANDEM_RPC_SERVER_REFLECTION_H_
#define TANDEM_RPC_SERVER_REFLECTION_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/server_builder_option.h>

#include <memory>
#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace tandem {

class ServerReflectionV1 final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the full names of the services the server serves, which list_services answers.
  explicit ServerReflectionV1(std::vector<std::string> services);

  // Reads requests until the client half-closes; answers each in turn.
  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

  // The answer to one request: a file and its imports, extension numbers, the services, or an
  // error_response (NOT_FOUND for an unknown file, symbol, type or extension; INVALID_ARGUMENT
  // for a request with none of the fields set).
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  std::vector<std::string> services_;
};

// A ServerBuilder option that leaves server reflection out. gRPC's reflection library registers
// its v1alpha plugin for every builder of the process when it is loaded, so without this option
// every port would describe its services, the internal ones included.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override;
};

}  // namespace tandem

#endif  // TANDEM_RPC_SERVER_REFLECTION_H_
