// The decode worker's engine, without RPC: admission by free KV blocks, the KV sink that
// receives a request's prompt KV from a prefill worker under a lease, and the step loop that
// decodes every running request in one batch per step (continuous batching).
//
// One state machine per request (DecodeEngine::RequestState): ADMITTED (lease open, KV
// arriving) -> RUNNING <-> PREEMPTED (blocks freed, recomputed when room comes back, which its
// reader never sees) -> FINISHED | FAILED | CANCELLED. Until it ends, where it is belongs to the
// decode scheduler (DecodeScheduler::state); the engine records only how it ended and buffers
// its output. Ending releases the blocks exactly once.
#ifndef TANDEM_DECODE_NODE_DECODE_ENGINE_H_
#define TANDEM_DECODE_NODE_DECODE_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampling/output_constraint.h"
#include "engine/scheduling/scheduler.h"
#include "engine/speculative/proposer.h"
#include "engine/step_loop_health.h"
#include "kv_transfer/kv_transfer.h"
#include "kv_transfer/lease_table.h"
#include "metrics/metrics.h"

namespace tandem {

struct DecodeEngineOptions {
  int num_blocks = 0;  // 0: as many as fit in max_kv_bytes
  int block_size = 16;
  int max_running = 256;
  // Blocks are taken as tokens arrive: admission leaves this fraction of the cache free for
  // running sequences to grow into; when it runs out, the newest sequences are preempted and
  // later recomputed here, at most `recompute_budget` tokens per step
  // (engine/scheduling/scheduler.h).
  double watermark = 0.01;
  int recompute_budget = 512;
  // kReserve: the blocks a request may hold up to prompt + max_tokens set aside at admission,
  // never preempted.
  DecodeScheduler::Admission admission = DecodeScheduler::Admission::kOnDemand;
  DType kv_dtype = DType::kF32;  // the KV cache, as stored and as received
  int64_t max_kv_bytes = int64_t{2} << 30;
  absl::Duration lease_timeout = absl::Seconds(60);  // admission to the KV being complete
  // "cpu": the model's CPU forward pass over a host KV cache; "cuda": the device model
  // (engine/model_runner.h), max_running sequences per step.
  std::string device = "cpu";
  std::string transport = "tcp";       // the KV receiver's kind
  std::string listen = "127.0.0.1:0";  // tcp: host:port; local: a name
  KvReceiverOptions receiver;          // tcp: its credentials (required) and limits
  // tcp: the host put in KV targets, reachable by prefill workers on other hosts (empty: the
  // listening host; needed when `listen` is a wildcard such as 0.0.0.0).
  std::string advertise_host;
  // When set, makes the receiver instead of MakeKvReceiver(transport, listen): the nccl
  // transport (kv_transfer/nccl/nccl_transport.h), whose endpoint is set later (SetKvEndpoint).
  std::function<absl::StatusOr<std::unique_ptr<KvReceiver>>(KvSink*)> make_receiver;
  // Compiles requests' json_schema for the model's vocabulary
  // (engine/sampling/output_constraint.h); without it a request asking for structured output is
  // refused.
  std::shared_ptr<OutputConstraints> constraints;
  // How long Start waits for a lease's last chunks to be delivered. Transports without an ACK
  // (nccl) finish the prefill's send once the bytes arrived, a moment before they are unpacked.
  absl::Duration kv_settle_timeout = absl::ZeroDuration();
  FaultSpec faults;  // step faults (tests)
  // Tests: the CPU runner samples in ForwardSample (the host twin of a device that samples), so
  // the sample-on-device paths of the step loop run without a GPU.
  bool cpu_samples_rows = false;
  // Speculative decoding (engine/speculative/proposer.h): each running sequence that has not
  // opted out proposes up to speculative.num_tokens tokens, scored in the same batched step as
  // the others' plain decode steps. The output is the same with and without it. Off by default.
  SpeculativeConfig speculative;

