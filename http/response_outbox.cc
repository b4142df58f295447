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

void ResponseOutbox::FailLocked(std::string why) {
  if (failure_.empty()) failure_ = std::move(why);
  room_.notify_all();
}

bool ResponseOutbox::Push(std::string_view a, std::string_view b, bool wait_for_room) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failure_.empty()) return false;
  if (wait_for_room && FullLocked()) {
    const absl::Time start = absl::Now();
    const size_t taken_before = taken_;
    while (FullLocked()) {
      if (!failure_.empty()) return false;
      const absl::Time now = absl::Now();
      if (now - last_progress_ >= limits_.stall_timeout) {
        FailLocked(absl::StrFormat("the client took no byte of its response for %s",
                                   absl::FormatDuration(limits_.stall_timeout)));
        return false;
      }
      const absl::Duration waited = now - start;
      if (waited >= limits_.grace &&
          static_cast<double>(taken_ - taken_before) <
              static_cast<double>(limits_.min_bytes_per_second) * absl::ToDoubleSeconds(waited)) {
        FailLocked(absl::StrFormat(
            "the client read its response slower than %d bytes/s with %d bytes waiting",
            limits_.min_bytes_per_second, unwritten_));
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
}

void ResponseOutbox::Fail(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  FailLocked(std::move(why));
}

size_t ResponseOutbox::unwritten() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unwritten_;
}

}  // namespace tandem
