// A fixed pool of worker threads for data-parallel loops in the CPU kernels.
#ifndef TANDEM_KERNELS_CPU_THREAD_POOL_H_
#define TANDEM_KERNELS_CPU_THREAD_POOL_H_

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
  // done. Ranges are multiples of `grain` (except the last). Calls from several threads are
  // serialized (workers of one process share the cores anyway); not reentrant from inside fn.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
};

// The process-wide pool the CPU backend uses (sized by TANDEM_NUM_THREADS or the core count).
ThreadPool& DefaultThreadPool();

}  // namespace tandem

#endif  // TANDEM_KERNELS_CPU_THREAD_POOL_H_
