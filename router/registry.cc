#include "router/registry.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_format.h"

namespace tandem {

namespace {

// A load claim within the registered capacity.
WorkerLoadSnapshot Clamp(const WorkerLoadSnapshot& claim, const WorkerLoadSnapshot& registered) {
  WorkerLoadSnapshot l = claim;
  l.total_blocks = registered.total_blocks;
  l.block_size = registered.block_size;
  l.kv_group_window = registered.kv_group_window;
  l.free_blocks = std::clamp(claim.free_blocks, 0, registered.total_blocks);
  l.growth_blocks = std::max(0, claim.growth_blocks);
  l.watermark_blocks = std::clamp(claim.watermark_blocks, 0, registered.total_blocks);
  l.running = std::max(0, claim.running);
  l.queue_depth = std::max(0, claim.queue_depth);
  return l;
}

// "HOST" of "HOST:PORT", "[V6]:PORT", "tcp://HOST:PORT" or "nccl://HOST:PORT"; "" for others.
std::string HostOf(std::string_view address) {
  for (std::string_view scheme : {"tcp://", "nccl://"}) {
    if (address.starts_with(scheme)) address.remove_prefix(scheme.size());
  }
  if (address.find("://") != std::string_view::npos) return "";
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return "";
  std::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

}  // namespace

absl::Status WorkerRegistry::Register(const std::string& id, WorkerRole role,
                                      const std::string& address, const WorkerLoadSnapshot& load,
                                      absl::Time now, const Credentials& credentials) {
  // A decode worker receives KV on its own host: an endpoint elsewhere would have prefill
  // workers send prompts to an address of the registrant's choosing.
  const std::string kv_host = HostOf(credentials.kv_endpoint);
  if (!kv_host.empty() && kv_host != HostOf(address)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv_endpoint: %s is not on the worker's host (%s)", credentials.kv_endpoint, address));
  }
  auto existing = workers_.find(id);
  if (existing != workers_.end()) {
    const WorkerEntry& old = existing->second;
    const bool alive = now - old.last_seen <= options_.heartbeat_timeout;
    if (alive && (old.address != address || old.identity != credentials.identity)) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "worker_id: \"%s\" is registered by a live worker at %s; a worker id cannot be taken "
          "over until its worker is gone (silent for %s)",
          id, old.address, absl::FormatDuration(options_.heartbeat_timeout)));
    }
  }
  WorkerEntry& w = workers_[id];
  if (w.address != address || w.role != role) {
    w.prefixes.clear();
    w.prefix_order.clear();
  }
  w.id = id;
  w.role = role;
  w.address = address;
  w.identity = credentials.identity;
  w.kv_endpoint = credentials.kv_endpoint;
  w.registered = load;
  w.registered.total_blocks = std::max(0, load.total_blocks);
  w.registered.block_size = std::max(0, load.block_size);
  // A layout the router cannot use counts as one full-attention group.
  const std::vector<int>& groups = load.kv_group_window;
  if (groups.size() > 1024 ||
      std::any_of(groups.begin(), groups.end(), [](int g) { return g < 0; })) {
    w.registered.kv_group_window.clear();
  }
  w.load = Clamp(load, w.registered);
  w.last_seen = now;
  w.serving = true;
  w.consecutive_failures = 0;
  w.ejected_until = absl::InfinitePast();
  return absl::OkStatus();
}

WorkerRegistry::KvConflict WorkerRegistry::FindKvConflict(const std::string& id,
                                                          const std::string& kv_transport,
                                                          const std::string& kv_dtype) const {
  auto differs = [](const std::string& mine, const std::string& theirs) {
    return !mine.empty() && !theirs.empty() && mine != theirs;
  };
  for (const auto& [other_id, w] : workers_) {
    if (other_id == id) continue;
    if (differs(kv_transport, w.kv_transport)) return {&w, "kv_transport"};
    if (differs(kv_dtype, w.kv_dtype)) return {&w, "kv_dtype"};
  }
  return {};
}

void WorkerRegistry::SetKvSettings(const std::string& id, const std::string& kv_transport,
                                   const std::string& kv_dtype) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.kv_transport = kv_transport;
  it->second.kv_dtype = kv_dtype;
}

bool WorkerRegistry::Heartbeat(const std::string& id, const WorkerLoadSnapshot& load, bool serving,
                               absl::Time now, bool draining, const std::string& identity) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.identity != identity) return false;
  it->second.load = Clamp(load, it->second.registered);
  it->second.last_seen = now;
  it->second.serving = serving;
  it->second.draining_ = draining;
  return true;
}

bool WorkerRegistry::Healthy(const WorkerEntry& w, absl::Time now) const {
  return w.serving && now - w.last_seen <= options_.heartbeat_timeout && now >= w.ejected_until;
}

std::vector<const WorkerEntry*> WorkerRegistry::List() const {
  std::vector<const WorkerEntry*> out;
  for (const auto& [id, w] : workers_) out.push_back(&w);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->id < b->id; });
  return out;
}

int WorkerRegistry::CountHealthy(WorkerRole role, absl::Time now) const {
  int n = 0;
  for (const auto& [id, w] : workers_) n += w.role == role && Healthy(w, now);
  return n;
}

