// A fixed pool of worker threads for data-parallel loops in the CPU kernels.
//
// Decode of a small model issues ~40 parallel loops per token, each a few tens of microseconds
// long, so the cost of waking workers matters: after a loop, workers spin for a short while
// (kSpinMicros) waiting for the next one before they block on a condition variable. That wake-up
// cost is why the pool is written here rather than taken from OpenMP or std::async.
#ifndef TANDEM_KERNELS_CPU_THREAD_POOL_H_
#define TANDEM_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  // `num_threads` <= 0 means std::thread::hardware_concurrency(). The calling thread takes part
  // in every loop, so a pool of N runs N-1 workers.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), in parallel; returns when all are
  // done. Ranges are [i * grain, min(n, (i + 1) * grain)) and are handed out dynamically, so a
  // thread that finishes early takes more, and a loop never waits for a worker that has not
  // woken up yet (the caller takes its chunks). Calls from several threads are serialized
  // (workers of one process share the cores anyway); not reentrant from inside fn.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // How long an idle worker spins before it sleeps.
  static constexpr int kSpinMicros = 200;

 private:
  void WorkerLoop();
  // Claims and runs chunks of the current loop until none is left.
  void RunChunks();

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time

  // The current loop. `state_` packs (generation:16 | chunks:24 | next chunk:24); a thread claims
  // a chunk by a compare-and-swap on it, and reads fn_/n_/grain_ only after a successful claim:
  // the caller rewrites them for the next loop only once done_ has reached the chunk count,
  // which cannot happen while a claimed chunk runs.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};

  std::mutex sleep_mu_;
  std::condition_variable wake_cv_;
  int sleepers_ = 0;  // guarded by sleep_mu_
  std::atomic<bool> stop_{false};
};

}  // namespace tandem

#endif  // TANDEM_KERNELS_CPU_THREAD_POOL_H_
