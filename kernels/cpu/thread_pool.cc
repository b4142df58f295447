#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace tandem {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(1, num_threads);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  if (num_threads_ == 1 || units == 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (units + num_threads_ - 1) / num_threads_;
  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = per * grain;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  fn(0, std::min(n, chunk_));
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t begin, end;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      begin = std::min(n_, index * chunk_);
      end = std::min(n_, begin + chunk_);
    }
    if (begin < end) (*fn)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

ThreadPool& DefaultThreadPool() {
  static ThreadPool* pool = [] {
    int n = 0;
    if (const char* env = std::getenv("TANDEM_NUM_THREADS")) n = std::atoi(env);
    return new ThreadPool(n);
  }();
  return *pool;
}

}  // namespace tandem