const WorkerEntry* WorkerRegistry::Find(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::optional<std::string> WorkerRegistry::PickDecode(int prompt_tokens, int max_tokens,
                                                      absl::Time now,
                                                      const std::set<std::string>& exclude) {
  WorkerEntry* best = nullptr;
  int best_needed = 0;
  int64_t best_promised = 0;  // under reserve: the rest of the request's peak
  auto headroom = [](const WorkerEntry& w) { return w.load.free_blocks - w.load.growth_blocks; };
  for (auto& [id, w] : workers_) {
    if (w.role != WorkerRole::kDecode || !Healthy(w, now) || exclude.count(id)) continue;
    // The blocks the worker's admission takes (DecodeScheduler::Admit) and what must stay free
    // beside them (the watermark; under reserve, the growth promised and the request's own),
    // and its whole cache.
    const KvTableLayout layout = w.load.kv_layout();
    const int needed = static_cast<int>(
        std::min<int64_t>(layout.BlocksHeld(prompt_tokens, prompt_tokens + 1), INT32_MAX));
    int64_t most = 0;
    if (w.load.reserves_max_tokens) {
      most = layout.PeakBlocks(std::max(max_tokens, prompt_tokens + 1));
      if (w.load.free_blocks - w.load.growth_blocks < most) continue;
    } else if (w.load.free_blocks - w.load.watermark_blocks < needed) {
      continue;
    }
    if (layout.TokensIn(w.load.total_blocks) < max_tokens) continue;
    if (best == nullptr || std::make_tuple(-headroom(w), w.load.running, w.id) <
                               std::make_tuple(-headroom(*best), best->load.running, best->id)) {
      best = &w;
      best_needed = needed;
      best_promised = most > 0 ? most - needed : 0;
    }
  }
  if (best == nullptr) return std::nullopt;
  best->load.free_blocks -= best_needed;
  best->load.growth_blocks += static_cast<int>(std::min<int64_t>(best_promised, INT32_MAX));
  ++best->load.running;
  return best->id;
}

int64_t WorkerRegistry::LargestDecodeTokens(absl::Time now) const {
  int64_t most = 0;
  for (const auto& [id, w] : workers_) {
    if (w.role != WorkerRole::kDecode || !Healthy(w, now)) continue;
    most = std::max(most, w.load.kv_layout().TokensIn(w.load.total_blocks));
  }
  return most;
}

std::optional<std::string> WorkerRegistry::PickPrefill(std::span<const uint64_t> block_hashes,
                                                       absl::Time now,
                                                       const std::set<std::string>& exclude) {
  WorkerEntry* best = nullptr;
  size_t best_match = 0;
  for (auto& [id, w] : workers_) {
    if (w.role != WorkerRole::kPrefill || !Healthy(w, now) || exclude.count(id)) continue;
    size_t match = 0;
    while (match < block_hashes.size() && w.prefixes.contains(block_hashes[match])) ++match;
    if (best == nullptr ||
        std::make_tuple(-static_cast<int64_t>(match), w.load.queue_depth, w.load.running, w.id) <
            std::make_tuple(-static_cast<int64_t>(best_match), best->load.queue_depth,
                            best->load.running, best->id)) {
      best = &w;
      best_match = match;
    }
  }
  if (best == nullptr) return std::nullopt;
  ++best->load.queue_depth;
  for (uint64_t h : block_hashes) {
    if (best->prefixes.insert(h).second) best->prefix_order.push_back(h);
  }
  while (best->prefix_order.size() > options_.max_prefixes_per_worker) {
    best->prefixes.erase(best->prefix_order.front());
    best->prefix_order.pop_front();
  }
  return best->id;
}

int WorkerRegistry::PrefillBlockSize() const {
  for (const auto& [id, w] : workers_) {
    if (w.role == WorkerRole::kPrefill && w.load.block_size > 0) return w.load.block_size;
  }
  return 0;
}

std::vector<WorkerEntry> WorkerRegistry::ForgetSilent(absl::Time now) {
  std::vector<WorkerEntry> forgotten;
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (now - it->second.last_seen > options_.forget_after) {
      forgotten.push_back(std::move(it->second));
      workers_.erase(it++);
    } else {
      ++it;
    }
  }
  std::sort(forgotten.begin(), forgotten.end(),
            [](const WorkerEntry& a, const WorkerEntry& b) { return a.id < b.id; });
  return forgotten;
}

void WorkerRegistry::ReportFailure(const std::string& id, absl::Time now) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  WorkerEntry& w = it->second;
  if (++w.consecutive_failures >= options_.max_consecutive_failures) {
    // Never eject the last healthy worker of a role: with nowhere else to go, a flaky worker
    // beats none (as Envoy's max ejection percent).
    if (Healthy(w, now) && CountHealthy(w.role, now) <= 1) return;
    absl::Duration backoff = options_.ejection;
    for (int i = 0; i < w.ejections && backoff < options_.max_ejection; ++i) backoff *= 2;
    w.ejected_until = now + std::min(backoff, options_.max_ejection);
    w.consecutive_failures = 0;
    ++w.ejections;
  }
}

void WorkerRegistry::ReportSuccess(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.consecutive_failures = 0;
  it->second.ejections = 0;
}

}  // namespace tandem
