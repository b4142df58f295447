// The schedulers of the two worker roles. Pure data structures: request ids in, decisions out;
// no threads, no I/O, no tensors. The prefill and decode workers drive them, and so will the
// capacity planner's simulator.
#ifndef TANDEM_ENGINE_SCHEDULER_H_
#define TANDEM_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/block_pool.h"

namespace tandem {

// What a worker reports to the router with every heartbeat.
struct WorkerLoadSnapshot {
  int queue_depth = 0;  // requests waiting (prefill: queued prompts; decode: admitted, not running)
  int running = 0;
  int free_blocks = 0;
  int total_blocks = 0;
  int block_size = 0;
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

// Decode: admission reserves KV blocks for the whole request (prompt + max_tokens, capped by
// the context), so a running request never needs a block that is not there and no request is
// preempted; requests join the running batch when started and leave it when finished, every
// step (continuous batching).
class DecodeScheduler {
 public:
  DecodeScheduler(int num_blocks, int block_size, int max_running)
      : pool_(num_blocks), block_size_(block_size), max_running_(max_running) {}

  int BlocksFor(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Reserves blocks for `total_tokens`; RESOURCE_EXHAUSTED when they are not free or the
  // running limit is reached, ALREADY_EXISTS for a known id.
  absl::StatusOr<std::vector<int>> Admit(uint64_t id, int total_tokens);
  // Moves an admitted request into the running batch.
  absl::Status Start(uint64_t id);
  // Frees the request's blocks exactly once (admitted or running); false when unknown.
  bool Release(uint64_t id);

  const std::vector<uint64_t>& running() const { return running_; }
  const std::vector<int>* blocks(uint64_t id) const;
  int num_admitted() const { return static_cast<int>(requests_.size()); }
  int num_free_blocks() const { return pool_.num_available(); }
  int num_blocks() const { return pool_.num_blocks(); }
  int block_size() const { return block_size_; }
  // The leak check: no request and no block in use.
  bool Idle() const { return requests_.empty() && pool_.NoneInUse(); }

 private:
  struct Entry {
    std::vector<int> blocks;
    bool running = false;
  };
  BlockPool pool_;
  int block_size_;
  int max_running_;
  absl::flat_hash_map<uint64_t, Entry> requests_;
  std::vector<uint64_t> running_;  // in start order
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_SCHEDULER_H_
