// The simulator's event loop (planner/simulator.h), shared by the files that define its parts:
// simulator.cc (requests, admission, the run) and simulator_steps.cc (worker steps, the token
// relay and the devices' processor sharing). Not part of the planner's interface.
#ifndef TANDEM_PLANNER_SIM_INTERNAL_H_
#define TANDEM_PLANNER_SIM_INTERNAL_H_

#include <deque>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_cache_manager.h"
#include "planner/simulator.h"
#include "router/admission.h"
#include "router/registry.h"

namespace tandem::planner::sim_internal {

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
  std::unique_ptr<KvCacheManager> pool;  // prefill: the blocks and their prefix cache
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
      q.block_hashes = PrefixBlockHashes(prompt, bs, static_cast<int>(prompt.size()) / bs);
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

  // A step's time factor: lognormal with mean one (HardwareProfile::step_jitter, or
  // prefill_step_jitter for a prefill step).
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

}  // namespace tandem::planner::sim_internal

#endif  // TANDEM_PLANNER_SIM_INTERNAL_H_
