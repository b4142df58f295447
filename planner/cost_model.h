// The cost of one forward step from first principles: the FLOPs and bytes a batch moves (weights,
// KV cache reads and writes, activations) for a model shape, turned into seconds by a hardware
// profile (peak matmul FLOP/s, memory bandwidth, efficiency factors, per-step overhead), plus
// tensor-parallel all-reduces and the time to ship KV over a link with the layer overlap.
//
// The roofline: a step takes overhead + max(compute, memory) on hardware that overlaps the two
// (GPUs) or overhead + compute + memory where they mostly serialize (the `local` CPU profile,
// whose factors are fitted by `tandem plan calibrate`).
#ifndef TANDEM_PLANNER_COST_MODEL_H_
#define TANDEM_PLANNER_COST_MODEL_H_

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "nlohmann/json.hpp"

namespace tandem::planner {

// A network path for the prefill-to-decode KV transfer.
struct Link {
  std::string name;      // "nvlink", "infiniband", "roce", "tcp", "loopback"
  double bandwidth = 0;  // bytes/s, one direction
  double latency = 0;    // seconds per message (one chunk: one layer of one step)
};

struct HardwareProfile {
  std::string name;
  // Where the figures come from ("" for the datasheet profiles): a measured profile names the
  // device, date, commit and the run it was fitted to.
  std::string provenance;
  double peak_flops = 0;         // dense matmul FLOP/s per device at the compute dtype
  double mem_bandwidth = 0;      // bytes/s per device
  double mem_capacity = 0;       // bytes per device
  double mem_utilization = 0.9;  // fraction of mem_capacity for weights + KV cache
  // Achieved fractions of the peaks. matmul: the projections and MLP; attention: the
  // score/value products (smaller, irregular); bandwidth: streaming weights and KV.
  double matmul_efficiency = 1;
  double attention_efficiency = 1;
  double bandwidth_efficiency = 1;
  double step_overhead = 0;  // seconds per forward step (launches, scheduling, sampling)
  bool overlap = true;       // compute and memory overlap: max() rather than sum
  double weight_bytes = 2;   // per parameter
  double kv_bytes = 2;       // per cached K or V element
  double act_bytes = 2;      // per activation element
  // Tensor parallelism: all-reduce bandwidth per device (0: no TP) and latency per all-reduce.
  int max_tp = 1;
  double tp_bandwidth = 0;
  double tp_latency = 0;
  Link kv_link;                 // default link between prefill and decode workers
  bool shared_host = false;     // every worker shares one device (a CPU): processor sharing
  double request_overhead = 0;  // seconds of RPC on the way to the first token
  double token_overhead = 0;    // seconds from a decode step's end to the client
  // shared_host only: CPU seconds the router and the decode service spend relaying one token
  // (gRPC writes, detokenization), work that competes with the workers for the host.
  double relay_cpu = 0;
  // Seconds per token a decode step spends after its forward pass on the decode worker's own
  // thread: sampling on the host (a pass or a sort over the vocabulary), the stop checks, handing
  // the token to its stream. Serial with the steps, on one core. 0 where the device samples (the
  // GPU profiles: it is in the step).
  double sample_cpu = 0;
  // Seconds from the first token leaving the prefill worker to the decode worker starting the
  // request (the router's start message and the decode loop's wake-up).
  double decode_start_overhead = 0;
  // Latency noise of the request path: each request's RPC hops take an extra exponentially
  // distributed delay of this mean (seconds), and its decode start another of
  // `decode_start_jitter`. On a shared host, scheduling delays of a few hundred microseconds to
  // milliseconds are the spread between p50 and p90 at low load. 0 on the GPU profiles.
  double request_jitter = 0;
  double decode_start_jitter = 0;
  // The spread of step times (a shared host's scheduling noise): each step takes its cost
  // times a mean-one lognormal factor with this sigma. 0 on the GPU profiles.
  double step_jitter = 0;
  // The prefill steps' own sigma when it differs (negative: step_jitter). A long prefill on a
  // shared host is interrupted by whatever else wakes up: its spread is its own.
  double prefill_step_jitter = -1;
  // Decode steps' own efficiencies and overhead when they differ from the profile's (the
  // `local` profile measures them in situ, inside a running cluster where the decode loop
  // shares the host with the token relay); `has_decode_factors` false: the same as prefill.
  struct StepFactors {
    double matmul_efficiency = 1;
    double attention_efficiency = 1;
    double bandwidth_efficiency = 1;
    double step_overhead = 0;
  };
  bool has_decode_factors = false;
  StepFactors decode_factors;
  // The same for prefill steps (else the profile's own factors).
  bool has_prefill_factors = false;
  StepFactors prefill_factors;
  // shared_host only: how many workers' steps run together at their calibrated speed before
  // they share the host (processor sharing). 1 for a profile fitted on steps run alone; the
  // in-situ calibration measures one prefill and one decode worker busy together: 2.
  double host_step_slots = 1;
  // shared_host only: the host's cores. 0: the two-lane model above (steps in
  // `host_step_slots`, the request path's CPU work one at a time beside them). Above 0: one
  // processor for everything, as the machine is: each step keeps `step_threads` cores busy
  // (the CPU backend's pool: one thread per core), each hop and each relay task one, and when
  // they ask for more than `host_cores` all of them slow down in proportion (the kernel's fair
  // share per thread). Steps are then timed at their speed alone.
  double host_cores = 0;
  double step_threads = 1;
  // host_cores > 0 only: the cores a prefill step keeps busy, served before everything else
  // (measured in situ, the prefill steps under load took as long as alone while the decode
  // steps beside them slowed by half); 0: a prefill step is a step like the others.
  double prefill_threads = 0;
  // prefill_threads > 0 only: how far a prefill step served first gives way to the other work
  // when the host is oversubscribed, 0 (not at all) to 1 (an equal share per core asked, as if
  // it were not served first). In situ on 2 cores, the prefill steps of four clients took
  // 1.25-1.3 times as long per token as alone: served first they took 1.05.
  double prefill_yield = 0;
  // This profile with the decode (prefill) factors in place of the step factors.
  HardwareProfile ForDecode() const;
  HardwareProfile ForPrefill() const;

