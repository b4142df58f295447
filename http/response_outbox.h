// The bytes of one connection's response on their way to the client: handlers append (the
// producer), the listener's event loop writes them to the socket (the consumer). A handler never
// touches a socket, so a client that reads slowly, or not at all, costs a bounded buffer, never a
// blocked serving thread beyond a short grace:
//   - a streamed piece waits while the connection already holds `max_bytes` unwritten; past
//     `grace` of waiting, the client must have taken `min_bytes_per_second` over the wait, and
//     never stalled for `stall_timeout`, or the outbox fails (the request is then cancelled:
//     its KV freed on every worker);
//   - a whole response (Content-Length) is taken at once, whatever its size: it is already in
//     memory, and the loop writes it after its handler has gone;
//   - bytes held over every outbox together are counted in `total` and bounded by `max_total`:
//     past it, a streamed piece waits as if its own outbox were full.
// Thread-safe: one producer, one consumer.
#ifndef TANDEM_HTTP_RESPONSE_OUTBOX_H_
#define TANDEM_HTTP_RESPONSE_OUTBOX_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

namespace tandem {

struct OutboxLimits {
  size_t max_bytes = size_t{256} << 10;  // unwritten bytes of one connection before a piece waits
  size_t max_total = size_t{256} << 20;  // over every connection (`total`)
  size_t min_bytes_per_second = 4096;    // a full outbox's client must take at least this
  absl::Duration grace = absl::Seconds(1);           // of waiting, before the rate is judged
  absl::Duration stall_timeout = absl::Seconds(30);  // without a byte taken
};

class ResponseOutbox {
 public:
  // `total` (shared by a listener's outboxes) must outlive the outbox; `notify` is called
  // (without the lock) when bytes arrive in an outbox that was empty, for the consumer to write.
  ResponseOutbox(OutboxLimits limits, std::atomic<size_t>* total, std::function<void()> notify);
  ~ResponseOutbox();  // gives its bytes back to `total`

  // ---- The producer (a handler) ----
  // Appends `a` then `b`. A streamed piece (`wait_for_room`) first waits for room as above.
  // False, taking nothing, once the outbox has failed.
  bool Push(std::string_view a, std::string_view b, bool wait_for_room);
  // Appends `a` then `b` without waiting (false, taking nothing, once failed), then calls
  // `room(true)` when the outbox has room for another piece (at once if it has) or `room(false)`
  // once it fails: a producer that holds no thread sends its next piece after `room`. A waiting
  // producer is judged by the same rate rule (Judge, from the consumer).
  bool PushThen(std::string_view a, std::string_view b, std::function<void(bool)> room);
  // Runs `fn` once when the outbox fails or its client leaves (at once if either happened),
  // e.g. to cancel the request whose response it carries; nullptr clears it.
  void OnFail(std::function<void()> fn);
  // Why the outbox failed ("" while it has not): the client went away or read too slowly.
  std::string failure() const;
  bool failed() const;

  // ---- The consumer (the event loop) ----
  // The next bytes to write (empty when none). They stay valid until Consumed.
  std::string_view Front();
  // `n` bytes of Front were written at `now`.
  void Consumed(size_t n, absl::Time now);
  // The connection failed or closed: every waiting and later Push fails.
  void Fail(std::string why);
  // The client closed its side of the connection: the fail hook runs (a request being made for
  // it is cancelled), but what is pushed is still written, for a client that only half-closed.
  void ClientLeft();
  // The rate rule for producers waiting on PushThen, judged at `now` (the consumer calls it a few
  // times a second): the outbox fails when they waited past the grace with too few bytes taken.
  void Judge(absl::Time now);
  size_t unwritten() const;

 private:
  bool FullLocked() const;
  // Fails the outbox; returns what must run without the lock (the waiters and the fail hook).
  [[nodiscard]] std::function<void()> FailLocked(std::string why);
  // Whether a wait that began at `start` with `taken_before` bytes taken breaks the rate rule at
  // `now`: why, or "".
  std::string JudgeLocked(absl::Time start, size_t taken_before, absl::Time now) const;
  std::function<void()> WakeWaitersLocked(bool ok);

  const OutboxLimits limits_;
  std::atomic<size_t>* const total_;
  const std::function<void()> notify_;
  mutable std::mutex mu_;
  std::condition_variable room_;
  std::deque<std::string> pieces_;  // oldest first; the consumer writes from the front one
  size_t front_offset_ = 0;         // of pieces_.front(), written already
  size_t unwritten_ = 0;
  size_t taken_ = 0;  // bytes written over the outbox's life
  absl::Time last_progress_;
  std::string failure_;
  std::vector<std::function<void(bool)>> waiters_;  // PushThen's, until room or failure
  absl::Time wait_start_;                           // since when waiters_ wait
  size_t taken_at_wait_ = 0;
  std::function<void()> on_fail_;
  bool left_ = false;  // ClientLeft was called
};

}  // namespace tandem

#endif  // TANDEM_HTTP_RESPONSE_OUTBOX_H_
