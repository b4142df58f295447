// `tandem bench`: drives a router with a seeded workload over gRPC and measures every request.
#ifndef TANDEM_TOOLS_BENCH_RUNNER_H_
#define TANDEM_TOOLS_BENCH_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/tls.h"
#include "tools/loadgen.h"

namespace tandem::bench {

struct BenchConfig {
  std::string router;  // host:port
  // Open loop (rate > 0: arrivals at `rate` req/s) or closed loop (rate == 0: `concurrency`
  // requests in flight at all times).
  double rate = 0;
  ArrivalProcess::Kind arrival = ArrivalProcess::Kind::kPoisson;
  double burstiness = 1.0;
  int concurrency = 8;
  std::string input_len = "128";  // LengthDistribution specs
  std::string output_len = "128";
  std::string trace;       // JSONL; overrides the lengths
  int num_requests = 100;  // measured requests (after warm-up)
  double duration = 0;     // > 0: stop sending after this many seconds
  int warmup = 0;          // requests run (and discarded) before measuring
  uint64_t seed = 0;
  float temperature = 0;    // greedy by default; outputs run to their length
  double timeout = 600;     // per request, seconds
  int max_inflight = 1024;  // open loop: sends wait beyond this
  Slo slo;
  bool progress = true;     // live line on stderr
  ClientSecurity security;  // TLS files and the API key (not written to the JSON)

  absl::Status Validate() const;
  nlohmann::json ToJson() const;
};

struct BenchRun {
  BenchConfig config;
  std::vector<RequestRecord> records;
  BenchSummary summary;
  nlohmann::json ToJson() const;  // config, summary and per-request records
};

absl::StatusOr<BenchRun> RunBench(const BenchConfig& config);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_RUNNER_H_
