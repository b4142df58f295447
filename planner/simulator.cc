#include "planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/kv_cache.h"
#include "planner/sim_internal.h"
#include "router/admission.h"
#include "router/registry.h"

namespace tandem::planner {
namespace sim_internal {

absl::Status Sim::Build() {
  if (absl::Status s = cluster_.Validate(); !s.ok()) return s;
  if (absl::Status s = profile_.Validate(); !s.ok()) return s;
  if (absl::Status s = model_.Validate(); !s.ok()) return s;
  const int max_tp = profile_.max_tp;
  if (cluster_.prefill_tp > max_tp || (!cluster_.colocated && cluster_.decode_tp > max_tp)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor-parallel degree above the profile's max_tp (%d) of %s", max_tp, profile_.name));
  }
  if (model_.n_heads % cluster_.prefill_tp != 0 ||
      (!cluster_.colocated && model_.n_heads % cluster_.decode_tp != 0)) {
    return absl::InvalidArgumentError("tensor-parallel degree must divide the model's n_heads");
  }
  prefill_profile_ = profile_.ForPrefill();
  prefill_cost_ = std::make_unique<CostModel>(model_, prefill_profile_, cluster_.prefill_tp);
  decode_profile_ = profile_.ForDecode();
  decode_cost_ = std::make_unique<CostModel>(
      model_, decode_profile_, cluster_.colocated ? cluster_.prefill_tp : cluster_.decode_tp);
  const int bs = cluster_.block_size;
  // Blocks a worker's cache holds: the explicit budget, the server's default on a shared host,
  // or the devices' memory after the weights.
  // A decode worker keeps a model that mixes sliding-window and global layers in layer groups,
  // a block per group (engine/kv/block_table.h), and lets the sliding groups' blocks go behind
  // the window; a prefill worker holds whole prompts, counted in blocks of every layer.
  const KvCacheSpec decode_spec = KvCacheSpec::For(model_, bs, DType::kF32);
  auto blocks_for = [&](const CostModel& cost, double explicit_bytes, const char* role,
                        int groups) -> absl::StatusOr<int> {
    double bytes = explicit_bytes;
    if (bytes <= 0) {
      bytes = profile_.shared_host ? double(int64_t{1} << 30) : cost.KvCapacityBytes();
    }
    if (bytes <= 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the %s worker's weights (%.1f GB per device at tp %d) leave no room for KV on %s", role,
          cost.WeightBytesPerDevice() / 1e9, cost.tp(), profile_.name));
    }
    const double blocks = std::floor(bytes / (cost.KvBytesPerToken() * bs / groups));
    return static_cast<int>(std::min(blocks, double(1 << 22)));
  };
  auto pblocks = blocks_for(*prefill_cost_, cluster_.prefill_kv_bytes, "prefill", 1);
  if (!pblocks.ok()) return pblocks.status();
  auto dblocks =
      blocks_for(*decode_cost_, cluster_.decode_kv_bytes, "decode", decode_spec.n_groups());
  if (!dblocks.ok()) return dblocks.status();
  if (*pblocks < (model_.max_seq_len + bs - 1) / bs) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("the prefill KV cache (%d blocks) cannot hold one %d-token prompt",
                        *pblocks, model_.max_seq_len));
  }
  if (*dblocks < 1) return absl::ResourceExhaustedError("the decode KV cache holds no block");
  const int instances = cluster_.prefill;
  const int decoders = cluster_.colocated ? cluster_.prefill : cluster_.decode;
  int next_device = 0;
  for (int i = 0; i < instances; ++i) {
    Worker w;
    w.name = absl::StrFormat("prefill-%d", i);
    w.prefill = true;
    w.cost = prefill_cost_.get();
    w.prefill_scheduler = std::make_unique<PrefillScheduler>(cluster_.prefill_scheduler);
    w.pool = std::make_unique<KvCacheManager>(*pblocks, KvTableLayout{cluster_.block_size, {}});
    w.device = profile_.shared_host ? 0 : next_device++;
    workers_.push_back(std::move(w));
  }
  for (int i = 0; i < decoders; ++i) {
    Worker w;
    w.name = absl::StrFormat("decode-%d", i);
    w.prefill = false;
    w.cost = decode_cost_.get();
    w.decode_scheduler = std::make_unique<DecodeScheduler>(DecodeScheduler::Options{
        *dblocks, bs, cluster_.max_running, cluster_.decode_watermark, cluster_.recompute_budget,
        DecodeScheduler::Admission::kOnDemand, decode_spec.group_window});
    w.device = profile_.shared_host ? 0 : cluster_.colocated ? workers_[i].device : next_device++;
    workers_.push_back(std::move(w));
  }
  // One processor for everything (host_cores > 0), or the steps' lane and the request path's.
  const bool one_cpu = profile_.shared_host && profile_.host_cores > 0;
  path_device_ = one_cpu ? 0 : 1;
  if (profile_.shared_host && profile_.relay_cpu > 0) {
    Worker relay;
    relay.name = "relay";
    relay.relay = true;
    relay.prefill = false;
    relay.device = path_device_;
    relay_ = static_cast<int>(workers_.size());
    workers_.push_back(std::move(relay));
  }
  devices_.resize(std::max(1, next_device));
  if (one_cpu) {
    // Device 0: the host's cores, shared by the steps, the hops and the relay.
    devices_.assign(1, Device{});
    devices_[0].capacity = profile_.host_cores;
    step_cores_ = profile_.step_threads;
    prefill_cores_ = profile_.prefill_threads;
    devices_[0].yield = profile_.prefill_yield;
  } else if (profile_.shared_host) {
    // Device 0: the workers' steps, `host_step_slots` at a time at their calibrated speed.
    // Device 1: the request path's CPU work (RPC hops, the token relay), one at a time.
    devices_.assign(2, Device{});
    devices_[0].capacity = profile_.host_step_slots;
  }
  for (const Worker& w : workers_) {
    if (w.relay) continue;
    if (absl::Status s = registry_.Register(
            w.name, w.prefill ? WorkerRole::kPrefill : WorkerRole::kDecode, w.name, Load(w), At(0));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

WorkerLoadSnapshot Sim::Load(const Worker& w) const {
  WorkerLoadSnapshot l;
  l.block_size = cluster_.block_size;
  if (w.prefill) {
    l.queue_depth = w.prefill_scheduler->num_waiting();
    l.running = w.prefill_jobs;
    l.free_blocks = w.pool->num_available();
    l.total_blocks = w.pool->num_blocks();
  } else {
    const DecodeScheduler& d = *w.decode_scheduler;
    l.running = static_cast<int>(d.running().size());
    l.queue_depth = d.num_admitted() - l.running;
    l.free_blocks = d.num_free_blocks();
    l.total_blocks = d.num_blocks();
    l.kv_group_window = d.layout().group_window;
  }
  return l;
}

void Sim::AddRequests(std::vector<TimedRequest> items, const bench::BenchConfig* workload) {
  workload_ = workload;
  rng_.seed(options_.noise_seed != 0 ? options_.noise_seed * 0x9e3779b97f4a7c15ull
            : workload != nullptr    ? workload->seed ^ 0x1a77e2
                                     : 1);
  for (size_t i = 0; i < items.size(); ++i) {
    Request r;
    r.item = std::move(items[i]);
    r.id = i + 1;
    requests_.push_back(std::move(r));
    result_.records.emplace_back();
    bench::RequestRecord& rec = result_.records.back();
    rec.id = static_cast<int>(i);
    rec.prompt_tokens = static_cast<int>(requests_.back().item.prompt.size());
  }
  if (workload == nullptr) {  // explicit send times
    for (size_t i = 0; i < requests_.size(); ++i) Push(requests_[i].item.send, Kind::kSend, i);
    return;
  }
  const int total = static_cast<int>(requests_.size());
  const int warmup = std::min(workload->warmup, total);
  for (int i = 0; i < warmup; ++i) {
    requests_[i].warmup = true;
    result_.records[i].warmup = true;
  }
  if (warmup > 0) {
    pools_.push_back({0, warmup, 0, false});
    StartPool(0, 0);
  }
  if (workload->rate > 0) {
    open_from_ = warmup;
    if (warmup == 0) StartPool(-1, 0);
  } else {
    pools_.push_back({warmup, total, 0, true});
    if (warmup == 0) StartPool(static_cast<int>(pools_.size()) - 1, 0);
  }
}

// Starts a closed pool's clients at `t`, or (pool -1) schedules the open-loop sends from `t`.
void Sim::StartPool(int pool, double t) {
  if (pool < 0 || pools_[pool].measured) measure_start_ = t;
  if (pool < 0) {
    bench::ArrivalProcess arrivals(workload_->arrival, workload_->rate, workload_->burstiness,
                                   workload_->seed ^ 0x5eed);
    const double start = t;
    double next = t;
    for (int i = open_from_; i < static_cast<int>(requests_.size()); ++i) {
      // `tandem bench` checks the duration before waiting for the next send.
      if (workload_->duration > 0 && next - start >= workload_->duration) break;
      next += arrivals.NextGap();
      requests_[i].item.send = next;
      Push(next, Kind::kSend, i);
    }
    return;
  }
  ClosedPool& p = pools_[pool];
  const int threads =
      p.measured ? std::max(1, workload_->concurrency)
                 : std::min(std::max(1, workload_->concurrency), std::max(1, p.end - p.next));
  p.outstanding = 0;
  for (int k = 0; k < threads && p.next < p.end; ++k) {
    const int i = p.next++;
    requests_[i].pool = pool;
    requests_[i].item.send = t;
    ++p.outstanding;
    Push(t, Kind::kSend, i);
  }
}

// Admission on a decode worker, as the router does (router/admission.h): a request no worker's
// whole cache can hold is refused; one that finds room goes on to its prefill; the others wait in
// line, first come first admitted (refused when the line is full), and look again whenever a
// request ends or a heartbeat brings the workers' load.
void Sim::Send(int r) {
  result_.records[r].sent = now_;
  if (line_.MayLook(0) && AdmitDecode(r)) return;
  const std::optional<uint64_t> ticket = line_.Join();
  if (!ticket) {
    End(r, now_, kResourceExhausted);
    return;
  }
  waiting_[*ticket] = r;
}

// The router's look for room: the registry's pick, then the worker's own check; a refusal tries
// the next worker. True when the request is admitted (its prefill hop started) or refused for
// good (ended); false when it must wait.
bool Sim::AdmitDecode(int r) {
  Request& q = requests_[r];
  const int prompt_len = static_cast<int>(q.item.prompt.size());
  const int total_tokens = static_cast<int>(
      std::min<int64_t>(int64_t{prompt_len} + q.item.output_tokens, model_.max_seq_len));
  if (NeverFits(registry_.LargestDecodeTokens(At(now_)), total_tokens)) {
    End(r, now_, kResourceExhausted);
    return true;
  }
  std::set<std::string> tried;
  for (int attempt = 0; attempt < cluster_.decode_attempts; ++attempt) {
    auto pick = registry_.PickDecode(prompt_len, total_tokens, At(now_), tried);
    if (!pick) break;
    tried.insert(*pick);
    int w = 0;
    while (workers_[w].name != *pick) ++w;
    if (workers_[w].decode_scheduler->Admit(q.id, prompt_len, total_tokens).ok()) {
      q.decode_worker = w;
      break;
    }
  }
  if (q.decode_worker < 0) return false;
  StartHop(now_, profile_.request_overhead / 2, Jitter(profile_.request_jitter),
           Kind::kPrefillEnqueue, r);
  return true;
}

// The line's front looks for room until one must wait.
void Sim::AdmitWaiting() {
  if (admitting_) return;
  admitting_ = true;
  while (const uint64_t ticket = line_.front()) {
    const int r = waiting_.at(ticket);
    if (!AdmitDecode(r)) break;
    line_.Leave(ticket);
    waiting_.erase(ticket);
  }
  admitting_ = false;
}

void Sim::EnqueuePrefill(int r) {
  Request& q = requests_[r];
  const std::vector<int>& prompt = q.item.prompt;
  const int len = static_cast<int>(prompt.size());
  const int bs = cluster_.block_size;
  const std::vector<uint64_t>& full = BlockHashes(q);
  // The router hashes the blocks before the prompt's last token, as the engine looks them up.
  std::vector<uint64_t> hashes;
  if (const int rbs = registry_.PrefillBlockSize(); rbs == bs) {
    hashes.assign(full.begin(), full.begin() + (len - 1) / bs);
  } else if (rbs > 0) {
    hashes = PrefixBlockHashes(prompt, rbs, (len - 1) / rbs);
  }
  int w = 0;
  if (cluster_.colocated) {
    // One process serves the request end to end: its own prefill loop.
    w = q.decode_worker - cluster_.prefill;
  } else {
    auto pick = registry_.PickPrefill(hashes, At(now_), {});
    while (workers_[w].name != *pick) ++w;  // every prefill worker is always healthy here
  }
  q.prefill_worker = w;
  if (TakePrefillBlocks(r, w)) return;
  // As the engine does: wait for the prompts that hold the pool (an empty one holds any prompt).
  if (workers_[w].prefill_jobs > 0) {
    workers_[w].waiting_blocks.push_back(r);
  } else {
    End(r, now_, kResourceExhausted);
  }
}

// The prefill engine's admission: prefix-cache hits, then fresh blocks; false, with nothing
// taken, when the pool is short.
bool Sim::TakePrefillBlocks(int r, int w) {
  Request& q = requests_[r];
  Worker& pw = workers_[w];
  const int len = static_cast<int>(q.item.prompt.size());
  const int bs = cluster_.block_size;
  const std::vector<uint64_t>& full = BlockHashes(q);
  if (cluster_.prefix_cache) {
    // The blocks before the prompt's last token, as the engine looks them up.
    KvCacheManager::Prefix hit = pw.pool->MatchPrefix(
        q.item.prompt, std::span<const uint64_t>(full).first(static_cast<size_t>((len - 1) / bs)));
    q.blocks = std::move(hit.blocks);
    q.cached = hit.tokens;
  }
  const int needed = (len + bs - 1) / bs - static_cast<int>(q.blocks.size());
  auto fresh = pw.pool->Allocate(needed);
  if (!fresh.ok()) {
    pw.pool->Free(q.blocks).IgnoreError();
    q.blocks.clear();
    q.cached = 0;
    return false;
  }
  q.blocks.insert(q.blocks.end(), fresh->begin(), fresh->end());
  pw.prefill_scheduler->Add(q.id, len, q.cached).IgnoreError();  // ids are unique
  ++pw.prefill_jobs;
  Wake(w);
  return true;
}

void Sim::FirstToken(int r) {
  Request& q = requests_[r];
  if (q.ended) return;
  bench::RequestRecord& rec = result_.records[r];
  rec.first_token = now_;
  if (options_.record_token_times) rec.token_times.push_back(now_);
  rec.output_tokens = 1;
  q.generated = 1;
  if (q.item.output_tokens <= 1) {
    End(r, now_, 0);
    return;
  }
  // The router's start message reaches the decode worker, whose loop picks the request up. A
  // loop asleep (no running request) wakes up late by the decode-start jitter; a running one
  // takes the request at its next step (on the machine the first gap's p50 was 0.8 ms at 12
  // requests/s against 1.9 ms alone).
  const Worker& dw = workers_[q.decode_worker];
  const double jitter = Jitter(profile_.decode_start_jitter);
  const bool asleep = !dw.busy && dw.decode_scheduler->running().empty();
  StartHop(now_, profile_.decode_start_overhead, asleep ? jitter : 0.0, Kind::kDecodeStart, r);
}

void Sim::StartHop(double start, double cpu, double latency, Kind next, int r) {
  if (options_.zero_cost) {
    cpu = latency = 0;
    start = now_;
  }
  if (!profile_.shared_host || cpu <= 0) {  // a GPU cluster's hops: latency only
    const double t = start + cpu + latency;
    if (t > now_) {
      Push(t, next, r);
    } else if (next == Kind::kDecodeStart) {
      DecodeStart(r);
    } else {
      Push(now_, next, r);
    }
    return;
  }
  hops_.push_back({cpu, latency, next, r});
  const int h = static_cast<int>(hops_.size()) - 1;
  if (start > now_) {
    Push(start, Kind::kHopStart, h);
  } else {
    HopStart(h);
  }
}

void Sim::HopStart(int h) {
  Device& d = devices_[path_device_];  // shared host: the request path
  Advance(d);
  d.Add({-1 - h, 1, false});
  Reschedule(path_device_);
}

void Sim::DecodeStart(int r) {
  Request& q = requests_[r];
  if (q.ended) return;
  workers_[q.decode_worker].decode_scheduler->Start(q.id).IgnoreError();
  Wake(q.decode_worker);
}

// Ends request `r` at `t`: frees its decode blocks (the router closes the decode stream) and
// lets its closed-loop client send the next one.
void Sim::End(int r, double t, int status) {
  Request& q = requests_[r];
  if (q.ended) return;
  q.ended = true;
  ++ended_;
  bench::RequestRecord& rec = result_.records[r];
  rec.done = t;
  rec.status_code = status;
  if (status != 0) rec.status_message = "simulated: no room";
  if (q.decode_worker >= 0) workers_[q.decode_worker].decode_scheduler->Release(q.id);
  AdmitWaiting();
  if (q.pool >= 0) {
    ClosedPool& p = pools_[q.pool];
    --p.outstanding;
    const bool out_of_time =
        p.measured && workload_->duration > 0 && t - measure_start_ >= workload_->duration;
    if (p.next < p.end && !out_of_time) {
      const int i = p.next++;
      requests_[i].pool = q.pool;
      requests_[i].item.send = t;
      ++p.outstanding;
      Push(t, Kind::kSend, i);
    } else if (p.outstanding == 0 && !p.measured) {
      // The warm-up is over: measurement starts now.
      const int next = q.pool + 1;
      if (workload_->rate > 0) {
        StartPool(-1, t);
      } else if (next < static_cast<int>(pools_.size())) {
        StartPool(next, t);
      }
    }
  }
}

void Sim::Heartbeat() {
  heartbeat_pending_ = false;
  for (const Worker& w : workers_) {
    if (!w.relay) registry_.Heartbeat(w.name, Load(w), true, At(now_));
  }
  AdmitWaiting();
  if (ended_ < static_cast<int>(requests_.size())) {
    heartbeat_pending_ = true;
    Push(now_ + cluster_.heartbeat_interval, Kind::kHeartbeat, 0);
  }
}

bool Sim::PopEvent(Event* e) {
  Device* first = nullptr;  // the device whose task ends first
  for (Device& d : devices_) {
    if (d.done_pending && (first == nullptr || first->done > d.done)) first = &d;
  }
  if (first != nullptr && (events_.empty() || events_.top() > first->done)) {
    first->done_pending = false;
    *e = first->done;
    return true;
  }
  if (events_.empty()) return false;
  *e = events_.top();
  events_.pop();
  return true;
}

absl::Status Sim::Run() {
  Push(cluster_.heartbeat_interval, Kind::kHeartbeat, 0);
  heartbeat_pending_ = true;
  Event e;
  while (PopEvent(&e)) {
    if (++result_.events > options_.max_events) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("simulation stopped after %d events", options_.max_events));
    }
    now_ = e.t;
    switch (e.kind) {
      case Kind::kSend:
        Send(e.a);
        break;
      case Kind::kPrefillEnqueue:
        EnqueuePrefill(e.a);
        break;
      case Kind::kFirstToken:
        FirstToken(e.a);
        break;
      case Kind::kDecodeStart:
        DecodeStart(e.a);
        break;
      case Kind::kHopStart:
        HopStart(e.a);
        break;
      case Kind::kDeviceDone:
        DeviceDone(e.a);
        break;
      case Kind::kHeartbeat:
        Heartbeat();
        break;
      case Kind::kStepStart:
        StepStart(e.a);
        break;
    }
    if (ended_ == static_cast<int>(requests_.size()) && !heartbeat_pending_) break;
  }
  // Requests never sent (the duration limit) are not records, as in `tandem bench`.
  std::vector<bench::RequestRecord> kept;
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i].ended) kept.push_back(std::move(result_.records[i]));
  }
  result_.records = std::move(kept);
  for (const Worker& w : workers_) {
    if (w.relay) continue;
    const bool idle = w.prefill ? w.prefill_scheduler->empty() && w.pool->NoneInUse()
                                : w.decode_scheduler->Idle();
    if (!idle) return absl::InternalError(absl::StrFormat("%s not idle at the end", w.name));
  }
  return absl::OkStatus();
}

