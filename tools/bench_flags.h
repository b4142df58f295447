// The workload flags of `tandem bench`, shared by `tandem plan simulate` so that a simulated run
// and a measured one are described the same way.
#ifndef TANDEM_TOOLS_BENCH_FLAGS_H_
#define TANDEM_TOOLS_BENCH_FLAGS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "planner/workload.h"
#include "tools/flags.h"

namespace tandem {

// --rate --arrival --burstiness --concurrency --input-len --output-len --max-tokens --trace
// --num-requests --duration --warmup --seed --temperature --timeout --max-inflight --slo-ttft
// --slo-tpot, each defaulting to bench::BenchConfig's field.
std::vector<FlagSpec> BenchWorkloadFlags();

// The configuration those flags describe: the fields of the flags given, every other at its
// default (a command may declare only some of the flags). Does not validate:
// BenchConfig::Validate does.
absl::StatusOr<bench::BenchConfig> BenchConfigFromFlags(const Flags& f);

}  // namespace tandem

#endif  // TANDEM_TOOLS_BENCH_FLAGS_H_
