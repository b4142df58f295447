// `tandem plan calibrate --in-situ`: the `local` profile's decode steps and request-path
// overheads, measured inside a running 1P1D cluster of the model rather than in a tight loop.
//
// On a shared host the decode loop runs next to the token relay (the decode service's stream
// writes, the router, the client) and its steps take up to twice what the same forward pass
// takes alone, more as the context grows: the cache and the second core are no longer its
// own. So the calibration starts a router, a prefill and a decode worker of the model, runs
// workloads of known shapes (4 requests/s alone, closed loops of 4 and 8; short and long
// contexts), reads
// the decode worker's step-time and batch-size histograms from its /metrics, and fits the
// decode factors (HardwareProfile::decode_factors) to those steps. Then it fits the request
// path by simulating the same workloads: the request overhead (CPU work on the shared host,
// which queues under concurrency) and its jitter from TTFT, the decode start and its jitter
// from the gap between the first two tokens, and the relay's CPU per token from TPOT.
#ifndef TANDEM_TOOLS_CALIBRATE_IN_SITU_H_
#define TANDEM_TOOLS_CALIBRATE_IN_SITU_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "engine/model_config.h"
#include "nlohmann/json.hpp"
#include "planner/cost_model.h"

namespace tandem {

struct InSituOptions {
  std::string model;      // path, as tandem-server's --model
  std::string tokenizer;  // empty: tandem-server finds one next to the model
  ModelConfig config;
  double weight_bytes = 4;    // per parameter, as the model is stored
  std::string server_binary;  // empty: tandem-server next to the running executable
  std::function<void(const std::string&)> log;
};

// Updates `profile` (the step fit of the forward pass) with the in-situ decode factors and the
// request-path overheads; `report` gets each workload's measured and predicted figures.
absl::Status CalibrateInSitu(const InSituOptions& options, planner::HardwareProfile* profile,
                             nlohmann::json* report);

}  // namespace tandem

#endif  // TANDEM_TOOLS_CALIBRATE_IN_SITU_H_