  absl::Status Validate() const;
  // What each part of the engine is given of these options (num_blocks already resolved): the
  // model runner (a step holds a token per running sequence and its proposals, each with a
  // logit row, plus the recompute of preempted ones), the draft model's runner, the scheduler.
  ModelRunnerOptions Runner() const;
  DraftRunnerOptions Draft() const;
  DecodeScheduler::Options Scheduler(const std::vector<int>& group_window) const;
};

// What speculative decoding did on a decode worker so far.
struct SpeculationStats {
  int64_t verify_steps = 0;     // a sequence's step that scored proposals
  int64_t proposed_tokens = 0;  // proposals scored
  int64_t accepted_tokens = 0;  // ... and kept
};

class DecodeEngine final : public KvSink {
 public:
  // `metrics` (nullptr: none) must outlive the engine.
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(const Model* model,
                                                              DecodeEngineOptions options,
                                                              DecodeMetrics* metrics = nullptr);
  ~DecodeEngine() override;

  struct Admission {
    uint64_t handle;
    KvTarget target;
  };
  // Validates `request` (INVALID_ARGUMENT naming the field), reserves the prompt's blocks
  // (RESOURCE_EXHAUSTED when admitting would eat into the watermark, or when the request could
  // not fit even in an empty cache) and opens a lease for the prompt KV.
  absl::StatusOr<Admission> Admit(GenerationRequest request);

  // Joins the running batch with the first token (sampled by the prefill worker). The lease's
  // KV must be complete (FAILED_PRECONDITION otherwise).
  absl::Status Start(uint64_t handle, int first_token);

  struct Output {
    std::vector<int> tokens;
    std::vector<TokenLogprobs> logprobs;  // one per token, with sampling.logprobs
    std::optional<FinishReason> finish;
    absl::Status error;  // set when the request failed (lease expired, forward error)
  };
  // Waits up to `timeout` for new tokens or the end of the request.
  Output Next(uint64_t handle, absl::Duration timeout);
  // Calls `ready` whenever the request gains output or ends (and soon when it has some already),
  // from the engine's notifier thread with no engine lock held: `ready` may take it with
  // Next(handle, ZeroDuration()), and must not block. Replaces an earlier one. False when the
  // request is unknown (never admitted, or its end was read).
  bool Watch(uint64_t handle, std::function<void()> ready);

  // Ends the request (client cancel or deadline) and frees its blocks. Idempotent.
  void Cancel(uint64_t handle);

  enum class RequestState { kAdmitted, kRunning, kPreempted, kFinished, kFailed, kCancelled };
  // The request's state; nullopt when unknown (never admitted, or ended and its end read).
  std::optional<RequestState> state(uint64_t handle) const;

  // KvSink: the lease (id, generation, capability), the token range and the cache's width and
  // dtype, before the payload is read.
  absl::Status CheckHeader(const KvChunkHeader& h) override;
  // KvSink: validates the lease and scatters the chunk into the request's blocks.
  absl::Status Accept(const KvChunkHeader& h, std::span<const char> payload) override;
  // KvSink: fails the request of a lease still waiting for its KV.
  void Undeliverable(const KvChunkHeader& h, const absl::Status& why) override;

  // Progress and drain, for health: BeginDrain() makes Admit UNAVAILABLE from then on while
  // admitted work finishes.
  StepLoopHealth& health() { return health_; }

  WorkerLoadSnapshot Load() const;
  std::string kv_endpoint() const;
  // Replaces the endpoint put in KV targets (the nccl receiver's, once the worker's gRPC port is
  // known). Admit is UNAVAILABLE while it is empty.
  void SetKvEndpoint(std::string endpoint);
  // The leak check: no request, lease or block in use.
  bool Idle() const;
  int64_t steps() const;
  const KvCacheSpec& kv_spec() const { return kv_spec_; }
  // Sequences preempted so far (their blocks freed, recomputed when room came back).
  int64_t preemptions() const;
  SpeculationStats speculation() const;
  const Model& model() const { return *model_; }

