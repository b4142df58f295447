#include "router/admission.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tandem {

std::optional<uint64_t> AdmissionLine::Join(const std::string& tenant, int priority) {
  if (waiting() >= max_queued_) return std::nullopt;
  std::deque<Place>& mine = by_tenant_[tenant];
  if (mine.empty()) turns_.push_back(tenant);
  // After every place of the same or a lower priority (tickets only grow: first come first).
  const auto at = std::upper_bound(mine.begin(), mine.end(), priority,
                                   [](int p, const Place& q) { return p < q.priority; });
  mine.insert(at, Place{priority, next_ticket_});
  tenant_of_[next_ticket_] = tenant;
  return next_ticket_++;
}

bool AdmissionLine::MayLook(uint64_t ticket) const {
  return turns_.empty() || (ticket != 0 && front() == ticket);
}

void AdmissionLine::Leave(uint64_t ticket) {
  auto it = tenant_of_.find(ticket);
  if (it == tenant_of_.end()) return;
  const std::string tenant = std::move(it->second);
  tenant_of_.erase(it);
  const bool was_front = front() == ticket;
  std::deque<Place>& mine = by_tenant_.at(tenant);
  mine.erase(std::find_if(mine.begin(), mine.end(),
                          [ticket](const Place& q) { return q.ticket == ticket; }));
  if (mine.empty()) {
    by_tenant_.erase(tenant);
    turns_.erase(std::find(turns_.begin(), turns_.end(), tenant));
  } else if (was_front) {
    turns_.pop_front();  // the turn passes; this tenant's next waits for the others'
    turns_.push_back(tenant);
  }
}

std::optional<std::string> NeverFits(int64_t largest_tokens, int64_t total_tokens) {
  if (largest_tokens <= 0 || largest_tokens >= total_tokens) return std::nullopt;
  return absl::StrFormat(
      "the request may reach %d tokens (prompt and max_tokens); the largest decode worker's KV "
      "cache holds %d",
      total_tokens, largest_tokens);
}

}  // namespace tandem