SimResult Sim::TakeResult(const bench::Slo& slo) {
  result_.summary = bench::Summarize(result_.records, slo);
  result_.mean_decode_batch = result_.decode_steps > 0 ? batch_sum_ / result_.decode_steps : 0;
  return std::move(result_);
}

}  // namespace sim_internal

using sim_internal::Sim;

absl::StatusOr<SimResult> Simulate(const ModelConfig& model, const HardwareProfile& profile,
                                   const ClusterSpec& cluster, const bench::BenchConfig& workload,
                                   const SimOptions& options) {
  bench::BenchConfig w = workload;
  if (w.router.empty()) w.router = "simulated";
  if (absl::Status s = w.Validate(); !s.ok()) return s;
  auto items = bench::BuildWorkload(w, model.vocab_size, model.max_seq_len);
  if (!items.ok()) return items.status();
  std::vector<TimedRequest> requests;
  for (auto& item : *items) {
    if (item.prompt.empty()) {
      return absl::InvalidArgumentError(
          "the simulator needs token counts: trace lines with \"prompt\" text are not supported, "
          "use \"prompt_tokens\"");
    }
    requests.push_back({0, std::move(item.prompt), item.output_tokens});
  }
  Sim sim(model, profile, cluster, options);
  if (absl::Status s = sim.Build(); !s.ok()) return s;
  sim.AddRequests(std::move(requests), &w);
  if (absl::Status s = sim.Run(); !s.ok()) return s;
  return sim.TakeResult(w.slo);
}

absl::StatusOr<SimResult> SimulateRequests(const ModelConfig& model, const HardwareProfile& profile,
                                           const ClusterSpec& cluster,
                                           std::vector<TimedRequest> requests,
                                           const bench::Slo& slo, const SimOptions& options) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty() || r.output_tokens < 1 || !(r.send >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("requests[%d]: needs a prompt, output_tokens >= 1 and send >= 0", i));
    }
    if (static_cast<int64_t>(r.prompt.size()) + r.output_tokens > model.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "requests[%d]: prompt + output_tokens exceed the context of %d", i, model.max_seq_len));
    }
  }
  Sim sim(model, profile, cluster, options);
  if (absl::Status s = sim.Build(); !s.ok()) return s;
  sim.AddRequests(std::move(requests), nullptr);
  if (absl::Status s = sim.Run(); !s.ok()) return s;
  return sim.TakeResult(slo);
}

}  // namespace tandem::planner
