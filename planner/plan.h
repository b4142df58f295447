// `tandem plan`: which deployment serves a workload within its SLOs at the least cost. For each
// layout (prefill and decode worker counts, their tensor-parallel degrees, or colocated
// instances) within a GPU budget, the simulator finds the highest request rate whose SLO
// attainment reaches the target; layouts are ranked by that rate per GPU (goodput per GPU).
#ifndef TANDEM_PLANNER_PLAN_H_
#define TANDEM_PLANNER_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "nlohmann/json.hpp"
#include "planner/cost_model.h"
#include "planner/simulator.h"
#include "planner/workload.h"

namespace tandem::planner {

// A model's shape from a named shape (the ones `tandem model random` knows, any case:
// llama-3-8b, llama-2-7b, tinyllama-1.1b, stories15m, ...), a Hugging Face config.json file, a
// model directory or a llama2.c checkpoint.
absl::StatusOr<ModelConfig> ResolveModel(const std::string& spec);

// A workload for the planner: "in=SPEC,out=SPEC[,arrival=poisson|constant|gamma][,burstiness=B]"
// with SPEC as `tandem bench --input-len` takes (N, uniform:LO:HI, lognormal:MEDIAN:SIGMA,
// optionally :max=M). Only the lengths and the arrival process are read; the rate is searched.
absl::Status ParseWorkloadSpec(const std::string& spec, bench::BenchConfig* config);

struct PlanOptions {
  int gpus = 8;             // budget: prefill + decode devices
  double attainment = 0.9;  // fraction of requests meeting both SLOs
  // Tensor-parallel degrees to try. Empty: 1 only, since no Tandem worker implements tensor
  // parallelism; degrees above 1 are modelled (cost_model.h) and reported as not runnable.
  std::vector<int> tp;
  bool colocated = true;  // also rank colocated instances, for comparison
  int top = 10;           // layouts printed
  double max_rate = 1e4;  // req/s: the search's ceiling
  int bisection_steps = 7;
  double min_seconds = 30;  // each simulation sends at least this long at the tried rate
  int threads = 0;          // layouts simulated at once (0: one per core)
};

struct PlanCandidate {
  ClusterSpec cluster;
  int gpus = 0;
  double max_rate = 0;          // req/s sustained at the attainment target
  double goodput_per_gpu = 0;   // max_rate / gpus
  bench::BenchSummary summary;  // the simulated run at max_rate
  int simulations = 0;
  std::string Describe() const;
  // Whether Tandem can run the layout: every worker on one device (no tensor parallelism).
  bool Runnable() const;
};

struct PlanResult {
  std::vector<PlanCandidate> ranked;  // best goodput per GPU first; layouts that hold no rate
                                      // at all are left out
  std::vector<std::string> skipped;   // layouts that cannot run (memory), with the reason
  int simulations = 0;
};

// `workload` supplies lengths, arrival kind, seed, num_requests and the SLOs; `base` the worker
// options (block size, scheduler limits).
absl::StatusOr<PlanResult> SearchPlans(const ModelConfig& model, const HardwareProfile& profile,
                                       const bench::BenchConfig& workload, const ClusterSpec& base,
                                       const PlanOptions& options);

std::string FormatPlanTable(const PlanResult& result, int top);
nlohmann::json PlanToJson(const PlanResult& result, int top);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_PLAN_H_
