// tandem-health: a grpc.health.v1 client for container health checks (Docker HEALTHCHECK, or
// anywhere a Kubernetes native grpc probe is not available).
//   tandem-health [--address 127.0.0.1:7000] [--service NAME] [--timeout-ms 2000]
// Exit 0 when the server answers SERVING, 1 when it answers anything else or cannot be reached,
// 2 for bad flags. The messages are tiny, so they are encoded by hand over the generic stub:
// HealthCheckRequest {string service = 1}, HealthCheckResponse {ServingStatus status = 1}.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include "tools/flags.h"

namespace {

constexpr int kServing = 1;  // grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING

std::string EncodeRequest(const std::string& service) {
  if (service.empty()) return "";
  std::string out = "\x0a";  // field 1, length-delimited
  for (size_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out.push_back(static_cast<char>(n));
      break;
    }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  return out + service;
}

// The status field of a HealthCheckResponse; -1 when malformed. An absent field is 0 (UNKNOWN).
int DecodeStatus(const std::string& bytes) {
  size_t i = 0;
  int status = 0;
  while (i < bytes.size()) {
    const uint8_t tag = static_cast<uint8_t>(bytes[i++]);
    if ((tag & 7) != 0) return -1;  // only varints are expected
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (i >= bytes.size() || shift > 63) return -1;
      const uint8_t b = static_cast<uint8_t>(bytes[i++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) break;
    }
    if (tag >> 3 == 1) status = static_cast<int>(v);
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto f = tandem::Flags::Parse(args, {"address", "service", "timeout-ms"}, {});
  if (!f.ok()) {
    std::fprintf(stderr, "tandem-health: %s\n", std::string(f.status().message()).c_str());
    return 2;
  }
  const std::string address = f->Get("address", "127.0.0.1:7000");
  auto timeout_ms = f->GetInt("timeout-ms", 2000);
  if (!timeout_ms.ok() || *timeout_ms <= 0) {
    std::fprintf(stderr, "tandem-health: --timeout-ms must be a positive integer\n");
    return 2;
  }
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(*timeout_ms));
  const std::string request_bytes = EncodeRequest(f->Get("service", ""));
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status s = done.get_future().get();
  if (!s.ok()) {
    std::fprintf(stderr, "tandem-health: %s: %s\n", address.c_str(), s.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& sl : slices) {
      bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
  }
  const int status = DecodeStatus(bytes);
  if (status != kServing) {
    std::fprintf(stderr, "tandem-health: %s: status %d (not SERVING)\n", address.c_str(), status);
    return 1;
  }
  std::puts("SERVING");
  return 0;
}
