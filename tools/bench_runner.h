// `tandem bench`: drives a router with a seeded workload over gRPC and measures every request.
#ifndef TANDEM_TOOLS_BENCH_RUNNER_H_
#define TANDEM_TOOLS_BENCH_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "rpc/tls.h"
#include "tools/loadgen.h"

namespace tandem::bench {

struct BenchRun {
  BenchConfig config;
  std::vector<RequestRecord> records;
  BenchSummary summary;
  nlohmann::json ToJson() const;  // config, summary and per-request records
};

absl::StatusOr<BenchRun> RunBench(const BenchConfig& config);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_RUNNER_H_
