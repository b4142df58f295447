// A deterministic discrete-event simulator of a Tandem cluster. Requests arrive from the same
// generators `tandem bench` uses (planner/workload.h); the router's WorkerRegistry picks the
// workers (heartbeats refresh its view of their load, as in the real router); every prefill
// worker drives a real PrefillScheduler and BlockPool (prefix cache included), every decode
// worker a real DecodeScheduler; the cost model times each step and each KV transfer. Workers
// that share a device (all of them on a `shared_host` profile such as the local CPU, or the
// two loops of a colocated instance) progress by processor sharing.
//
// Output: the per-request records `tandem bench` writes, so a simulated run is summarized and
// printed exactly as a measured one.
#ifndef TANDEM_PLANNER_SIMULATOR_H_
#define TANDEM_PLANNER_SIMULATOR_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/scheduling/scheduler.h"
#include "planner/cost_model.h"
#include "planner/workload.h"

namespace tandem::planner {

struct ClusterSpec {
  int prefill = 1;  // workers (or, colocated, instances)
  int decode = 1;
  int prefill_tp = 1;  // devices per worker
  int decode_tp = 1;
  // `prefill` instances, each a prefill and a decode loop on one device group (the
  // `--role=all` process, which serves a request end to end with an in-process KV copy);
  // `decode` and decode_tp are ignored.
  bool colocated = false;
  // The worker options, defaults as tandem-server's.
  int block_size = 16;
  PrefillScheduler::Options prefill_scheduler;
  int max_running = 256;
  // The decode workers' on-demand blocks (engine/scheduling/scheduler.h): the watermark admission
  // keeps free, and the tokens of preempted sequences recomputed per step.
  double decode_watermark = 0.01;
  int recompute_budget = 512;
  bool prefix_cache = true;
  // KV cache bytes per worker in the profile's kv dtype; 0: what the devices hold after the
  // weights (a shared-host profile: tandem-server's defaults, 1 GiB prefill and 2 GiB decode).
  double prefill_kv_bytes = 0;
  double decode_kv_bytes = 0;
  std::optional<Link> link;         // default: the profile's
  double heartbeat_interval = 0.5;  // seconds, as tandem-server's --heartbeat-ms
  int decode_attempts = 3;          // as the router's
  int max_queued = 256;             // requests waiting for decode room, as the router's
  // Speculative decoding on the decode workers (tandem-server --speculative): each decoding
  // sequence scores up to spec_tokens proposals per step (blocks for them only when free, as the
  // worker does), and each proposal is kept with probability spec_acceptance while the ones
  // before it were (the tokens/s figure of a workload: 1 + a + a^2 + ... + a^K per verify step).
  // 0 tokens: off.
  int spec_tokens = 0;
  double spec_acceptance = 0;

  absl::Status Validate() const;
  int gpus() const {
    return colocated ? prefill * prefill_tp : prefill * prefill_tp + decode * decode_tp;
  }
};

// One step of one worker, for tests and traces.
struct StepTrace {
  int worker = 0;  // prefill workers first, then decode workers
  bool prefill = true;
  double start = 0, end = 0;
  std::vector<PrefillScheduler::Work> work;   // prefill
  std::vector<uint64_t> batch;                // decode: request ids in batch order
  std::vector<DecodeScheduler::Work> decode;  // decode: what each of them computed
  std::vector<uint64_t> preempted;            // decode: preempted while planning the step
};

struct SimOptions {
  bool zero_cost = false;     // every step, transfer and overhead takes no time
  bool record_steps = false;  // fill SimResult::steps
  // Keep every token's time in the records (the inter-token latency); off saves memory and
  // time when only TTFT, TPOT and goodput matter (the plan search).
  bool record_token_times = true;
  int64_t max_events = int64_t{1} << 30;
  // The noise (jitter of the steps and the request path): 0 draws it from the workload's seed;
  // else from this, the requests (lengths, prompts, arrivals) staying the workload's.
  uint64_t noise_seed = 0;
};

struct SimResult {
  std::vector<bench::RequestRecord> records;  // as `tandem bench` records them
  bench::BenchSummary summary;
  std::vector<StepTrace> steps;
  int64_t events = 0;
  int64_t prefill_steps = 0, decode_steps = 0;
  int64_t preemptions = 0;  // decode sequences preempted (their KV recomputed later)
  double mean_decode_batch = 0;
  // Seconds the steps took, summed, and what they would have taken alone on their device: the
  // ratio is how much the work sharing a host slowed them (1 on a GPU profile).
  double prefill_step_seconds = 0, prefill_step_alone_seconds = 0;
  double decode_step_seconds = 0, decode_step_alone_seconds = 0;
};

// A request with its send time (seconds since the start), for SimulateRequests.
struct TimedRequest {
  double send = 0;
  std::vector<int> prompt;
  int output_tokens = 1;
};

// Simulates `workload` (open or closed loop, warm-up, duration, SLOs: every field `tandem bench`
// uses except the router) on `cluster`. Request ids in schedulers are record index + 1.
absl::StatusOr<SimResult> Simulate(const ModelConfig& model, const HardwareProfile& profile,
                                   const ClusterSpec& cluster, const bench::BenchConfig& workload,
                                   const SimOptions& options = {});

// The workload `runs` times, each with its own noise (noise_seed 1..runs; the same requests).
// On a profile with jitter (a calibrated `local` one) the figures of one run are one draw, as a
// measured run's are: a closed loop's clients may fall into step in one run and not the next,
// moving TTFT p50 by 2x. What repeated `tandem bench` runs average to is the runs' mean
// (MeanSummary).
absl::StatusOr<std::vector<SimResult>> SimulateRuns(const ModelConfig& model,
                                                    const HardwareProfile& profile,
                                                    const ClusterSpec& cluster,
                                                    const bench::BenchConfig& workload, int runs,
                                                    const SimOptions& options = {});

// The mean over runs of every figure of their summaries (counts and percentiles alike).
bench::BenchSummary MeanSummary(const std::vector<SimResult>& runs);

// Whether the profile draws noise (any jitter): if not, every run of a workload is the same.
bool HasNoise(const HardwareProfile& profile);

// Simulates requests sent at given times (open loop), measured from the first.
absl::StatusOr<SimResult> SimulateRequests(const ModelConfig& model, const HardwareProfile& profile,
                                           const ClusterSpec& cluster,
                                           std::vector<TimedRequest> requests,
                                           const bench::Slo& slo, const SimOptions& options = {});

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_SIMULATOR_H_
