#include "engine/scheduling/scheduler.h"

#include <algorithm>
#include <string>

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

DecodeScheduler::DecodeScheduler(Options options)
    : options_(options),
      cache_(options.num_blocks, KvTableLayout{options.block_size, options.group_window}),
      watermark_blocks_(options.watermark > 0 && options.admission == Admission::kOnDemand
                            ? std::max(1, static_cast<int>(options.watermark * options.num_blocks))
                            : 0) {}

absl::StatusOr<int> DecodeScheduler::MostTokens(uint64_t id, int prompt_tokens,
                                                int max_tokens) const {
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrFormat("request %d already admitted", id));
  }
  const int most_tokens = std::max(max_tokens, prompt_tokens + 1);
  if (cache_.layout().TokensIn(num_blocks()) < most_tokens) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the request may reach %d tokens (%d KV blocks of %d), more than the whole cache of %d "
        "blocks",
        most_tokens, cache_.layout().BlocksAt(most_tokens), block_size(), num_blocks()));
  }
  return most_tokens;
}

absl::StatusOr<std::vector<int>> DecodeScheduler::Admit(uint64_t id, int prompt_tokens,
                                                        int max_tokens) {
  absl::StatusOr<int> most = MostTokens(id, prompt_tokens, max_tokens);
  if (!most.ok()) return most.status();
  const int most_tokens = *most;
  if (!preempted_.empty()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "decode worker: %d preempted requests wait for room first", num_preempted()));
  }
  if (num_holding_places() >= options_.max_running) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("decode worker at its limit of %d requests", options_.max_running));
  }
  // Blocks taken now: those the first decode step reads, a sliding group's from its window on.
  // kReserve: also kept free are the most it may hold later and what the others may still claim.
  const bool reserve = options_.admission == Admission::kReserve;
  const int promised = reserve ? growth_promised() : 0;
  const int64_t need = reserve ? cache_.layout().PeakBlocks(most_tokens) + promised
                               : cache_.layout().BlocksHeld(prompt_tokens, prompt_tokens + 1);
  if (cache_.pool().num_available() - need < watermark_blocks_) {
    return reserve ? absl::ResourceExhaustedError(absl::StrFormat(
                         "decode worker: %d free KV blocks, %d of them promised to running "
                         "requests; the request may hold %d",
                         cache_.pool().num_available(), promised, need - promised))
                   : absl::ResourceExhaustedError(absl::StrFormat(
                         "decode worker: %d free KV blocks, the request needs %d and %d stay "
                         "free for growth",
                         cache_.pool().num_available(), need, watermark_blocks_));
  }
  std::vector<int> table;
  if (absl::Status s =
          GrowTable(cache_.layout(), &cache_.pool(), &table, prompt_tokens, prompt_tokens + 1);
      !s.ok()) {
    return s;
  }
  Entry& e = requests_[id];
  e.order = next_order_++;
  e.tokens = prompt_tokens;
  e.computed = prompt_tokens;
  e.max_tokens = most_tokens;
  e.blocks = std::move(table);
  return e.blocks;
}

absl::Status DecodeScheduler::Enqueue(uint64_t id, int prompt_tokens, int max_tokens) {
  if (prompt_tokens < 1)
    return absl::InvalidArgumentError("DecodeScheduler::Enqueue: empty prompt");
  absl::StatusOr<int> most = MostTokens(id, prompt_tokens, max_tokens);
  if (!most.ok()) return most.status();
  const int most_tokens = *most;
  if (num_holding_places() >= options_.max_running) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("at the limit of %d requests", options_.max_running));
  }
  Entry& e = requests_[id];
  e.order = next_order_++;
  e.state = State::kPreempted;
  e.tokens = prompt_tokens;
  e.computed = 0;
  e.max_tokens = most_tokens;
  preempted_.push_back(id);  // the newest: admission order
  return absl::OkStatus();
}

absl::Status DecodeScheduler::Start(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return absl::NotFoundError(absl::StrFormat("request %d not admitted", id));
  if (it->second.state != State::kAdmitted) {
    return absl::FailedPreconditionError("request already started");
  }
  it->second.state = State::kRunning;
  it->second.tokens += 1;  // the first token, sampled by the prefill
  InsertInOrder(running_, id);
  return absl::OkStatus();
}

void DecodeScheduler::InsertInOrder(std::vector<uint64_t>& ids, uint64_t id) const {
  const uint64_t order = requests_.at(id).order;
  ids.insert(std::lower_bound(ids.begin(), ids.end(), order,
                              [this](uint64_t r, uint64_t o) { return requests_.at(r).order < o; }),
             id);
}

uint64_t DecodeScheduler::Victim(const Step& step) const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    const bool scheduled =
        std::any_of(step.work.begin(), step.work.end(), [&](const Work& w) { return w.id == *it; });
    if (!scheduled) return *it;
  }
  return 0;
}

void DecodeScheduler::Preempt(uint64_t id, Entry& e) {
  FreeTable(&cache_.pool(), &e.blocks);
  e.computed = 0;
  e.state = State::kPreempted;
  std::erase(running_, id);
  InsertInOrder(preempted_, id);
  ++preemptions_;
}

