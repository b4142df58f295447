// `tandem bench`: drives a router with a seeded workload over gRPC and measures every request.
#ifndef TANDEM_TOOLS_BENCH_RUNNER_H_
#define TANDEM_TOOLS_BENCH_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "planner/workload.h"
#include "rpc/tls.h"

namespace tandem::bench {

struct BenchRun {
  BenchConfig config;
  std::vector<RequestRecord> records;
  BenchSummary summary;
  nlohmann::json ToJson() const;  // config, summary and per-request records
};

// `security`: TLS files and the API key (kept out of the config, which goes into the JSON).
absl::StatusOr<BenchRun> RunBench(const BenchConfig& config, const ClientSecurity& security = {});

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_RUNNER_H_
