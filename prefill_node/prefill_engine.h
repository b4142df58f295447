// The prefill worker's engine, without RPC: a prefill scheduler that batches prompts under a
// token budget and splits long ones into chunks, a prefix cache (full blocks of earlier prompts
// are reused, not recomputed), and the KV sender, which ships each layer's K/V to the decode
// worker's lease as soon as it is computed, overlapping the transfer with later layers.
#ifndef TANDEM_PREFILL_NODE_PREFILL_ENGINE_H_
#define TANDEM_PREFILL_NODE_PREFILL_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampling/output_constraint.h"
#include "engine/sampling/sampler.h"
#include "engine/scheduling/scheduler.h"
#include "engine/step_loop_health.h"
#include "kv_transfer/kv_transfer.h"
#include "metrics/metrics.h"

namespace tandem {

struct PrefillEngineOptions {
  int num_blocks = 0;  // 0: as many as fit in max_kv_bytes
  int block_size = 16;
  int64_t max_kv_bytes = int64_t{1} << 30;
  DType kv_dtype = DType::kF32;  // the KV cache, as computed and as shipped
  PrefillScheduler::Options scheduler;
  bool prefix_cache = true;
  FaultSpec faults;  // step faults (tests)
  // "cpu": the model's CPU forward pass over a host KV cache; "cuda": the device model
  // (engine/model_runner.h), capacities from num_blocks, block_size and the scheduler.
  std::string device = "cpu";
  // Compiles requests' json_schema for the model's vocabulary
  // (engine/sampling/output_constraint.h); without it a request asking for structured output is
  // refused.
  std::shared_ptr<OutputConstraints> constraints;

  absl::Status Validate() const;
  // The model runner's part of these options (num_blocks already resolved): a step holds the
  // scheduler's token budget over at most its batch of prompts.
  ModelRunnerOptions Runner() const;
};

struct PrefillResult {
  int first_token = 0;
  int cached_tokens = 0;
  double queue_seconds = 0;
  double compute_seconds = 0;
  double transfer_seconds = 0;  // after compute: waiting for the last acknowledgements
  std::optional<TokenLogprobs> first_logprobs;  // with sampling.logprobs
};

class PrefillEngine {
 public:
  // `sender` and `metrics` (nullptr: none) must outlive the engine.
  static absl::StatusOr<std::unique_ptr<PrefillEngine>> Create(const Model* model, KvSender* sender,
                                                               PrefillEngineOptions options,
                                                               PrefillMetrics* metrics = nullptr);
  ~PrefillEngine();

  // Computes `prompt`, ships its KV to `target`, samples the first token (at position
  // prompt.size(), with `sampling`) and returns once the decode worker acknowledged every
  // chunk. `cancelled` is polled: when it turns true the prefill is aborted (CANCELLED).
  // `output_tokens`: GenerationRequest::output_tokens (a resumed request's generated ids at the
  // end of the prompt). `deadline` bounds the whole call; `compute_timeout` only the time from
  // the prompt's first scheduled chunk to the last acknowledgement of its KV (waiting in the
  // queue behind other prompts is not a stall): past either, DEADLINE_EXCEEDED.
  absl::StatusOr<PrefillResult> Prefill(uint64_t request_id, std::vector<int> prompt,
                                        const SamplingParams& sampling, const KvTarget& target,
                                        absl::Time deadline,
                                        const std::function<bool()>& cancelled = nullptr,
                                        int output_tokens = 0,
                                        absl::Duration compute_timeout = absl::InfiniteDuration());

  // Log-probabilities of ids[1..], their ranks and each position's `top_n` most likely tokens:
  // the prompt runs as a prefill of its own through the engine's scheduler and runner (the
  // worker's device and KV dtype, batched with other prompts' chunks, in chunks itself) with
  // logits for every position, and ships no KV (with --device cuda, the model's host forward
  // pass in the worker's KV dtype). `cancelled` is polled as Prefill's; `deadline` bounds the
  // call (DEADLINE_EXCEEDED). INVALID_ARGUMENT as ValidateScore.
  absl::StatusOr<std::vector<ScoredToken>> Score(std::span<const int> ids, int top_n = 0,
                                                 absl::Time deadline = absl::InfiniteFuture(),
                                                 const std::function<bool()>& cancelled = nullptr);

