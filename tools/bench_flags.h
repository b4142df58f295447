// The workload flags of `tandem bench`, shared by `tandem plan simulate` so that a simulated run
// and a measured one are described the same way.
#ifndef TANDEM_TOOLS_BENCH_FLAGS_H_
#define TANDEM_TOOLS_BENCH_FLAGS_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "planner/workload.h"
#include "tools/flags.h"

namespace tandem {

// --rate --arrival --burstiness --concurrency --input-len --output-len --trace --num-requests
// --duration --warmup --seed --temperature --timeout --max-inflight --slo-ttft --slo-tpot
const std::set<std::string>& BenchWorkloadFlags();

// The configuration those flags describe (every other field left at its default). Does not
// validate: BenchConfig::Validate does.
absl::StatusOr<bench::BenchConfig> BenchConfigFromFlags(const Flags& f);

}  // namespace tandem

#endif  // TANDEM_TOOLS_BENCH_FLAGS_H_
