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
#include "router/admission.h"
#include "router/registry.h"

namespace tandem::planner {

namespace {

constexpr int kResourceExhausted = 8;  // gRPC status codes, as the bench records them

enum class Kind {
  kSend,
  kPrefillEnqueue,
  kFirstToken,
  kDecodeStart,
  kHopStart,
  kDeviceDone,
  kHeartbeat,
  kStepStart
};

struct Event {
  double t;
  int priority;  // at equal times, a worker starts its next step after everything else
  uint64_t seq;
  Kind kind;
  int a;  // request index, worker or device
  bool operator>(const Event& o) const {
    return std::tie(t, priority, seq) > std::tie(o.t, o.priority, o.seq);
  }
};

struct Request {
  TimedRequest item;
  uint64_t id = 0;
  bool warmup = false;
  int pool = -1;  // closed-loop pool whose next send this request's end triggers (-1: none)
  int prefill_worker = -1, decode_worker = -1;
  std::vector<int> blocks;  // on the prefill worker
  // The chained hashes of the prompt's full blocks (HashBlockTokens over the cluster's block
  // size), computed once: the router, the prefix cache's lookup and its registration each walk
  // them, and hashing 1024-token prompts three times was a third of a plan's search.
  std::vector<uint64_t> block_hashes;
  int cached = 0;
  bool cached_sent = false;
  int generated = 0;
  bool ended = false;
};

struct Worker {
  std::string name;
  bool prefill = true;
  bool relay = false;  // the router's token relay on a shared host (not a registered worker)
  // Relay: the decode steps' tokens waiting to reach the clients, in order (request indices),
  // and the step in progress.
  std::deque<std::vector<int>> relay_queue;
  std::vector<int> relaying;
  int device = 0;
  const CostModel* cost = nullptr;
  std::unique_ptr<PrefillScheduler> prefill_scheduler;
  std::unique_ptr<BlockPool> pool;  // prefill: the prefix cache's blocks
  int prefill_jobs = 0;
  std::deque<int> waiting_blocks;  // prefill: requests waiting for blocks other prompts hold
  std::unique_ptr<DecodeScheduler> decode_scheduler;
  bool busy = false;
  bool sampling = false;  // a decode step past its forward pass (HardwareProfile::sample_cpu)
  bool start_pending = false;
  double remaining = 0;  // seconds of work left at the full device's speed
  double step_start = 0;
  double step_alone = 0;  // the step's seconds on its device alone
  StepTrace step;
  std::vector<int> step_requests;  // request indices of the step, in order
  std::vector<int> step_kept;      // decode: proposals each work keeps (speculative decoding)
  int transfer_tokens = 0;
  double link_free = 0;
};

// A hop of the request path (an RPC and the thread that handles it). On a shared host it is CPU
// work on the host, slowed by whatever else runs there; then `latency` more (the jitter), then
// the event `next` of request `r`.
struct Hop {
  double remaining = 0;
  double latency = 0;
  Kind next = Kind::kPrefillEnqueue;
  int r = 0;
};

// A piece of work on a device: a worker's step (id >= 0) or a hop (-1 - index into Sim::hops_),
// how many cores (threads) it keeps busy, and whether it is served first (prefill steps on a
// one-processor host).
struct Task {
  int id = 0;
  double cores = 1;
  bool first = false;
};

struct Device {
  std::vector<Task> active;
  // The cores. The tasks served first share all of them, giving way to the others by `yield`
  // (0: not at all; 1: an equal share per core asked); the others share what those leave.
  // Within each class, while the tasks ask for no more than they have, each runs at full
  // speed; beyond, every one slows by cores / asked (processor sharing, fair per thread).
  double capacity = 1;
  double yield = 0;
  double asked_first = 0, asked = 0;  // the cores `active` asks for, by class
  double FirstRate() const {
    const double demand = asked_first + yield * asked;
    return demand <= capacity ? 1.0 : capacity / demand;
  }
  double Rate(const Task& t) const {
    if (t.first) return FirstRate();
    const double left = std::max(0.0, capacity - FirstRate() * asked_first);
    return asked <= left ? 1.0 : left / asked;
  }
  void Add(const Task& t) {
    active.push_back(t);
    (t.first ? asked_first : asked) += t.cores;
  }
  // Takes out the tasks `done` says are finished, in order.
  template <typename Done>
  std::vector<int> Remove(Done done) {
    std::vector<int> out;
    std::vector<Task> kept;
    asked_first = asked = 0;
    for (const Task& t : active) {
      if (done(t.id)) {
        out.push_back(t.id);
      } else {
        kept.push_back(t);
        (t.first ? asked_first : asked) += t.cores;
      }
    }
    active = std::move(kept);
    return out;
  }
  double last = 0;
  // The next of its tasks to finish, if any: an event kept here rather than in the queue, as
  // every change of the active set retimes it (queued, a third of a shared host's events were
  // such retimed, dead ones). Ordered against the queue's events as one of them.
  bool done_pending = false;
  Event done{};  // kind kDeviceDone, priority 0
};

// A closed loop: `threads` clients, each sending the next index of [next, end) when its previous
// request ends.
struct ClosedPool {
  int next = 0, end = 0;
  int outstanding = 0;
  bool measured = false;
};

class Sim {
 public:
  Sim(const ModelConfig& model, const HardwareProfile& profile, const ClusterSpec& cluster,
      const SimOptions& options)
      : model_(model),
        profile_(profile),
        cluster_(cluster),
        options_(options),
        link_(cluster.link.value_or(profile.kv_link)),
        registry_(MakeRegistryOptions(cluster)),
        line_(cluster.max_queued) {}

