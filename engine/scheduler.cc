#include "engine/scheduler.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

absl::Status PrefillScheduler::Add(uint64_t id, int prompt_len, int computed) {
  if (prompt_len <= 0 || computed < 0 || computed >= prompt_len) {
    return absl::InvalidArgumentError("PrefillScheduler::Add: need 0 <= computed < prompt_len");
  }
  for (const auto& e : queue_) {
    if (e.id == id)
      return absl::AlreadyExistsError(absl::StrFormat("request %d already queued", id));
  }
  queue_.push_back({id, prompt_len, computed});
  return absl::OkStatus();
}

bool PrefillScheduler::Remove(uint64_t id) {
  auto it = std::find_if(queue_.begin(), queue_.end(), [id](const Entry& e) { return e.id == id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

std::vector<PrefillScheduler::Work> PrefillScheduler::Schedule() {
  std::vector<Work> work;
  int budget = options_.token_budget;
  for (auto it = queue_.begin();
       it != queue_.end() && budget > 0 && static_cast<int>(work.size()) < options_.max_batch;) {
    const int n = std::min({it->prompt_len - it->computed, options_.chunk_size, budget});
    const bool last = it->computed + n == it->prompt_len;
    work.push_back({it->id, it->computed, n, last});
    budget -= n;
    it->computed += n;
    it = last ? queue_.erase(it) : it + 1;
  }
  return work;
}

absl::StatusOr<std::vector<int>> DecodeScheduler::Admit(uint64_t id, int total_tokens) {
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrFormat("request %d already admitted", id));
  }
  if (num_admitted() >= max_running_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("decode worker at its limit of %d requests", max_running_));
  }
  auto blocks = pool_.Allocate(BlocksFor(total_tokens));
  if (!blocks.ok()) return blocks.status();
  requests_[id].blocks = *blocks;
  return *blocks;
}

absl::Status DecodeScheduler::Start(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return absl::NotFoundError(absl::StrFormat("request %d not admitted", id));
  if (it->second.running) return absl::FailedPreconditionError("request already started");
  it->second.running = true;
  running_.push_back(id);
  return absl::OkStatus();
}

bool DecodeScheduler::Release(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  pool_.Free(it->second.blocks).IgnoreError();  // blocks came from Allocate: cannot fail
  if (it->second.running) std::erase(running_, id);
  requests_.erase(it);
  return true;
}

const std::vector<int>* DecodeScheduler::blocks(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second.blocks;
}

}  // namespace tandem
