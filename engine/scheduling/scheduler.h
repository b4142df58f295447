// The schedulers of the two worker roles. Pure data structures: request ids in, decisions out;
// no threads, no I/O, no tensors. The prefill and decode workers drive them, and so does
// the capacity planner's simulator (planner/simulator.h).
#ifndef TANDEM_ENGINE_SCHEDULING_SCHEDULER_H_
#define TANDEM_ENGINE_SCHEDULING_SCHEDULER_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/block_table.h"
#include "engine/kv/kv_cache_manager.h"

namespace tandem {

// What a worker reports to the router with every heartbeat.
struct WorkerLoadSnapshot {
  int queue_depth = 0;  // requests waiting (prefill: queued prompts; decode: admitted, not running)
  int running = 0;
  int free_blocks = 0;
  int total_blocks = 0;
  int block_size = 0;
  // Decode: blocks its sequences may still claim to reach their most tokens, and the blocks
  // admission leaves free for growth.
  int growth_blocks = 0;
  int watermark_blocks = 0;
  // Decode: admission sets aside the blocks a request may hold on its way to prompt + max_tokens
  // (DecodeScheduler's kReserve; they count in growth_blocks until taken).
  bool reserves_max_tokens = false;
  // Decode: the cache's layer groups (KvTableLayout::group_window; empty: one full group).
  std::vector<int> kv_group_window;

  // What a sequence costs in this worker's blocks (engine/kv/block_table.h).
  KvTableLayout kv_layout() const { return {std::max(1, block_size), kv_group_window}; }
};

// Prefill: first come, first served; each step takes chunks of waiting prompts until the
// token budget or the batch limit is reached; a prompt longer than `chunk_size` is split over
// several steps (chunked prefill), so one long prompt cannot hold the others back for long.
class PrefillScheduler {
 public:
  struct Options {
    int token_budget = 2048;  // prompt tokens per step (forward call)
    int chunk_size = 512;     // most tokens of one prompt per step
    int max_batch = 64;       // prompts per step
  };
  struct Work {
    uint64_t id;
    int start;  // first prompt position computed in this step
    int count;  // tokens
    bool last;  // the prompt is complete after this step
  };

  explicit PrefillScheduler(Options options) : options_(options) {}

  // `computed` tokens are already in the cache (a prefix-cache hit); prompt_len > computed.
  absl::Status Add(uint64_t id, int prompt_len, int computed);
  // Cancels a request wherever it is; false when unknown.
  bool Remove(uint64_t id);
  // The next step's work. The scheduler assumes it completes (call Remove on failure).
  std::vector<Work> Schedule();

  int num_waiting() const { return static_cast<int>(queue_.size()); }
  bool empty() const { return queue_.empty(); }