 private:
  struct Request {
    GenerationRequest req;
    std::vector<int> tokens;  // prompt + generated
    int generated = 0;
    uint64_t lease_id = 0;
    // How it ended (kFinished, kFailed or kCancelled); before that, scheduler_ has its state.
    std::optional<RequestState> end;
    bool cancel_requested = false;  // a started request leaves between steps
    std::deque<int> out;
    std::deque<TokenLogprobs> out_logprobs;
    std::optional<FinishReason> finish;
    absl::Status error;
    // A step scoring proposals: its input, the last token then the proposals.
    std::vector<int> step_input;
    std::function<void()> on_output;  // Watch
    bool notify_queued = false;       // in notify_
  };

  DecodeEngine(const Model* model, DecodeEngineOptions options, std::unique_ptr<ModelRunner> runner,
               DecodeMetrics* metrics);
  void Loop();
  // The loop's phases, under mu_ (`lock`, which the long parts release). Leases whose KV never
  // completed fail their requests; running requests cancelled leave.
  void ExpireLeasesLocked();
  void EndCancelledLocked();
  // Asks the proposer (unlocked) for the plain decode works of `step` whose requests speculate,
  // and widens those works by the proposals the scheduler grants blocks for.
  void SpeculateLocked(DecodeScheduler::Step* step, std::unique_lock<std::mutex>& lock);
  // Runs the step's forward pass (unlocked), then samples, verifies and emits its tokens.
  void RunStepLocked(const DecodeScheduler::Step& step, std::unique_lock<std::mutex>& lock);
  // Appends `token` (drawn from `row`, empty when sampled on the device) to a running request;
  // ends the request when it finishes there. Returns whether it did.
  bool EmitLocked(uint64_t handle, Request& r, std::span<const float> row, int token);
  // Queues the request's Watch callback for the notifier (once until it runs).
  void NotifyLocked(uint64_t handle, Request& r);
  // Wakes Next's waiters and the notifier.
  void WakeReadersLocked();
  // The notifier thread: runs the queued Watch callbacks, unlocked.
  void Notifier();
  // Ends `r` as `how` (under mu_): releases its lease and blocks (it leaves scheduler_, so an
  // ended request has no scheduler state), wakes its reader. A request that has ended stays so.
  void EndLocked(uint64_t handle, Request& r, RequestState how);
  // Whether the request is in the scheduler's running batch or waits preempted (under mu_).
  bool StartedLocked(uint64_t handle) const;
  // Sets the gauges from the scheduler and the lease table (under mu_).
  void UpdateGaugesLocked();
  // CheckHeader under mu_: the lease's blocks.
  absl::StatusOr<std::span<const int>> CheckHeaderLocked(const KvChunkHeader& h);

  const Model* model_;
  DecodeEngineOptions options_;
  DecodeMetrics* metrics_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Proposer> proposer_;  // nullptr: no speculation
  const KvCacheSpec kv_spec_;
  std::unique_ptr<KvReceiver> receiver_;
  std::string kv_endpoint_;  // receiver_'s endpoint, with advertise_host when set (under mu_)

  mutable std::mutex mu_;
  std::condition_variable work_cv_;    // the loop waits for running requests
  std::condition_variable output_cv_;  // readers wait for tokens
  std::condition_variable kv_cv_;      // Start waits for a lease to complete
  DecodeScheduler scheduler_;
  LeaseTable leases_;
  // node_hash_map: the step loop keeps Request pointers across the unlocked forward pass while
  // Admit inserts; a flat map would move them on rehash.
  absl::node_hash_map<uint64_t, Request> requests_;
  absl::flat_hash_map<uint64_t, uint64_t> lease_to_handle_;
  uint64_t next_handle_ = 1;
  int64_t steps_ = 0;
  SpeculationStats speculation_;
  // The step loop's buffers, reused across steps (only the loop touches them).
  std::vector<float> logits_;
  std::vector<int> sampled_;
  bool stop_ = false;
  StepLoopHealth health_;
  std::thread loop_;
  std::vector<uint64_t> notify_;  // requests whose Watch callback is due (under mu_)
  std::condition_variable notify_cv_;
  std::thread notifier_;
};

}  // namespace tandem

#endif  // TANDEM_DECODE_NODE_DECODE_ENGINE_H_
