// The router's event-driven runtime: a request is a C++20 coroutine (Task) that waits on events
// (a worker's gRPC reactor, a client's write, a timer, a turn in line, a cancel) without holding
// a thread. Every wake-up is posted to a small fixed pool (Executor), so gRPC's callback threads,
// the HTTP event loop and the timer never run a request's code; the router's thread count is
// set by its configuration, not by how many requests are open.
#ifndef TANDEM_ROUTER_ASYNC_H_
#define TANDEM_ROUTER_ASYNC_H_

#include <atomic>
#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace tandem::async {

// A fixed pool of threads running posted work in order of posting.
class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();  // runs what was posted, then joins
  void Post(std::function<void()> fn);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// One thread firing callbacks at their times (on that thread: they must be short, e.g. Post).
class Timer {
 public:
  Timer();
  ~Timer();  // callbacks not yet due are dropped
  // `fn` runs at `when` (at once when past) unless cancelled first; the id for Cancel (never 0).
  uint64_t At(absl::Time when, std::function<void()> fn);
  // Drops a callback not yet run; false when it ran or is running.
  bool Cancel(uint64_t id);

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<absl::Time, uint64_t> due_;
  std::map<uint64_t, std::pair<absl::Time, std::function<void()>>> fns_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

// A coroutine returning T (default-constructible), started when awaited (or by Spawn). Awaiting
// it runs it to its end and resumes the awaiter there (symmetric transfer: no stack growth).
template <typename T>
class [[nodiscard]] Task {
 public:
  struct promise_type {
    T value{};
    std::exception_ptr error;
    std::coroutine_handle<> continuation;
    Task get_return_object() {
      return Task(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct Final {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        std::coroutine_handle<> next = h.promise().continuation;
        return next ? next : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    Final final_suspend() noexcept { return {}; }
    void return_value(T v) { value = std::move(v); }
    void unhandled_exception() { error = std::current_exception(); }
  };

  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~Task() {
    if (h_) h_.destroy();
  }

  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiter) noexcept {
    h_.promise().continuation = awaiter;
    return h_;
  }
  // The task's value, or its exception rethrown.
  T await_resume() {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    return std::move(h_.promise().value);
  }

 private:
  explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

namespace internal {
// A coroutine that starts at once and frees itself at its end.
struct Detached {
  struct promise_type {
    Detached get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};
template <typename T>
Detached RunDetached(Task<T> task, std::function<void(T)> done,
                     std::function<T(const std::exception&)> error) {
  T value;
  try {
    value = co_await task;
  } catch (const std::exception& e) {
    value = error(e);
  }
  done(std::move(value));
}
}  // namespace internal

// Runs `task` (its first steps on the calling thread, up to its first wait) and calls `done`
// with its result where it ends; an exception the task let out becomes `error(e)`'s result.
template <typename T>
void Spawn(Task<T> task, std::function<void(T)> done,
           std::function<T(const std::exception&)> error) {
  internal::RunDetached<T>(std::move(task), std::move(done), std::move(error));
}

// Awaits an operation that reports its result once through a callback: `start(complete)` starts
// it, and `complete(value)` (on any thread, at most once, possibly before `start` returns)
// resumes the coroutine on `executor`; a completion before the coroutine suspended continues it
// inline instead. T: default-constructible.
template <typename T>
class Callback {
 public:
  using Complete = std::function<void(T)>;
  Callback(Executor* executor, std::function<void(Complete)> start)
      : executor_(executor), start_(std::move(start)) {}
  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<> h) {
    h_ = h;
    start_([this](T value) {
      value_ = std::move(value);
      // Second of (completion, suspension) to arrive goes on; the first only marks.
      if (arrived_.exchange(true, std::memory_order_acq_rel)) {
        std::coroutine_handle<> h = h_;
        executor_->Post([h] { h.resume(); });
      }
    });
    return !arrived_.exchange(true, std::memory_order_acq_rel);
  }
  T await_resume() { return std::move(value_); }

 private:
  Executor* executor_;
  std::function<void(Complete)> start_;
  std::coroutine_handle<> h_;
  T value_{};
  std::atomic<bool> arrived_{false};
};

// A completion that may be raced by several sources (a wake-up, a timer, a cancel): the first
// call wins, later ones do nothing and never touch what the first resumed.
template <typename T>
std::function<void(T)> FirstOf(std::function<void(T)> complete) {
  auto once = std::make_shared<std::atomic<bool>>(false);
  auto fn = std::make_shared<std::function<void(T)>>(std::move(complete));
  return [once, fn](T value) {
    if (!once->exchange(true)) (*fn)(std::move(value));
  };
}

// A one-shot signal with subscribers (a client that went away): Fire runs every subscriber once,
// a subscriber added after it runs at once.
class Signal {
 public:
  void Fire();
  bool fired() const { return fired_.load(std::memory_order_acquire); }
  // Returns an id for Unsubscribe (0: fired already, `fn` has run).
  uint64_t Subscribe(std::function<void()> fn);
  // Once it returns, the subscriber does not run (unless it is running on another thread).
  void Unsubscribe(uint64_t id);

 private:
  std::mutex mu_;
  std::atomic<bool> fired_{false};
  uint64_t next_ = 1;
  std::map<uint64_t, std::function<void()>> subs_;
};

}  // namespace tandem::async

#endif  // TANDEM_ROUTER_ASYNC_H_
