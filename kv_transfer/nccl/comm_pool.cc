#include "kv_transfer/nccl/comm_pool.h"

#include "absl/strings/str_format.h"

namespace tandem {

absl::StatusOr<NcclCommPool::Entry*> NcclCommPool::Pick(const std::string& peer) {
  Entry* least = nullptr;
  int of_peer = 0;
  for (auto& [id, e] : entries_) {
    if (e->peer != peer) continue;
    ++of_peer;
    if (least == nullptr || e->active < least->active ||
        (e->active == least->active && e->id < least->id)) {
      least = e.get();
    }
  }
  if (least != nullptr && least->active == 0) return least;
  if (of_peer < options_.max_comms_per_peer) {
    bool room = static_cast<int>(entries_.size()) < options_.max_comms;
    for (auto& [id, e] : entries_) room = room || e->active == 0;
    if (room) return nullptr;
  }
  if (least != nullptr) return least;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "nccl kv: all %d communicators are busy; none free for peer %s", entries_.size(), peer));
}

NcclCommPool::Entry* NcclCommPool::Add(const std::string& peer, std::unique_ptr<Communicator> comm,
                                       absl::Time now) {
  while (static_cast<int>(entries_.size()) >= options_.max_comms) {
    const size_t before = entries_.size();
    EvictLruIdle();
    if (entries_.size() == before) break;  // every one busy: go over the bound rather than fail
  }
  auto e = std::make_unique<Entry>();
  e->id = next_id_++;
  e->peer = peer;
  e->comm = std::move(comm);
  e->last_used = now;
  Entry* raw = e.get();
  entries_[raw->id] = std::move(e);
  return raw;
}

NcclCommPool::Entry* NcclCommPool::Find(uint64_t id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.get();
}

void NcclCommPool::Invalidate(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  it->second->comm->Abort();
  entries_.erase(it);
}

int NcclCommPool::EvictIdle(absl::Time now) {
  std::vector<uint64_t> idle;
  for (auto& [id, e] : entries_) {
    if (e->active == 0 && now - e->last_used >= options_.idle_timeout) idle.push_back(id);
  }
  for (uint64_t id : idle) Invalidate(id);
  return static_cast<int>(idle.size());
}

void NcclCommPool::EvictLruIdle() {
  Entry* lru = nullptr;
  for (auto& [id, e] : entries_) {
    if (e->active == 0 && (lru == nullptr || e->last_used < lru->last_used)) lru = e.get();
  }
  if (lru != nullptr) Invalidate(lru->id);
}

void NcclCommPool::AbortAll() {
  for (auto& [id, e] : entries_) e->comm->Abort();
  entries_.clear();
}

std::vector<NcclCommPool::Entry*> NcclCommPool::entries() {
  std::vector<Entry*> out;
  for (auto& [id, e] : entries_) out.push_back(e.get());
  return out;
}

size_t NcclCommPool::size(const std::string& peer) const {
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += e->peer == peer;
  return n;
}

}  // namespace tandem
