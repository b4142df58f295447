// tandem-health: a grpc.health.v1 client for container health checks (Docker HEALTHCHECK, or
// anywhere a Kubernetes native grpc probe is not available).
//   tandem-health [--address 127.0.0.1:7000] [--service NAME] [--timeout-ms 2000]
//                 [--tls-ca PEM] [--tls-cert PEM --tls-key PEM]
// Exit 0 when the server answers SERVING, 1 when it answers anything else or cannot be reached,
// 2 for bad flags. A server started with --tls-* needs the same files here: --tls-ca to trust
// it, and under mutual TLS --tls-cert/--tls-key to be let in.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "rpc/tls.h"
#include "tools/flags.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const tandem::Flags::Command command = {
      "tandem-health",
      "Asks a Tandem process's grpc.health.v1 service whether it is SERVING (exit 0: it is).",
      {tandem::ValueFlag("address", "HOST:PORT", "127.0.0.1:7000", "The process's gRPC port"),
       tandem::ValueFlag("service", "NAME", "", "The service asked about (empty: the process)"),
       tandem::ValueFlag("timeout-ms", "MS", "2000", "The call's deadline"),
       tandem::ValueFlag("tls-ca", "PEM", "", "TLS, trusting this CA"),
       tandem::ValueFlag("tls-cert", "PEM", "", "Client certificate (mutual TLS)"),
       tandem::ValueFlag("tls-key", "PEM", "", "Key of --tls-cert")}};
  auto f = tandem::Flags::Parse(args, command);
  if (!f.ok()) {
    std::fprintf(stderr, "tandem-health: %s\n", std::string(f.status().message()).c_str());
    return 2;
  }
  if (f->help_requested()) {
    std::fputs(f->help().c_str(), stdout);
    return 0;
  }
  const std::string address = f->Get("address");
  auto timeout_ms = f->GetInt("timeout-ms");
  if (!timeout_ms.ok() || *timeout_ms <= 0) {
    std::fprintf(stderr, "tandem-health: --timeout-ms must be a positive integer\n");
    return 2;
  }
  auto credentials =
      tandem::ClientChannelCredentials({f->Get("tls-cert"), f->Get("tls-key"), f->Get("tls-ca")});
  if (!credentials.ok()) {
    std::fprintf(stderr, "tandem-health: %s\n",
                 std::string(credentials.status().message()).c_str());
    return 2;
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, *credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(*timeout_ms));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(f->Get("service"));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status s = stub->Check(&ctx, request, &response);
  if (!s.ok()) {
    std::fprintf(stderr, "tandem-health: %s: %s\n", address.c_str(), s.error_message().c_str());
    return 1;
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    std::fprintf(
        stderr, "tandem-health: %s: %s (not SERVING)\n", address.c_str(),
        grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
    return 1;
  }
  std::puts("SERVING");
  return 0;
}
