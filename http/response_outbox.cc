#include "http/response_outbox.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace tandem {

ResponseOutbox::ResponseOutbox(OutboxLimits limits, std::atomic<size_t>* total,
                               std::function<void()> notify)
    : limits_(limits), total_(total), notify_(std::move(notify)), last_progress_(absl::Now()) {}

ResponseOutbox::~ResponseOutbox() { total_->fetch_sub(unwritten_, std::memory_order_relaxed); }

bool ResponseOutbox::FullLocked() const {
  return unwritten_ >= limits_.max_bytes ||
         (unwritten_ > 0 && total_->load(std::memory_order_relaxed) > limits_.max_total);
}

std::function<void()> ResponseOutbox::FailLocked(std::string why) {
  if (!failure_.empty()) return nullptr;
  failure_ = std::move(why);
  room_.notify_all();
  std::function<void()> wake = WakeWaitersLocked(false);
  std::function<void()> hook = std::exchange(on_fail_, nullptr);
  return [wake = std::move(wake), hook = std::move(hook)] {
    if (wake) wake();
    if (hook) hook();
  };
}

std::function<void()> ResponseOutbox::WakeWaitersLocked(bool ok) {
  if (waiters_.empty()) return nullptr;
  return [waiters = std::exchange(waiters_, {}), ok] {
    for (const auto& w : waiters) w(ok);
  };
}

std::string ResponseOutbox::JudgeLocked(absl::Time start, size_t taken_before,
                                        absl::Time now) const {
  if (now - last_progress_ >= limits_.stall_timeout) {
    return absl::StrFormat("the client took no byte of its response for %s",
                           absl::FormatDuration(limits_.stall_timeout));
  }
  const absl::Duration waited = now - start;
  if (waited >= limits_.grace &&
      static_cast<double>(taken_ - taken_before) <
          static_cast<double>(limits_.min_bytes_per_second) * absl::ToDoubleSeconds(waited)) {
    return absl::StrFormat(
        "the client read its response slower than %d bytes/s with %d bytes waiting",
        limits_.min_bytes_per_second, unwritten_);
  }
  return "";
}

bool ResponseOutbox::Push(std::string_view a, std::string_view b, bool wait_for_room) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failure_.empty()) return false;
  if (wait_for_room && FullLocked()) {
    const absl::Time start = absl::Now();
    const size_t taken_before = taken_;
    while (FullLocked()) {
      if (!failure_.empty()) return false;
      if (std::string why = JudgeLocked(start, taken_before, absl::Now()); !why.empty()) {
        std::function<void()> after = FailLocked(std::move(why));
        lock.unlock();
        if (after) after();
        return false;
      }
      room_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
  const size_t n = a.size() + b.size();
  if (n == 0) return true;
  std::string piece;
  piece.reserve(n);
  piece.append(a);
  piece.append(b);
  const bool was_empty = unwritten_ == 0;
  if (was_empty) last_progress_ = absl::Now();  // a stall counts from when there is a byte to take
  pieces_.push_back(std::move(piece));
  unwritten_ += n;
  total_->fetch_add(n, std::memory_order_relaxed);
  lock.unlock();
  if (was_empty && notify_) notify_();
  return true;
}

bool ResponseOutbox::PushThen(std::string_view a, std::string_view b,
                              std::function<void(bool)> room) {
  if (!Push(a, b, /*wait_for_room=*/false)) return false;
  std::unique_lock<std::mutex> lock(mu_);
  if (!failure_.empty()) {
    lock.unlock();
    room(false);
    return true;
  }
  if (!FullLocked()) {
    lock.unlock();
    room(true);
    return true;
  }
  if (waiters_.empty()) {
    wait_start_ = absl::Now();
    taken_at_wait_ = taken_;
  }
  waiters_.push_back(std::move(room));
  return true;
}

void ResponseOutbox::OnFail(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if ((failure_.empty() && !left_) || !fn) {
    on_fail_ = std::move(fn);
    return;
  }
  lock.unlock();
  fn();
}

void ResponseOutbox::ClientLeft() {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left_ = true;
    hook = std::exchange(on_fail_, nullptr);
  }
  if (hook) hook();
}

void ResponseOutbox::Judge(absl::Time now) {
  std::function<void()> after;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiters_.empty() || !failure_.empty()) return;
    if (!FullLocked()) {
      after = WakeWaitersLocked(true);  // room made by other connections' bytes leaving
    } else if (std::string why = JudgeLocked(wait_start_, taken_at_wait_, now); !why.empty()) {
      after = FailLocked(std::move(why));
    }
  }
  if (after) after();
}

std::string ResponseOutbox::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

bool ResponseOutbox::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !failure_.empty();
}

std::string_view ResponseOutbox::Front() {
  std::lock_guard<std::mutex> lock(mu_);
  if (pieces_.empty()) return {};
  const std::string& front = pieces_.front();  // deque::push_back keeps it where it is
  return std::string_view(front).substr(front_offset_);
}

void ResponseOutbox::Consumed(size_t n, absl::Time now) {
  if (n == 0) return;
  std::function<void()> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    front_offset_ += n;
    unwritten_ -= n;
    taken_ += n;
    total_->fetch_sub(n, std::memory_order_relaxed);
    last_progress_ = now;
    if (front_offset_ >= pieces_.front().size()) {
      pieces_.pop_front();
      front_offset_ = 0;
    }
    room_.notify_all();
    if (!FullLocked()) wake = WakeWaitersLocked(true);
  }
  if (wake) wake();
}

void ResponseOutbox::Fail(std::string why) {
  std::function<void()> after;
  {
    std::lock_guard<std::mutex> lock(mu_);
    after = FailLocked(std::move(why));
  }
  if (after) after();
}

size_t ResponseOutbox::unwritten() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unwritten_;
}

}  // namespace tandem
