#include "http/response_store.h"

namespace tandem::openai {

void ResponseStore::DropLocked(const Key& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  bytes_ -= it->second.bytes;
  entries_.erase(it);
}

void ResponseStore::ExpireLocked(absl::Time now) {
  // Every entry lives `ttl`, so the oldest expire first; keys deleted already are skipped.
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    if (it != entries_.end() && it->second.expires > now) break;
    if (it != entries_.end()) DropLocked(order_.front());
    order_.pop_front();
  }
}

void ResponseStore::Put(const std::string& scope, const std::string& id, StoredResponse response,
                        absl::Time now) {
  const size_t bytes = response.object.dump().size() + response.messages.dump().size();
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  if (bytes > limits_.max_bytes) return;  // larger than the whole store: not kept
  Key key{scope, id};
  DropLocked(key);
  while (bytes_ + bytes > limits_.max_bytes && !order_.empty()) {
    DropLocked(order_.front());
    order_.pop_front();
  }
  entries_[key] = Entry{std::move(response), bytes, now + limits_.ttl};
  order_.push_back(std::move(key));
  bytes_ += bytes;
}

std::optional<StoredResponse> ResponseStore::Get(const std::string& scope, const std::string& id,
                                                 absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  auto it = entries_.find(Key{scope, id});
  if (it == entries_.end()) return std::nullopt;
  return it->second.response;
}

bool ResponseStore::Delete(const std::string& scope, const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  const Key key{scope, id};
  if (!entries_.contains(key)) return false;
  DropLocked(key);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace tandem::openai
