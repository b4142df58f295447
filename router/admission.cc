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

void RunningShares::Add(const std::string& tenant, uint64_t id) { by_tenant_[tenant].insert(id); }

void RunningShares::Remove(const std::string& tenant, uint64_t id) {
  auto it = by_tenant_.find(tenant);
  if (it == by_tenant_.end()) return;
  it->second.erase(id);
  if (it->second.empty()) by_tenant_.erase(it);
}

int RunningShares::running(const std::string& tenant) const {
  auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? 0 : static_cast<int>(it->second.size());
}

std::optional<uint64_t> RunningShares::VictimFor(const std::string& tenant) const {
  const std::pair<const std::string, std::set<uint64_t>>* most = nullptr;
  for (const auto& entry : by_tenant_) {
    if (entry.first == tenant) continue;
    if (most == nullptr || entry.second.size() > most->second.size()) most = &entry;
  }
  if (most == nullptr || !FarBelow(tenant, most->first)) return std::nullopt;
  return *most->second.rbegin();
}

void AdmissionLine::PassTurn() {
  if (turns_.size() < 2) return;
  turns_.push_back(std::move(turns_.front()));
  turns_.pop_front();
}

void AdmissionLine::GoFirst(const std::string& tenant) {
  auto it = std::find(turns_.begin(), turns_.end(), tenant);
  if (it == turns_.end() || it == turns_.begin()) return;
  turns_.erase(it);
  turns_.push_front(tenant);
}

std::optional<std::string> NeverFits(int64_t largest_tokens, int64_t total_tokens) {
  if (largest_tokens <= 0 || largest_tokens >= total_tokens) return std::nullopt;
  return absl::StrFormat(
      "the request may reach %d tokens (prompt and max_tokens); the largest decode worker's KV "
      "cache holds %d",
      total_tokens, largest_tokens);
}

}  // namespace tandem
