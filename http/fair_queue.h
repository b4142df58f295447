// A line shared fairly by tenants, as a pure data structure: each tenant's items wait in their
// own order (oldest first), and the tenants take turns, one item each, in the order they joined
// the line. One tenant's thousand waiting requests therefore put another tenant's request behind
// at most one of them. When the line is full, the newest item of the tenant holding the most
// makes room (TakeNewestOfLargest), so a flood costs its sender its own places. Not thread-safe:
// the listener holds it under its lock.
#ifndef TANDEM_HTTP_FAIR_QUEUE_H_
#define TANDEM_HTTP_FAIR_QUEUE_H_

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace tandem {

template <typename T>
class FairQueue {
 public:
  void Push(const std::string& tenant, T item) {
    std::deque<T>& line = by_tenant_[tenant];
    if (line.empty()) turns_.push_back(tenant);
    line.push_back(std::move(item));
    ++size_;
  }

  // The oldest item of the tenant whose turn it is; nullopt when empty.
  std::optional<T> Pop() {
    if (turns_.empty()) return std::nullopt;
    std::string tenant = std::move(turns_.front());
    turns_.pop_front();
    auto it = by_tenant_.find(tenant);
    T item = std::move(it->second.front());
    it->second.pop_front();
    --size_;
    if (it->second.empty()) {
      by_tenant_.erase(it);
    } else {
      turns_.push_back(std::move(tenant));  // its next item waits for the next round
    }
    return item;
  }

  // How many items `tenant` has waiting.
  size_t Waiting(const std::string& tenant) const {
    auto it = by_tenant_.find(tenant);
    return it == by_tenant_.end() ? 0 : it->second.size();
  }

  // The newest item of the tenant with the most waiting, when it has more than `than`; nullopt
  // otherwise. Ties go to the tenant that joined the line first.
  std::optional<T> TakeNewestOfLargest(size_t than) {
    const std::string* largest = nullptr;
    size_t most = than;
    for (const std::string& tenant : turns_) {
      const size_t n = by_tenant_.at(tenant).size();
      if (n > most) {
        most = n;
        largest = &tenant;
      }
    }
    if (largest == nullptr) return std::nullopt;
    const std::string tenant = *largest;
    std::deque<T>& line = by_tenant_.at(tenant);
    T item = std::move(line.back());
    line.pop_back();
    --size_;
    if (line.empty()) {
      by_tenant_.erase(tenant);
      for (auto t = turns_.begin(); t != turns_.end(); ++t) {
        if (*t == tenant) {
          turns_.erase(t);
          break;
        }
      }
    }
    return item;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t tenants() const { return by_tenant_.size(); }

  void Clear() {
    by_tenant_.clear();
    turns_.clear();
    size_ = 0;
  }

 private:
  std::unordered_map<std::string, std::deque<T>> by_tenant_;  // never holds an empty line
  std::deque<std::string> turns_;  // tenants with items waiting, next turn first
  size_t size_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_HTTP_FAIR_QUEUE_H_