 private:
  struct Entry {
    uint64_t id;
    int prompt_len;
    int computed;
  };
  Options options_;
  std::deque<Entry> queue_;
};

// Decode: KV blocks on demand, as tokens arrive. Admission reserves only the prompt's blocks
// (and the first token's slot), and only while at least the watermark of blocks stays free for
// running sequences to grow into; every step, a sequence that crosses a block boundary gets a
// block. When none is free, running sequences are preempted, the most recently admitted first
// (vLLM's policy): their blocks are freed and they wait to be readmitted, ahead of every new
// admission, and recomputed (all their tokens' KV, in chunks under a token budget per step) on
// this worker. A request that could not fit even in an empty cache is refused at admission.
//
// One sequence's life: Admit (its prompt's KV arrives into the blocks) -> Start (it joins the
// running batch, holding the prompt and the first token) -> steps (Schedule: positions to
// compute; Complete: computed, and a sampled sequence gains a token) -> Release. Requests are
// ordered by admission; a readmitted sequence keeps its place.
//
// With Admission::kReserve, admission instead sets aside every block a request may hold on its
// way to prompt + max_tokens (KvTableLayout::PeakBlocks: a sliding group's window, a full
// group's every block), taking them from the pool as it grows and keeping the rest out of every
// other admission's reach, and nothing is ever preempted: fewer sequences fit, as in TensorRT-LLM's
// GUARANTEED_NO_EVICT policy. A deployment that must never recompute chooses it.
//
// The single-process engine (engine/generator.h) drives the same scheduler with its prompts
// computed here: Enqueue puts a request where a preempted one waits, with nothing computed, and
// the recompute path computes its prompt in chunks (Options::chunk_size), under the forward
// call's limit of tokens per step (Options::step_tokens) and of sequences per batch
// (Options::max_batch).
class DecodeScheduler {
 public:
  enum class Admission { kOnDemand, kReserve };  // --kv-admission on-demand|reserve
  // Where a request is in its life on this worker (until Release forgets it).
  enum class State { kAdmitted, kRunning, kPreempted };
  struct Options {
    int num_blocks = 0;
    int block_size = 16;
    int max_running = 256;  // requests on the worker at once (admitted, running or preempted)
    // Fraction of the blocks that admission leaves free for running sequences to grow into (at
    // least one block when positive).
    double watermark = 0.01;
    int recompute_budget = 512;  // tokens of preempted sequences recomputed per step
    Admission admission = Admission::kOnDemand;
    // The cache's layer groups (KvCacheSpec::group_window; empty: one full-attention group).
    // A sequence holds a block per group per block_size tokens, and lets a sliding group's
    // blocks go once they fall behind its window (engine/kv/block_table.h).
    std::vector<int> group_window;
    // Sequences in the running batch at once: readmission stops there.
    int max_batch = INT32_MAX;
    // Most positions of one sequence computed in a step (a prompt's or a recompute's chunk);
    // 0: no cap beyond recompute_budget.
    int chunk_size = 0;
    // Every position computed in one step, decodes included: the forward call's limit.
    int step_tokens = INT32_MAX;
  };
  struct Work {
    uint64_t id;
    int start;    // first position computed in this step
    int count;    // positions [start, start + count): 1 for a decode step, more when recomputing
    bool sample;  // the last position's logits give the sequence's next token
    // Speculative decoding: proposals scored after the decode step's token (Speculate); then
    // count = 1 + draft and every position's logits are sampled in turn.
    int draft = 0;
  };
  struct Step {
    std::vector<Work> work;           // in admission order
    std::vector<uint64_t> preempted;  // preempted while planning this step (blocks freed)
    int tokens = 0;                   // positions computed: the works' counts
  };

  explicit DecodeScheduler(Options options);
  DecodeScheduler(int num_blocks, int block_size, int max_running)
      : DecodeScheduler(MakeOptions(num_blocks, block_size, max_running)) {}

  // Logical blocks (one per group each) covering `tokens` tokens.
  int BlocksFor(int tokens) const { return cache_.layout().LogicalBlocks(tokens); }
  // Takes blocks for `prompt_tokens` plus the first token (kReserve: and sets aside those it may
  // hold on its way to `max_tokens`). `max_tokens` is the most tokens the request may reach
  // (prompt + max_tokens, capped by the context). RESOURCE_EXHAUSTED when it
  // could not fit even in an empty cache, when preempted sequences are waiting (they go first),
  // at the request limit, or when admitting would eat into the watermark; ALREADY_EXISTS for a
  // known id.
  absl::StatusOr<std::vector<int>> Admit(uint64_t id, int prompt_tokens, int max_tokens);
  // A request whose prompt is computed on this worker (the single-process engine,
  // engine/generator.h): it waits with the preempted sequences, in admission order, and its
  // prompt is computed as theirs are recomputed, in chunks; the work that computes its last
  // position samples its first token. RESOURCE_EXHAUSTED when it could not fit even in an empty
  // cache or at the request limit; ALREADY_EXISTS for a known id; INVALID_ARGUMENT for an empty
  // prompt.
  absl::Status Enqueue(uint64_t id, int prompt_tokens, int max_tokens);
  // Moves an admitted request into the running batch: it holds the prompt and the first token,
  // the prompt's KV is in its blocks.
  absl::Status Start(uint64_t id);
  // Plans one step. Readmits waiting preempted sequences (oldest first) while their blocks are
  // free and the batch has room, then gives the running sequences, in admission order, the
  // positions to compute (one for a decode, a chunk for a recompute) while the step has tokens
  // left, growing block tables and preempting the newest sequences when needed.
  Step Schedule();
  // Speculative decoding: widens the plain decode work step->work[i] to also score up to `k`
  // proposals after its token. Their positions' blocks come only from free ones (speculation never
  // preempts a sequence) and they count against the step's tokens, so fewer may be granted.
  // Returns the proposals granted, 0..k.
  int Speculate(Step* step, size_t i, int k);
  // The step ran: each work's positions are computed, and a sampled sequence gained a token. A
  // work that scored proposals gained 1 + kept[i] tokens (the proposals kept, engine/speculative/
  // proposer.h; `kept` has a value per work, or is empty when none scored proposals), and the
  // blocks that held only rejected proposals are freed.
  void Complete(const Step& step, std::span<const int> kept = {});
  // Frees the request's blocks exactly once, whatever its state; false when unknown.
  bool Release(uint64_t id);
  // The request is cancelled and leaves at the next step boundary (its blocks may be in use
  // until then): from now on it holds no place against max_running, so the request taking its
  // place is admitted at once. Its blocks stay taken until Release.
  void MarkLeaving(uint64_t id);