  absl::Status Build();
  // Open loop from `measure_start` or right away.
  void AddRequests(std::vector<TimedRequest> items, const bench::BenchConfig* workload);
  absl::Status Run();
  SimResult TakeResult(const bench::Slo& slo);

 private:
  static RegistryOptions MakeRegistryOptions(const ClusterSpec& c) {
    RegistryOptions o;
    o.heartbeat_timeout = absl::Seconds(std::max(3 * c.heartbeat_interval, 1.0));
    return o;
  }
  absl::Time At(double t) const { return absl::UnixEpoch() + absl::Seconds(t); }
  const std::vector<uint64_t>& BlockHashes(Request& q) {
    const int bs = cluster_.block_size;
    const std::vector<int>& prompt = q.item.prompt;
    if (q.block_hashes.empty()) {
      uint64_t parent = 0;
      for (size_t b = 0; (b + 1) * bs <= prompt.size(); ++b) {
        parent = HashBlockTokens(parent, std::span<const int>(prompt).subspan(b * bs, bs));
        q.block_hashes.push_back(parent);
      }
    }
    return q.block_hashes;
  }
  void Push(double t, Kind kind, int a, int priority = 0) {
    events_.push({t, priority, seq_++, kind, a});
  }
  // The next event, the queue's or a device's next task end, taken out; false when none is left.
  bool PopEvent(Event* e);
  WorkerLoadSnapshot Load(const Worker& w) const;
  void Send(int r);
  bool AdmitDecode(int r);
  void AdmitWaiting();
  void EnqueuePrefill(int r);
  bool TakePrefillBlocks(int r, int w);
  void FirstToken(int r);
  void DecodeStart(int r);
  void End(int r, double t, int status);
  void Wake(int w);
  void StepStart(int w);
  void StepEnd(int w);
  void StartRelay(int w);
  void Deliver(int r, double t);
  void AddToDevice(int w, double seconds);
  // Request `r`'s event `next` after a hop of `cpu` seconds (CPU work on a shared host, else
  // plain latency) and `latency` more, starting at `start` (>= now).
  void StartHop(double start, double cpu, double latency, Kind next, int r);
  void HopStart(int h);
  double& Remaining(int task) {
    return task >= 0 ? workers_[task].remaining : hops_[-1 - task].remaining;
  }
  void Advance(Device& d);
  void Reschedule(int device);
  void DeviceDone(int device);
  void Heartbeat();
  void StartPool(int pool, double t);

