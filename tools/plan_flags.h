// The flags of `tandem plan`'s modes, each declared once with its default and help
// (tools/flags.h); a default a planner struct holds is read from that struct.
#ifndef TANDEM_TOOLS_PLAN_FLAGS_H_
#define TANDEM_TOOLS_PLAN_FLAGS_H_

#include <vector>

#include "tools/flags.h"

namespace tandem {

// `tandem plan help`, and `tandem plan` alone: the modes.
extern const char kPlanUsage[];

// Runs of a noisy profile `plan simulate` averages by default: the mean of a closed loop's TTFT
// p50 (whose runs differ by 2x) settles to within about 10%.
inline constexpr int kNoisyRuns = 16;

// The simulated workers' flags (and --model, --hardware, --json): every plan mode's.
std::vector<FlagSpec> WorkerFlags();

Flags::Command PlanSearchCommand();  // tandem plan
Flags::Command SimulateCommand();    // tandem plan simulate
Flags::Command CalibrateCommand();   // tandem plan calibrate

}  // namespace tandem

#endif  // TANDEM_TOOLS_PLAN_FLAGS_H_
