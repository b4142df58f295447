// `tandem plan calibrate --in-situ`: the `local` profile's decode steps and request-path
// overheads, measured inside a running 1P1D cluster of the model rather than in a tight loop.
//
// On a shared host the decode loop runs next to the token relay (the decode service's stream
// writes, the router, the client) and its steps take up to twice what the same forward pass
// takes alone, more as the context grows: the cache and the second core are no longer its
// own. So the calibration starts a router, a prefill and a decode worker of the model, runs
// workloads of known shapes (4 requests/s alone, short and long prompts; closed loops of 4 and
// 8, each run a few times: one run of a closed loop is one draw of how its clients fall into
// step), reads the decode worker's step-time and batch-size histograms from its /metrics, and
// fits the decode factors (HardwareProfile::decode_factors) to those steps. Then it fits the
// request path by simulating the same workloads: the request overhead (CPU work on the shared host,
// which queues under concurrency) and its jitter from TTFT, the decode start and its jitter
// from the gap between the first two tokens, and the relay's CPU per token from TPOT.
#ifndef TANDEM_TOOLS_CALIBRATE_IN_SITU_H_
#define TANDEM_TOOLS_CALIBRATE_IN_SITU_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  double host_cores = 0;      // the fit's host; 0: this machine's cores
  int closed_loop_draws = 1;  // times each closed loop is measured; the fit takes their mean
  // Fit on the given profile's sharing of the host (step_threads, prefill_threads,
  // prefill_yield) instead of searching the 23 sharings: a refit about 8 times cheaper, for
  // trying a change of the request path's fit on a machine whose sharing is already known.
  bool keep_sharing = false;
  std::function<void(const std::string&)> log;
};

// What the client saw of a run (seconds): TTFT and TPOT as `tandem bench` summarizes them, and
// the gap between the first two tokens.
struct ClientFigures {
  double ttft50 = 0, ttft90 = 0, tpot50 = 0, tpot90 = 0, gap50 = 0, gap90 = 0;
};

// One in-situ workload as the cluster ran it: its shape, the workers' mean steps (from their
// histograms) and the client's figures.
struct InSituRun {
  int concurrency = 1;  // 1: an open loop at 4 requests/s; else a closed loop of that many
  int input = 16, output = 32, requests = 16;
  int warmup = 2;  // the first requests, left out of the client's figures
  double decode_steps = 0, decode_step_s = 0, decode_batch = 0;
  double decode_loop_step_s = 0;  // a request's mean interval after its second token
  double prefill_step_s = 0, prefill_tokens_per_step = 0;
  ClientFigures measured;            // the mean of the draws' (merged: of the calibrations')
  std::vector<ClientFigures> draws;  // each run's own (empty in reports before draws)
};

// Starts a router, a prefill and a decode worker of the model and runs the calibration's
// workloads through them (about a minute).
absl::StatusOr<std::vector<InSituRun>> MeasureInSitu(const InSituOptions& options);

// Fits `profile` (the step fit of the forward pass) to the runs: the in-situ decode and prefill
// factors, the host's sharing and the request path. `report` gets each workload's measured and
// simulated figures, and what was fitted.
absl::Status FitInSitu(const InSituOptions& options, const std::vector<InSituRun>& runs,
                       planner::HardwareProfile* profile, nlohmann::json* report);

// The runs of a report FitInSitu wrote (its "workloads"): a calibration fitted again without
// measuring again (`tandem plan calibrate --refit REPORT`).
absl::StatusOr<std::vector<InSituRun>> InSituRunsFromReport(const nlohmann::json& in_situ);

// Several calibrations' runs of the same workloads as one: each workload's mean steps and mean
// figures (its draws all of theirs). On a host whose speed drifts between calibrations (other
// tenants), a profile fitted to calibrations made at different times predicts the typical speed
// rather than one moment's. Refuses runs whose workloads differ in shape, by index.
absl::StatusOr<std::vector<InSituRun>> MergeInSituRuns(
    const std::vector<std::vector<InSituRun>>& calibrations);

// How fast each calibration's steps ran against the others': per calibration, the geometric
// mean over its workloads and both roles of its mean step time over that workload's in
// `merged` (MergeInSituRuns of them: the calibrations' mean). 1: typical; 1.2: its steps took
// a fifth longer, the host slow while it measured.
std::vector<double> InSituStepTimeRatios(const std::vector<std::vector<InSituRun>>& calibrations,
                                         const std::vector<InSituRun>& merged);

// MeasureInSitu, then FitInSitu.
absl::Status CalibrateInSitu(const InSituOptions& options, planner::HardwareProfile* profile,
                             nlohmann::json* report);

}  // namespace tandem

#endif  // TANDEM_TOOLS_CALIBRATE_IN_SITU_H_