  const ModelConfig& model_;
  const HardwareProfile& profile_;
  const ClusterSpec& cluster_;
  const SimOptions& options_;
  Link link_;
  HardwareProfile prefill_profile_, decode_profile_;
  std::unique_ptr<CostModel> prefill_cost_, decode_cost_;
  // The request path's latency noise (HardwareProfile::request_jitter), drawn in event order.
  std::mt19937_64 rng_{1};
  std::mt19937_64 spec_rng_{17};  // speculative decoding's kept proposals
  double Jitter(double mean) {
    if (options_.zero_cost || !(mean > 0)) return 0;
    return std::exponential_distribution<double>(1.0 / mean)(rng_);
  }
  // A step's time factor: lognormal with mean one (HardwareProfile::step_jitter, or
  // prefill_step_jitter for a prefill step).
  // Speculative decoding: widens decode work i of `plan` (request r) by the proposals the worker
  // grants blocks for, and draws how many of them are kept. Returns that count.
  int Speculate(DecodeScheduler::Step* plan, size_t i, int r, Worker& wk) {
    const DecodeScheduler::Work& w = plan->work[i];
    if (!w.sample || w.count != 1) return 0;
    const Request& q = requests_[r];
    const int room = std::min(cluster_.spec_tokens, q.item.output_tokens - q.generated - 1);
    const int k = wk.decode_scheduler->Speculate(plan, i, room);
    std::bernoulli_distribution keep(cluster_.spec_acceptance);
    int kept = 0;
    while (kept < k && keep(spec_rng_)) ++kept;
    return kept;
  }

