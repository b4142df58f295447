// What the two halves of the in-place calibration share (tools/calibrate_in_situ.h):
// calibrate_in_situ.cc measures the workloads on a live cluster, calibrate_in_situ_fit.cc fits
// a hardware profile to them through the simulator.
#ifndef TANDEM_TOOLS_CALIBRATE_IN_SITU_INTERNAL_H_
#define TANDEM_TOOLS_CALIBRATE_IN_SITU_INTERNAL_H_

#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "planner/cost_model.h"
#include "tools/bench_runner.h"
#include "tools/calibrate_in_situ.h"

namespace tandem::in_situ_internal {

// What a run (measured or simulated) gives the fit.
struct Figures : ClientFigures {
  // Simulated only: the steps' time over their time alone.
  double decode_slowdown = 1, prefill_slowdown = 1;
  double decode_step = 0, prefill_step = 0;  // mean seconds, sharing included
};

// A run's figures as the report stores them.
nlohmann::json ToJson(const ClientFigures& f);

// The client's figures of a run's records (warm-up requests left out).
ClientFigures FiguresOf(const std::vector<bench::RequestRecord>& records);

// The `tandem bench` configuration of a workload against `router`.
bench::BenchConfig ConfigOf(const InSituRun& w, const std::string& router);

// A run's mean decode and prefill steps as the cost model's samples.
std::pair<planner::StepSample, planner::StepSample> SamplesOf(const InSituOptions& o,
                                                              const InSituRun& r);

}  // namespace tandem::in_situ_internal

#endif  // TANDEM_TOOLS_CALIBRATE_IN_SITU_INTERNAL_H_
