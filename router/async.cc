#include "router/async.h"

#include "absl/time/clock.h"

namespace tandem::async {

Executor::Executor(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Executor::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void Executor::Run() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;  // stopping, and everything posted has run
      fn = std::move(work_.front());
      work_.pop_front();
    }
    fn();
  }
}

Timer::Timer() : thread_([this] { Run(); }) {}

Timer::~Timer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Timer::At(absl::Time when, std::function<void()> fn) {
  uint64_t id;
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    first = due_.empty() || when < due_.begin()->first;
    due_.emplace(when, id);
    fns_.emplace(id, std::make_pair(when, std::move(fn)));
  }
  if (first) cv_.notify_all();
  return id;
}

bool Timer::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fns_.find(id);
  if (it == fns_.end()) return false;
  auto [lo, hi] = due_.equal_range(it->second.first);
  for (auto d = lo; d != hi; ++d) {
    if (d->second == id) {
      due_.erase(d);
      break;
    }
  }
  fns_.erase(it);
  return true;
}

void Timer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (due_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const absl::Time when = due_.begin()->first;
    const absl::Time now = absl::Now();
    if (when > now) {
      cv_.wait_for(lock, absl::ToChronoNanoseconds(std::min(when - now, absl::Seconds(1))));
      continue;
    }
    const uint64_t id = due_.begin()->second;
    due_.erase(due_.begin());
    auto it = fns_.find(id);
    std::function<void()> fn = std::move(it->second.second);
    fns_.erase(it);
    lock.unlock();
    fn();
    lock.lock();
  }
}

void Signal::Fire() {
  std::map<uint64_t, std::function<void()>> subs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fired_.load()) return;
    fired_.store(true, std::memory_order_release);
    subs.swap(subs_);
  }
  for (auto& [id, fn] : subs) fn();
}

uint64_t Signal::Subscribe(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fired_.load()) {
      const uint64_t id = next_++;
      subs_.emplace(id, std::move(fn));
      return id;
    }
  }
  fn();
  return 0;
}

void Signal::Unsubscribe(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  subs_.erase(id);
}

}  // namespace tandem::async