  double StepNoise(bool prefill) {
    const double sigma = prefill && profile_.prefill_step_jitter >= 0 ? profile_.prefill_step_jitter
                                                                      : profile_.step_jitter;
    if (!(sigma > 0)) return 1;
    return std::exp(sigma * std::normal_distribution<double>()(rng_) - sigma * sigma / 2);
  }
  WorkerRegistry registry_;
  // Requests waiting for decode room, as the router's (router/admission.h), and which request
  // holds each ticket.
  AdmissionLine line_;
  std::map<uint64_t, int> waiting_;
  bool admitting_ = false;  // AdmitWaiting is running (End may call it again)
  std::vector<Worker> workers_;
  int relay_ = -1;            // index of the relay worker, if any
  int path_device_ = 1;       // shared host: the device of the hops and the relay
  double step_cores_ = 1;     // cores a worker's step keeps busy
  double prefill_cores_ = 0;  // above 0: a prefill step's, served first
  std::vector<Device> devices_;
  std::vector<Hop> hops_;
  std::vector<Request> requests_;
  std::vector<ClosedPool> pools_;
  const bench::BenchConfig* workload_ = nullptr;
  int open_from_ = -1;  // first index sent open loop after the warm-up pool ends
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t seq_ = 0;
  double now_ = 0;
  double measure_start_ = 0;
  int ended_ = 0;
  bool heartbeat_pending_ = false;
  SimResult result_;
  double batch_sum_ = 0;
};

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
    w.pool = std::make_unique<BlockPool>(*pblocks);
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
    uint64_t parent = 0;
    for (int b = 0; (b + 1) * rbs <= len - 1; ++b) {
      parent = HashBlockTokens(parent, std::span<const int>(prompt).subspan(b * rbs, rbs));
      hashes.push_back(parent);
    }
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
    for (int b = 0; (b + 1) * bs <= len - 1; ++b) {
      auto hit = pw.pool->Lookup(full[b]);
      if (!hit) break;
      q.blocks.push_back(*hit);
    }
    q.cached = static_cast<int>(q.blocks.size()) * bs;
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

void Sim::Wake(int w) {
  Worker& wk = workers_[w];
  if (wk.busy || wk.start_pending) return;
  wk.start_pending = true;
  Push(now_, Kind::kStepStart, w, /*priority=*/1);
}

void Sim::StepStart(int w) {
  Worker& wk = workers_[w];
  wk.start_pending = false;
  std::vector<ChunkShape> shapes;
  wk.step_requests.clear();
  wk.transfer_tokens = 0;
  wk.step = StepTrace{};
  wk.step.worker = w;
  wk.step.prefill = wk.prefill;
  if (wk.prefill) {
    wk.step.work = wk.prefill_scheduler->Schedule();
    for (const auto& work : wk.step.work) {
      const int r = static_cast<int>(work.id - 1);
      Request& q = requests_[r];
      shapes.push_back({work.start, work.count});
      wk.step_requests.push_back(r);
      wk.transfer_tokens += work.count;
      if (q.cached > 0 && !q.cached_sent) {  // a prefix hit's KV is sent as it is
        wk.transfer_tokens += q.cached;
        q.cached_sent = true;
      }
    }
  } else {
    // The decode worker's own plan: a token per running sequence, recompute chunks of readmitted
    // preempted ones, blocks grown and the newest sequences preempted as the cache fills.
    DecodeScheduler::Step plan = wk.decode_scheduler->Schedule();
    result_.preemptions += static_cast<int64_t>(plan.preempted.size());
    wk.step_kept.assign(plan.work.size(), 0);
    for (size_t i = 0; i < plan.work.size(); ++i) {
      const int r = static_cast<int>(plan.work[i].id - 1);
      if (cluster_.spec_tokens > 0) wk.step_kept[i] = Speculate(&plan, i, r, wk);
      const DecodeScheduler::Work& work = plan.work[i];
      wk.step.batch.push_back(work.id);
      shapes.push_back({work.start, work.count, work.draft > 0 ? work.count : 1});
      wk.step_requests.push_back(r);
    }
    wk.step.decode = std::move(plan.work);
    wk.step.preempted = std::move(plan.preempted);
  }
  if (shapes.empty()) return;  // idle until woken
  wk.busy = true;
  wk.step_start = now_;
  wk.step.start = now_;
  const double seconds =
      options_.zero_cost ? 0 : wk.cost->Step(shapes).seconds * StepNoise(wk.prefill);
  wk.step_alone = seconds;
  if (wk.prefill) {
    ++result_.prefill_steps;
  } else {
    ++result_.decode_steps;
    batch_sum_ += shapes.size();
  }
  AddToDevice(w, seconds);
}

void Sim::StepEnd(int w) {
  Worker& wk = workers_[w];
  wk.busy = false;
  if (wk.relay) {
    // A decode step's tokens reach their clients once the relay has done their work.
    const double out = now_ + profile_.token_overhead;
    for (int r : wk.relaying) Deliver(r, out);
    wk.relaying.clear();
    if (!wk.relay_queue.empty()) StartRelay(w);
    return;
  }
  if (!wk.sampling) {
    // The step's figures are its forward pass's, as the workers' metrics are.
    (wk.prefill ? result_.prefill_step_seconds : result_.decode_step_seconds) +=
        now_ - wk.step_start;
    (wk.prefill ? result_.prefill_step_alone_seconds : result_.decode_step_alone_seconds) +=
        wk.step_alone;
    if (!wk.prefill && profile_.sample_cpu > 0 && !options_.zero_cost) {
      // Then the loop samples each running request's token on its thread, one core.
      wk.sampling = wk.busy = true;
      // A verify step samples a row per token it emits.
      double rows = static_cast<double>(wk.step_requests.size());
      for (int kept : wk.step_kept) rows += kept;
      AddToDevice(w, profile_.sample_cpu * rows);
      return;
    }
  }
  wk.sampling = false;
  wk.step.end = now_;
  if (wk.prefill) {
    // Colocated: the in-process transport copies within the step.
    const double transferred =
        options_.zero_cost || cluster_.colocated
            ? now_
            : wk.cost->TransferDone(wk.step_start, now_ - wk.step_start, wk.transfer_tokens, link_,
                                    &wk.link_free);
    for (size_t i = 0; i < wk.step.work.size(); ++i) {
      if (!wk.step.work[i].last) continue;
      Request& q = requests_[wk.step_requests[i]];
      // The engine's FinishLocked: full blocks become reusable prefixes, the rest are freed.
      if (cluster_.prefix_cache) {
        const std::vector<uint64_t>& full = BlockHashes(q);
        for (size_t b = 0; b < full.size(); ++b) wk.pool->Register(q.blocks[b], full[b]);
      }
      wk.pool->Free(q.blocks).IgnoreError();
      q.blocks.clear();
      --wk.prefill_jobs;
      StartHop(std::max(transferred, now_), profile_.request_overhead / 2, 0, Kind::kFirstToken,
               wk.step_requests[i]);
    }
    // Prompts waiting for the blocks just freed, in arrival order.
    while (!wk.waiting_blocks.empty()) {
      const int r = wk.waiting_blocks.front();
      if (!requests_[r].ended && !TakePrefillBlocks(r, w)) break;
      wk.waiting_blocks.pop_front();
    }
    if (!wk.prefill_scheduler->empty()) Wake(w);
  } else {
    const bool relayed = relay_ >= 0 && !options_.zero_cost;
    const double out = now_ + (options_.zero_cost ? 0 : profile_.token_overhead);
    wk.decode_scheduler->Complete({wk.step.decode, {}}, wk.step_kept);
    std::vector<int> delivered;  // a recompute chunk short of its sequence's end sends nothing
    for (size_t i = 0; i < wk.step.decode.size(); ++i) {
      if (!wk.step.decode[i].sample) continue;
      const int r = wk.step_requests[i];
      Request& q = requests_[r];
      // The token, and the proposals kept before it.
      for (int t = 0; t <= wk.step_kept[i]; ++t) {
        ++q.generated;
        delivered.push_back(r);
        if (!relayed) Deliver(r, out);
      }
      if (q.generated >= q.item.output_tokens) {
        wk.decode_scheduler->Release(q.id);  // the worker is done with it; the client not yet
      }
    }
    if (relayed && !delivered.empty()) {
      workers_[relay_].relay_queue.push_back(std::move(delivered));
      if (!workers_[relay_].busy) StartRelay(relay_);
    }
    if (!wk.decode_scheduler->running().empty() || wk.decode_scheduler->num_preempted() > 0) {
      Wake(w);
    }
  }
  if (options_.record_steps) result_.steps.push_back(std::move(wk.step));
}

void Sim::StartRelay(int w) {
  Worker& wk = workers_[w];
  wk.busy = true;
  wk.relaying = std::move(wk.relay_queue.front());
  wk.relay_queue.pop_front();
  AddToDevice(w, profile_.relay_cpu * wk.relaying.size());
}

// One more token of request `r` reaches its client at `t`; the last one ends the request.
void Sim::Deliver(int r, double t) {
  Request& q = requests_[r];
  bench::RequestRecord& rec = result_.records[r];
  ++rec.output_tokens;
  if (options_.record_token_times) rec.token_times.push_back(t);
  if (rec.output_tokens >= q.item.output_tokens) End(r, t, 0);
}

void Sim::Advance(Device& d) {
  for (const Task& t : d.active) Remaining(t.id) -= (now_ - d.last) * d.Rate(t);
  d.last = now_;
}

void Sim::AddToDevice(int w, double seconds) {
  Device& d = devices_[workers_[w].device];
  Advance(d);
  Worker& wk = workers_[w];
  wk.remaining = seconds;
  const bool first = wk.prefill && prefill_cores_ > 0;
  d.Add({w, wk.relay || wk.sampling ? 1.0 : first ? prefill_cores_ : step_cores_, first});
  Reschedule(workers_[w].device);
}

void Sim::Reschedule(int device) {
  Device& d = devices_[device];
  d.done_pending = false;
  if (d.active.empty()) return;
  double soonest = 1e300;  // a task with no cores left to it waits for those served first
  for (const Task& t : d.active) {
    const double rate = d.Rate(t);
    if (rate > 0) soonest = std::min(soonest, std::max(0.0, Remaining(t.id)) / rate);
  }
  d.done_pending = soonest < 1e300;
  if (d.done_pending) d.done = {now_ + soonest, 0, seq_++, Kind::kDeviceDone, device};
}

void Sim::DeviceDone(int device) {
  Device& d = devices_[device];
  Advance(d);
  // Every task that ran out of work (the one this event was timed for, and any other within a
  // nanosecond: what the clock's rounding leaves).
  const std::vector<int> done = d.Remove([&](int t) { return Remaining(t) <= 1e-9; });
  Reschedule(device);
  for (int t : done) {
    if (t >= 0) {
      StepEnd(t);
      continue;
    }
    const Hop& hop = hops_[-1 - t];
    Push(now_ + hop.latency, hop.next, hop.r);
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

}  // namespace

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
