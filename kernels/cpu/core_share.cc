#include "kernels/cpu/core_share.h"

namespace tandem {
namespace {

// The thread's prefill steps in progress (a prefill step never nests another, but counting keeps
// a stray nesting harmless).
thread_local int tls_prefill_depth = 0;

}  // namespace

CoreShare& CoreShare::Process() {
  static auto* share = new CoreShare();
  return *share;
}

void CoreShare::Enable(double prefill_share) {
  std::lock_guard<std::mutex> lock(mu_);
  prefill_share_ = prefill_share > 0 ? prefill_share : 0;
  cv_.notify_all();
}

bool CoreShare::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prefill_share_ > 0;
}

CoreShare::Counters CoreShare::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

bool CoreShare::PrefillMayRunLocked(Clock::time_point now) const {
  // Never inside a decode step; while a decode step waits, only until the window ends.
  return !decode_open_ && (decode_waiting_ == 0 || now < window_end_);
}

CoreShare::DecodeStep::DecodeStep(CoreShare& share) : share_(nullptr) {
  std::unique_lock<std::mutex> lock(share.mu_);
  if (share.prefill_share_ <= 0) return;
  share_ = &share;
  ++share.decode_waiting_;
  bool waited = false;
  for (;;) {
    const Clock::time_point now = Clock::now();
    const bool window_open = share.prefill_steps_ > 0 && now < share.window_end_;
    if (!share.prefill_loop_running_ && !window_open) break;
    waited = true;
    if (window_open && !share.prefill_loop_running_) {
      share.cv_.wait_until(lock, share.window_end_);
    } else {
      share.cv_.wait(lock);
    }
  }
  --share.decode_waiting_;
  share.decode_open_ = true;
  ++share.counters_.decode_steps;
  if (waited) ++share.counters_.decode_waits;
  start_ = Clock::now();
}

CoreShare::DecodeStep::~DecodeStep() {
  if (share_ == nullptr) return;
  std::lock_guard<std::mutex> lock(share_->mu_);
  const Clock::time_point now = Clock::now();
  share_->decode_open_ = false;
  share_->window_end_ =
      now + std::chrono::duration_cast<Clock::duration>((now - start_) * share_->prefill_share_);
  share_->cv_.notify_all();
}

CoreShare::PrefillStep::PrefillStep(CoreShare& share) : share_(nullptr) {
  std::lock_guard<std::mutex> lock(share.mu_);
  if (share.prefill_share_ <= 0) return;
  share_ = &share;
  ++share.prefill_steps_;
  ++tls_prefill_depth;
}

CoreShare::PrefillStep::~PrefillStep() {
  if (share_ == nullptr) return;
  std::lock_guard<std::mutex> lock(share_->mu_);
  --share_->prefill_steps_;
  --tls_prefill_depth;
  share_->cv_.notify_all();  // a decode step waiting out this prefill's window may start
}

bool CoreShare::EnterLoop() {
  if (tls_prefill_depth == 0) return false;
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (PrefillMayRunLocked(now)) break;
    waited = true;
    // A decode step is open, or one waits and the window is over (it goes first, woken by the
    // previous loop's end or its own timer): its end wakes this loop.
    cv_.wait(lock);
  }
  prefill_loop_running_ = true;
  ++counters_.prefill_loops;
  if (waited) ++counters_.prefill_waits;
  return true;
}

void CoreShare::ExitLoop() {
  std::lock_guard<std::mutex> lock(mu_);
  prefill_loop_running_ = false;
  cv_.notify_all();
}

}  // namespace tandem