  // Sequences in the running batch (started, not preempted), in admission order.
  const std::vector<uint64_t>& running() const { return running_; }
  // The sequence's block table (engine/kv/block_table.h: interleaved by group).
  const std::vector<int>* blocks(uint64_t id) const;
  // Tokens the sequence holds (prompt and generated); -1 when unknown.
  int tokens(uint64_t id) const;
  // The request's state; nullopt when unknown (never admitted, or released).
  std::optional<State> state(uint64_t id) const;
  int num_admitted() const { return static_cast<int>(requests_.size()); }
  // Admitted requests that hold a place against max_running: those not marked leaving.
  int num_holding_places() const { return num_admitted() - num_leaving_; }
  int num_preempted() const { return static_cast<int>(preempted_.size()); }
  // Sequences waiting to be readmitted (preempted or enqueued), oldest first.
  const std::vector<uint64_t>& preempted() const { return preempted_; }
  int num_free_blocks() const { return cache_.pool().num_available(); }
  int num_blocks() const { return cache_.pool().num_blocks(); }
  int block_size() const { return options_.block_size; }
  const KvTableLayout& layout() const { return cache_.layout(); }
  int watermark_blocks() const { return watermark_blocks_; }
  Admission admission() const { return options_.admission; }
  // Blocks the sequences may still claim on their way to their most tokens (the growth promised;
  // under kReserve, blocks no admission may take).
  int growth_promised() const;
  int64_t preemptions() const { return preemptions_; }
  // The leak check: no request and no block in use.
  bool Idle() const { return requests_.empty() && cache_.pool().NoneInUse(); }

 private:
  static Options MakeOptions(int num_blocks, int block_size, int max_running) {
    Options o;
    o.num_blocks = num_blocks;
    o.block_size = block_size;
    o.max_running = max_running;
    return o;
  }
  struct Entry {
    uint64_t order = 0;  // admission order
    State state = State::kAdmitted;
    int tokens = 0;    // prompt and generated
    int computed = 0;  // positions whose KV is in the blocks
    int max_tokens = 0;
    bool leaving = false;  // MarkLeaving: cancelled, released at the next step boundary
    std::vector<int> blocks;
  };
  // The most tokens a new request may reach (prompt + 1 at least): ALREADY_EXISTS for a known
  // id, RESOURCE_EXHAUSTED when it could not fit even in an empty cache.
  absl::StatusOr<int> MostTokens(uint64_t id, int prompt_tokens, int max_tokens) const;
  void Preempt(uint64_t id, Entry& e);
  // The running sequence admitted last and not in `step`, or 0.
  uint64_t Victim(const Step& step) const;
  // Inserts `id` into `ids`, kept in admission order.
  void InsertInOrder(std::vector<uint64_t>& ids, uint64_t id) const;

  Options options_;
  KvCacheManager cache_;  // the pool and the layer groups' table layout
  int watermark_blocks_ = 0;
  absl::flat_hash_map<uint64_t, Entry> requests_;
  std::vector<uint64_t> running_;    // admission order
  std::vector<uint64_t> preempted_;  // admission order: the oldest is readmitted first
  uint64_t next_order_ = 1;
  int64_t preemptions_ = 0;
  int num_leaving_ = 0;  // entries marked leaving
};

// "on-demand" or "reserve" (the --kv-admission flag); INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<DecodeScheduler::Admission> ParseKvAdmission(std::string_view name);

}  // namespace tandem

#endif  // TANDEM_ENGINE_SCHEDULING_SCHEDULER_H_
