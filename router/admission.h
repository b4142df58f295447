// Decode admission as a pure data structure: the line that requests wait in for KV room on a
// decode worker (first come, first admitted, bounded), and the refusal of a request no worker's
// whole cache can ever hold. No locks, clocks or RPCs: the router holds it under its mutex and
// looks for room as workers report it (router/generate_transaction.cc); the planner's simulator
// runs the same line in its event loop (planner/simulator.cc), so that the planner predicts the
// router that runs.
#ifndef TANDEM_ROUTER_ADMISSION_H_
#define TANDEM_ROUTER_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace tandem {

class AdmissionLine {
 public:
  // At most `max_queued` requests wait at once.
  explicit AdmissionLine(int max_queued) : max_queued_(max_queued) {}

  // A place at the back of the line: its ticket (never 0), or nullopt when `max_queued` requests
  // already wait (the caller answers RESOURCE_EXHAUSTED).
  std::optional<uint64_t> Join();
  // Whether the holder of `ticket` may look for room now: the line is empty, or the ticket is
  // at its front. A request not in line (ticket 0) may look only when nobody waits.
  bool MayLook(uint64_t ticket) const;
  // Leaves the line (admitted, refused or gone): the next in line may look. Unknown tickets and
  // 0 are ignored.
  void Leave(uint64_t ticket);

  int waiting() const { return static_cast<int>(order_.size()); }
  int max_queued() const { return max_queued_; }
  // The ticket at the front, 0 when nobody waits.
  uint64_t front() const { return order_.empty() ? 0 : order_.front(); }

 private:
  int max_queued_;
  uint64_t next_ticket_ = 1;
  std::deque<uint64_t> order_;  // oldest first
};

// Why a request that may reach `total_tokens` (prompt and max_tokens, within the context) can
// never be admitted: every decode worker's whole cache holds fewer (`largest_tokens`, 0 when no
// worker has reported one yet). nullopt when it may fit.
std::optional<std::string> NeverFits(int64_t largest_tokens, int64_t total_tokens);

}  // namespace tandem

#endif  // TANDEM_ROUTER_ADMISSION_H_