  absl::Status Validate() const;
  nlohmann::json ToJson() const;
  static absl::StatusOr<HardwareProfile> FromJson(const nlohmann::json& j);
  double ridge() const { return peak_flops / mem_bandwidth; }  // FLOP per byte
};

// The built-in profiles: h200, measured (fitted to a device run, its provenance set), then the
// datasheet ones h100-sxm, h200-datasheet, a100-80gb, l40s.
std::vector<std::string> BuiltinProfileNames();
// A built-in name, "local" (the file written by `tandem plan calibrate`, LocalProfilePath()), or
// a path to a profile JSON file.
absl::StatusOr<HardwareProfile> LoadProfile(const std::string& name_or_path);
// $TANDEM_LOCAL_PROFILE, else $HOME/.cache/tandem/local_profile.json.
std::string LocalProfilePath();
// nvlink, infiniband, roce, tcp, loopback; or NAME:GBPS[:LATENCY_US] for a custom link.
absl::StatusOr<Link> ParseLink(const std::string& spec);

// The new tokens of one sequence in a step: `tokens` after `context` cached positions, with
// logits for the last `logit_rows` of them (1: the next token; a speculative verify step scores
// every one of its 1 + K tokens).
struct ChunkShape {
  int context = 0;
  int tokens = 1;
  int logit_rows = 1;
};

// What one step moves and how long it takes, per device.
struct StepCost {
  double matmul_flops = 0;     // projections, MLP, classifier
  double attention_flops = 0;  // q·Kᵀ and p·V
  double weight_bytes = 0;
  double kv_read_bytes = 0;
  double kv_write_bytes = 0;
  double activation_bytes = 0;
  double compute_seconds = 0;
  double memory_seconds = 0;
  double comm_seconds = 0;  // tensor-parallel all-reduces
  double seconds = 0;       // the step

  double bytes() const { return weight_bytes + kv_read_bytes + kv_write_bytes + activation_bytes; }
  double flops() const { return matmul_flops + attention_flops; }
};

class CostModel {
 public:
  // `tp` devices share each worker's weights and KV (Megatron-style: heads and the MLP split).
  CostModel(ModelConfig config, HardwareProfile profile, int tp = 1);

  const ModelConfig& config() const { return config_; }
  const HardwareProfile& profile() const { return profile_; }
  int tp() const { return tp_; }

  // Every matrix parameter the devices hold: the layers' matrices (every expert of a mixture)
  // and the classifier.
  double MatrixParams() const;
  // K and V of one token over every layer, the whole model (not per device).
  double KvBytesPerToken() const;
  double WeightBytesPerDevice() const { return MatrixParams() * profile_.weight_bytes / tp_; }
  // Bytes of KV the worker's devices can hold together after the weights (<= 0: does not fit).
  double KvCapacityBytes() const;

  StepCost Step(std::span<const ChunkShape> batch) const;

  // When the last of `tokens` tokens' KV arrives over `link`, for a step that starts at
  // `step_start` and computes for `compute_seconds`: layer l's KV is final after (l + 1) / L of
  // the compute and is sent then, one message per layer, in order, on a link busy until
  // `*link_free` (updated).
  double TransferDone(double step_start, double compute_seconds, int tokens, const Link& link,
                      double* link_free) const;

 private:
  ModelConfig config_;
  HardwareProfile profile_;
  int tp_;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_COST_MODEL_H_