  // Progress and drain, for health: BeginDrain() makes Prefill UNAVAILABLE from then on while
  // admitted work finishes.
  StepLoopHealth& health() { return health_; }

  WorkerLoadSnapshot Load() const;
  int64_t prefix_cache_queries() const { return prefix_queries_.load(); }
  int64_t prefix_cache_hits() const { return prefix_hits_.load(); }
  // The leak check: no job queued and no block referenced (cached blocks are free).
  bool Idle() const;
  const Model& model() const { return *model_; }

 private:
  struct Job {
    uint64_t id;
    std::vector<int> prompt;
    SamplingParams sampling;
    int output_tokens = 0;   // GenerationRequest::output_tokens
    int64_t uncomputed = 0;  // prompt tokens not computed yet (metrics: prompt_tokens_waiting)
    KvTarget target;
    std::vector<int> blocks;
    int cached = 0;
    bool cached_sent = false;
    absl::Time enqueued;
    absl::Time started;                            // first chunk scheduled; absl::Time() until then
    absl::Time first_send = absl::InfinitePast();  // first KV chunk queued (loop thread)
    // Set by the loop:
    bool done = false;
    absl::Status status;
    int first_token = -1;
    std::optional<TokenLogprobs> first_logprobs;
    double compute_seconds = 0;
    std::atomic<bool> cancelled{false};
    // Score: the top tokens per position (>= 0 marks a prompt scored, not shipped), and each
    // position's score, chunk by chunk.
    int score_top = -1;
    std::vector<ScoredToken> scored;
    bool scoring() const { return score_top >= 0; }
  };

  PrefillEngine(const Model* model, KvSender* sender, PrefillEngineOptions options,
                std::unique_ptr<ModelRunner> runner, PrefillMetrics* metrics);
  void Loop();
  // Sends layers [0, n_layers) of tokens [start, start + count) of `job` (under mu_).
  // Gives `job` the blocks of `prompt`: its prefix-cache hits, then fresh ones.
  // RESOURCE_EXHAUSTED, with nothing held, when the pool is short.
  absl::Status TakeBlocksLocked(Job& job, std::span<const int> prompt);
  absl::Status SendRange(Job& job, int layer, int start, int count);
  // Takes `job`'s blocks and prompt, queues it and waits for its compute (the deadline,
  // `cancelled` and `compute_timeout` as Prefill's): its status.
  absl::Status RunJob(const std::shared_ptr<Job>& job, std::vector<int> prompt, absl::Time deadline,
                      const std::function<bool()>& cancelled, absl::Duration compute_timeout);
  // A scored prompt's chunk `w` ran: the scores of its positions from their logits rows,
  // `first_row` on.
  void ScoreChunk(Job& job, const PrefillScheduler::Work& w, const std::vector<float>& logits,
                  size_t first_row);
  void FinishLocked(Job& job);

  const Model* model_;
  KvSender* sender_;
  PrefillEngineOptions options_;
  PrefillMetrics* metrics_;
  std::unique_ptr<ModelRunner> runner_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  PrefillScheduler scheduler_;
  KvCacheManager cache_;         // the runner's cache's layout (engine/kv/block_table.h)
  const KvCacheSpec send_spec_;  // what a decode worker of this model reads: KeepFrom
  absl::flat_hash_map<uint64_t, std::shared_ptr<Job>> jobs_;
  uint64_t next_job_ = 1;
  bool stop_ = false;
  StepLoopHealth health_;
  std::atomic<int64_t> prefix_queries_{0};
  std::atomic<int64_t> prefix_hits_{0};
  std::thread loop_;
};

}  // namespace tandem

#endif  // TANDEM_PREFILL_NODE_PREFILL_ENGINE_H_
