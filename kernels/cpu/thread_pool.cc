#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "kernels/cpu/core_share.h"
#include "kernels/step_progress.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tandem {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// state_ layout: generation in bits 48..63, chunk count in 24..47, next chunk in 0..23.
constexpr int64_t kMaxChunks = (int64_t{1} << 24) - 1;
inline uint32_t GenerationOf(uint64_t s) { return static_cast<uint32_t>(s >> 48); }
inline int64_t ChunksOf(uint64_t s) { return static_cast<int64_t>((s >> 24) & kMaxChunks); }
inline int64_t NextOf(uint64_t s) { return static_cast<int64_t>(s & kMaxChunks); }

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(1, num_threads);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    stop_.store(true);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  uint64_t cur = state_.load(std::memory_order_acquire);
  while (NextOf(cur) < ChunksOf(cur)) {
    if (!state_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // cur was reloaded
    }
    const int64_t c = NextOf(cur);
    (*fn_)(c * grain_, std::min(n_, (c + 1) * grain_));
    done_.fetch_add(1, std::memory_order_release);
    cur = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // A colocated prefill's loop waits for its turn beside decode steps (kernels/cpu/core_share.h).
  // Each finished loop is progress of the step running on this thread (kernels/step_progress.h).
  struct Turn {
    bool held = CoreShare::Process().EnterLoop();
    ~Turn() {
      if (held) CoreShare::Process().ExitLoop();
      StepProgress::NoteHere();
    }
  } turn;
  grain = std::max<int64_t>({1, grain, (n + kMaxChunks - 1) / kMaxChunks});
  if (num_threads_ == 1 || grain >= n) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  const int64_t chunks = (n + grain - 1) / grain;
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  done_.store(0, std::memory_order_relaxed);
  // Publishes the fields above with the new generation, the chunk count and chunk 0.
  const uint64_t generation = (GenerationOf(state_.load(std::memory_order_relaxed)) + 1) & 0xffff;
  state_.store(generation << 48 | static_cast<uint64_t>(chunks) << 24, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    if (sleepers_ > 0) wake_cv_.notify_all();
  }
  RunChunks();
  // Only chunks that workers have claimed remain. Yielding now and then lets a descheduled
  // worker finish its chunk when the cores are oversubscribed.
  for (int i = 1; done_.load(std::memory_order_acquire) != chunks; ++i) {
    CpuRelax();
    if (i % 64 == 0) std::this_thread::yield();
  }
}

void ThreadPool::WorkerLoop() {
  using Clock = std::chrono::steady_clock;
  uint32_t seen = 0;  // the generation before the first loop
  auto current = [this] { return GenerationOf(state_.load(std::memory_order_acquire)); };
  for (;;) {
    // Spin for a while, then sleep until the next loop.
    const auto spin_until = Clock::now() + std::chrono::microseconds(kSpinMicros);
    for (int i = 0; current() == seen; ++i) {
      if (stop_.load(std::memory_order_relaxed)) return;
      CpuRelax();
      if (i % 64 == 63) std::this_thread::yield();
      if (i % 256 == 255 && Clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(sleep_mu_);
        ++sleepers_;
        wake_cv_.wait(lock, [&] { return stop_.load() || current() != seen; });
        --sleepers_;
        if (stop_.load()) return;
      }
    }
    seen = current();
    RunChunks();
  }
}

}  // namespace tandem
