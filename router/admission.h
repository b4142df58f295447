// Decode admission as a pure data structure: the line that requests wait in for KV room on a
// decode worker (bounded; fair across tenants, by priority then first come first admitted
// within one), and the
// refusal of a request no worker's whole cache can ever hold. No locks, clocks or RPCs: the router
// holds it under its mutex and looks for room as workers report it
// (router/generate_transaction.cc); the planner's simulator runs the same line in its event loop
// (planner/simulator.cc), so that the planner predicts the router that runs.
#ifndef TANDEM_ROUTER_ADMISSION_H_
#define TANDEM_ROUTER_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

namespace tandem {

class AdmissionLine {
 public:
  // At most `max_queued` requests wait at once.
  explicit AdmissionLine(int max_queued) : max_queued_(max_queued) {}

  // A place at the back of `tenant`'s part of the line: its ticket (never 0), or nullopt when
  // `max_queued` requests already wait (the caller answers RESOURCE_EXHAUSTED). Tenants (API
  // keys, client addresses; "" for all when the caller does not tell them apart) take turns at
  // the front: a tenant's next request looks for room after one of every other waiting tenant's,
  // so one tenant's thousand waiting requests put another's behind one of them. Within a
  // tenant, a lower `priority` goes first (vLLM's field), then first come first.
  std::optional<uint64_t> Join(const std::string& tenant = "", int priority = 0);
  // Whether the holder of `ticket` may look for room now: the line is empty, or the ticket is
  // at its front. A request not in line (ticket 0) may look only when nobody waits.
  bool MayLook(uint64_t ticket) const;
  // Leaves the line (admitted, refused or gone): the next in line may look; the front's leaving
  // passes the turn to the next tenant. Unknown tickets and 0 are ignored.
  void Leave(uint64_t ticket);

  // The front's tenant passes its turn to the next tenant waiting (none: nothing changes); its
  // request keeps its place at the front of its own part of the line.
  void PassTurn();
  // `tenant`'s turn comes first: its front request may look now (a tenant waiting with none of
  // its own: nothing changes). The caller decides when that is fair (router: a tenant streaming
  // far fewer sequences than the one whose turn it is).
  void GoFirst(const std::string& tenant);
  // Tenants waiting, the one whose turn it is first.
  const std::deque<std::string>& turns() const { return turns_; }

  int waiting() const { return static_cast<int>(tenant_of_.size()); }
  int max_queued() const { return max_queued_; }
  // The ticket at the front, 0 when nobody waits.
  uint64_t front() const {
    return turns_.empty() ? 0 : by_tenant_.at(turns_.front()).front().ticket;
  }

 private:
  struct Place {
    int priority;
    uint64_t ticket;
  };
  int max_queued_;
  uint64_t next_ticket_ = 1;
  // Per tenant, by priority then age (tickets grow); never empty.
  std::map<std::string, std::deque<Place>> by_tenant_;
  std::deque<std::string> turns_;  // tenants waiting, next turn first
  std::unordered_map<uint64_t, std::string> tenant_of_;
};

// The sequences each tenant has streaming on the decode workers, and whose place a waiting
// tenant may take: fair shares with no room held idle. A tenant first in line with no room
// anywhere takes the place of the tenant streaming the most, when that one streams at least two
// more than it (shares converge, and never flip back and forth); the place taken is that
// tenant's newest sequence, the least work to redo. The taken sequence is resumed after its
// tokens so far (the router's resume), in line behind the others.
class RunningShares {
 public:
  // `id`s grow with time (the newest is the largest).
  void Add(const std::string& tenant, uint64_t id);
  void Remove(const std::string& tenant, uint64_t id);
  int running(const std::string& tenant) const;
  // `a` streams at least two sequences fewer than `b`: the gap at which `a` goes first and may
  // take one of `b`'s places (shares converge, and never flip back and forth).
  bool FarBelow(const std::string& a, const std::string& b) const {
    return running(a) + 2 <= running(b);
  }
  // The sequence `tenant` may take the place of, if any.
  std::optional<uint64_t> VictimFor(const std::string& tenant) const;

 private:
  std::map<std::string, std::set<uint64_t>> by_tenant_;
};

// Why a request that may reach `total_tokens` (prompt and max_tokens, within the context) can
// never be admitted: every decode worker's whole cache holds fewer (`largest_tokens`, 0 when no
// worker has reported one yet). nullopt when it may fit.
std::optional<std::string> NeverFits(int64_t largest_tokens, int64_t total_tokens);

}  // namespace tandem

#endif  // TANDEM_ROUTER_ADMISSION_H_