DecodeScheduler::Step DecodeScheduler::Schedule() {
  Step step;
  // Readmission: the oldest preempted sequences first, while their tokens fit (what they hold
  // once recomputed; the recompute steps take the earlier windows they read as they go).
  while (!preempted_.empty() && static_cast<int>(running_.size()) < options_.max_batch) {
    const uint64_t id = preempted_.front();
    Entry& e = requests_.at(id);
    if (!GrowTable(cache_.layout(), &cache_.pool(), &e.blocks, e.tokens - 1, e.tokens).ok()) break;
    e.state = State::kRunning;
    preempted_.erase(preempted_.begin());
    InsertInOrder(running_, id);
  }
  int budget = options_.recompute_budget;
  const std::vector<uint64_t> order = running_;
  for (const uint64_t id : order) {
    const int step_left = options_.step_tokens - step.tokens;
    if (step_left <= 0) break;
    Entry& e = requests_.at(id);
    if (e.state != State::kRunning) continue;  // preempted for an older one in this step
    int n = e.tokens - e.computed;
    const bool recompute = n > 1;
    if (recompute) {  // under the step's recompute budget and the chunk cap
      n = std::min(n, budget);
      if (options_.chunk_size > 0) n = std::min(n, options_.chunk_size);
    }
    n = std::min(n, step_left);
    if (n <= 0) continue;
    const int need = MissingBlocks(cache_.layout(), e.blocks, e.computed, e.computed + n);
    while (need > cache_.pool().num_available() && e.state == State::kRunning) {
      const uint64_t victim = Victim(step);
      if (victim == 0) break;
      Preempt(victim, requests_.at(victim));
      step.preempted.push_back(victim);
    }
    if (e.state != State::kRunning) continue;  // it was the newest: it waits itself
    if (need > cache_.pool().num_available())
      continue;  // everything else is in this step: next one
    GrowTable(cache_.layout(), &cache_.pool(), &e.blocks, e.computed, e.computed + n)
        .IgnoreError();  // fits
    if (recompute) budget -= n;
    step.tokens += n;
    step.work.push_back({id, e.computed, n, e.computed + n == e.tokens});
  }
  return step;
}

int DecodeScheduler::Speculate(Step* step, size_t i, int k) {
  Work& w = step->work[i];
  if (k <= 0 || !w.sample || w.count != 1 || w.draft != 0) return 0;
  Entry& e = requests_.at(w.id);
  // The last proposal is fed at position start + k; none may reach past the request's most
  // tokens (the blocks reserved under kReserve).
  k = std::min(k, e.max_tokens - 1 - w.start - 1);
  // Nor past the step's token limit.
  k = std::min(k, options_.step_tokens - step->tokens);
  // kReserve: never from the blocks promised to the others (nor its own: a conservative bound,
  // as proposals reach past what a one-token step holds).
  const int free = cache_.pool().num_available() -
                   (options_.admission == Admission::kReserve ? growth_promised() : 0);
  while (k > 0 && MissingBlocks(cache_.layout(), e.blocks, w.start, w.start + 1 + k) > free) --k;
  if (k <= 0) return 0;
  if (!GrowTable(cache_.layout(), &cache_.pool(), &e.blocks, w.start, w.start + 1 + k).ok())
    return 0;
  w.count = 1 + k;
  w.draft = k;
  step->tokens += k;
  return k;
}

void DecodeScheduler::Complete(const Step& step, std::span<const int> kept) {
  for (size_t i = 0; i < step.work.size(); ++i) {
    const Work& w = step.work[i];
    auto it = requests_.find(w.id);
    if (it == requests_.end()) continue;
    Entry& e = it->second;
    if (w.draft == 0) {
      e.computed = w.start + w.count;
      if (w.sample) e.tokens += 1;
    } else {
      const int k = i < kept.size() ? std::clamp(kept[i], 0, w.draft) : 0;
      e.computed = w.start + 1 + k;  // the token and the proposals kept
      e.tokens += 1 + k;
      ShrinkTable(cache_.layout(), &cache_.pool(), &e.blocks, e.tokens);
    }
    // Blocks behind the sliding windows of the positions still to compute.
    TrimTable(cache_.layout(), &cache_.pool(), &e.blocks, e.computed);
  }
}

bool DecodeScheduler::Release(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  FreeTable(&cache_.pool(), &it->second.blocks);
  if (it->second.leaving) --num_leaving_;
  std::erase(running_, id);
  std::erase(preempted_, id);
  requests_.erase(it);
  return true;
}

void DecodeScheduler::MarkLeaving(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.leaving) return;
  it->second.leaving = true;
  ++num_leaving_;
}

const std::vector<int>* DecodeScheduler::blocks(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second.blocks;
}

int DecodeScheduler::tokens(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.tokens;
}

std::optional<DecodeScheduler::State> DecodeScheduler::state(uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  return it->second.state;
}

int DecodeScheduler::growth_promised() const {
  int64_t blocks = 0;
  for (const auto& [id, e] : requests_) {
    blocks += std::max<int64_t>(0, cache_.layout().PeakBlocks(e.max_tokens) - LiveBlocks(e.blocks));
  }
  return static_cast<int>(std::min<int64_t>(blocks, INT32_MAX));
}

absl::StatusOr<DecodeScheduler::Admission> ParseKvAdmission(std::string_view name) {
  if (name == "on-demand") return DecodeScheduler::Admission::kOnDemand;
  if (name == "reserve") return DecodeScheduler::Admission::kReserve;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--kv-admission must be on-demand or reserve, not \"%s\"", std::string(name)));
}

}  // namespace tandem
