// One request through the cluster, as the router runs it: admission on a decode worker, the
// prefill, the token stream and the resumes after faults (GenerateTransaction). Internal to the
// router: it sees the cluster through a RequestContext (router/router.h), its registry, lines and
// channels through ClusterView (router/cluster_view.h).
#ifndef TANDEM_ROUTER_GENERATE_TRANSACTION_H_
#define TANDEM_ROUTER_GENERATE_TRANSACTION_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/request.h"
#include "engine/sampling/stop.h"
#include "router/async.h"
#include "router/call_watch.h"
#include "router/router.h"
#include "router/worker_calls.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "text/tokenizer.h"

namespace tandem::router_internal {

// A request counts as waiting until its first token is sent, then as running until it ends.
class PhaseGauges {
 public:
  explicit PhaseGauges(RouterMetrics* m) : m_(m) {
    if (m_) m_->num_requests_waiting.Increment();
  }
  ~PhaseGauges() {
    if (m_) (running_ ? m_->num_requests_running : m_->num_requests_waiting).Decrement();
  }
  void Running() {
    if (m_ && !running_) {
      m_->num_requests_waiting.Decrement();
      m_->num_requests_running.Increment();
    }
    running_ = true;
  }

 private:
  RouterMetrics* m_;
  bool running_ = false;
};

// One request, over as many attempts as faults require, as a coroutine (router/async.h) whose
// phases are the steps of RunAttempt and Run; it holds no thread while it waits:
//   admit     wait (bounded) for healthy workers, then admit `prompt + tokens streamed so far` on
//             a decode worker, which leases KV blocks for it;
//   prefill   a prefill worker computes the prompt's KV into that lease and the first token;
//   stream    relay the decode worker's tokens to the client;
//   resume    after a worker death or a failed KV transfer, back off and start a new attempt
//             after the last token the client has, on workers that have not failed this
//             request (sampling is keyed by (seed, position), so the resumed tokens are the
//             ones the failed worker would have produced);
//   finish    the last message written, the metrics recorded.
// A wait for room or workers is woken by the router (Router::NotifyLocked: the front of the line
// when room may have freed, every waiter for workers when the registry changed), by its own
// deadline or by its client going away. The router's lock is taken only around registry and
// queue bookkeeping, never across a wait.
class GenerateTransaction {
 public:
  GenerateTransaction(const RequestContext& context, v1::GenerateRequest req, AsyncCall call)
      : c_(context), req_(std::move(req)), call_(std::move(call)), t0_(absl::Now()) {}
  ~GenerateTransaction();

  async::Task<grpc::Status> Run();

 private:
  // What one attempt holds; destroyed (the decode stream closed, the queue place given back)
  // when the attempt ends.
  struct Attempt {
    explicit Attempt(GenerateTransaction* t) : queued{t->c_.cluster}, watch(&*t->watch_) {}
    ~Attempt() {
      if (!decode) return;
      watch->Unwatch(decode->context());
      decode->Drop();  // cancelling the stream frees the blocks there
    }
    std::vector<int> prompt;  // the request's prompt + the tokens already streamed
    int len = 0;
    int remaining = 0;       // tokens still allowed
    int total_tokens = 0;    // what the request may reach: prompt + remaining, within the context
    absl::Time queue_until;  // waiting for a healthy worker of a role, until then
    absl::Time room_until;   // waiting for KV room on a decode worker, until then
    // A place in the router's wait queue (tenants in turn, by priority then first come within
    // one), taken while the request waits for workers or for KV room, given back when it is
    // admitted or gives up.
    struct QueueSlot {
      ClusterView* view;
      uint64_t ticket = 0;  // 0: not in line
      void Release(ClusterView::Locked& cluster) {
        if (ticket == 0) return;
        cluster.line().Leave(ticket);
        ticket = 0;
        cluster.Notify();  // the next in line may try
      }
      ~QueueSlot() {
        ClusterView::Locked cluster = view->Lock();
        Release(cluster);
      }
    } queued;
    CallWatch* watch;
    std::shared_ptr<DecodeCall> decode;  // the admitted stream
    std::string decode_id;
    KvTarget target;
    v1::PrefillResponse presp;
  };
  // How a wait is registered, to be undone when it ends.
  struct WaitRegistration {
    uint64_t timer = 0;
    uint64_t subscription = 0;
    uint64_t ticket = 0;  // a turn waiter's
    uint64_t change = 0;  // a change waiter's id
  };
  enum class WaitKind {
    kTurn,    // for the front of the line (`ticket`): room may have freed
    kChange,  // for any change of the registry (workers joining, heartbeats)
    kTime,    // for `until` only (a back-off)
  };

  grpc::Status Begin();
  async::Task<grpc::Status> RunAttempt();
  grpc::Status Enqueue(Attempt& a, ClusterView::Locked& cluster);
  // Whether `a` may look for room now (no one waits, or it is first in line).
  bool MyTurnLocked(const Attempt& a, ClusterView::Locked& cluster) const;
  // First in line with no room: passes the turn to a tenant waiting behind that
  // streams fewer (by two or more), or else takes the place of the tenant streaming the most when
  // fair shares allow (RunningShares), one place at a time.
  void TakeFairShareLocked(ClusterView::Locked& cluster);
  // A place in the fair shares for as long as the attempt streams.
  void JoinSharesLocked(Attempt& a, ClusterView::Locked& cluster);
  void LeaveShares();
  // Waits until woken (per `kind`; `epoch` is the router's when the caller last looked: a
  // change since wakes at once), `until`, or the client going away.
  async::Task<bool> Wait(WaitKind kind, uint64_t ticket, uint64_t epoch, absl::Time until);
  // The request's deadline passed while it waited for KV room.
  grpc::Status NoRoom();
  async::Task<grpc::Status> WaitForWorkers(Attempt& a);
  async::Task<grpc::Status> Admit(Attempt& a);
  // One admission try on decode worker `pick`: OK and the stream in `a`, or why not (*vanished:
  // the worker left the registry).
  async::Task<grpc::Status> TryAdmit(Attempt& a, std::string pick, bool* vanished);
  async::Task<grpc::Status> Prefill(Attempt& a);
  async::Task<grpc::Status> Stream(Attempt& a);
  // The decode stream ended before the request did: why, as the attempt's status.
  async::Task<grpc::Status> DecodeBroke(Attempt& a);
  // The next state after a failed attempt: true to resume (after the back-off), or false with
  // the final status in *final_status. `preempted`: another tenant took the request's place (a
  // fault of no one's): it resumes at once, not counted against max_resumes.
  async::Task<bool> PrepareResume(grpc::Status s, int resumes, bool preempted,
                                  grpc::Status* final_status);
  void RecordSuccess();

  // Adds one token (and its logprobs, when asked for) to the pending response; true when the
  // request ends with it.
  bool AddToken(int token, const v1::TokenLogprobs* logprobs);
  // OK unless the request is constrained and ended at EOS without a whole value (the model
  // found no token to continue it): then it fails, never returning invalid output as "stop".
  grpc::Status EndsWhole() const;
  void FinishResponse();
  // Sends the pending response and counts its tokens: the first one for TTFT, every later one
  // for the inter-token latency (a message of k tokens spreads its wait over the k).
  async::Task<bool> Write();
  void ClearResponse();
  // The client's own timer fires first and cancels the stream; our copy of its deadline (sent as
  // a relative timeout) lands a little later. A cancel that close to the deadline is the
  // deadline.
  grpc::Status ClientGone() const;
  bool IsGone();
  // A worker that failed this request: not picked again for it, and reported to the registry.
  void Report(const std::string& worker, std::set<std::string>* failed);

  const RequestContext c_;
  const v1::GenerateRequest req_;
  const AsyncCall call_;
  const absl::Time t0_;
  std::optional<GenerationRequest> greq_;
  int prompt_len_ = 0;
  std::string request_id_;  // scoped to the caller (router/request_id.h): logs, workers
  std::string client_id_;   // what the client sees: its own id, or the one the router drew
  bool in_flight_ = false;
  bool quota_ = false;  // counted in the tenant's quota (ClusterView::Locked::quotas)
  // Fair shares (ClusterView): this request's place while it streams (0: none), the decode
  // stream's context there (under the view's lock), and whether another tenant took its place (its
  // stream is cancelled; the attempt resumes, not counted as a fault).
  uint64_t share_id_ = 0;
  grpc::ClientContext* share_ctx_ = nullptr;
  std::atomic<bool> preempted_{false};
  bool preempted_attempt_ = false;
  uint64_t preempting_ = 0;  // the place this request asked for, while it waits
  // The request that place was (its request id and decode worker): this one's admission there
  // names it (DecodeAdmit.replaces_request_id), so the worker frees the place first.
  std::string replacing_, replacing_worker_;
  std::string share_worker_;  // while streaming: the decode worker it streams from
  std::optional<PhaseGauges> phase_;
  std::optional<CallWatch> watch_;
  WaitRegistration wait_;
  // What the client has been sent (or is about to be): it survives the attempts.
  std::optional<IncrementalDecoder> detok_;
  std::optional<StopStringMatcher> stop_;
  std::vector<int> generated_;
  std::optional<FinishReason> finish_;
  v1::GenerateResponse resp_;
  absl::Time admitted_at_;
  v1::PrefillResponse first_presp_;  // the first attempt's prefill (for the timings)
  double ttft_ = 0;                  // router receipt to the first token sent
  absl::Time last_token_at_;
  std::set<std::string> failed_decode_, failed_prefill_;
  // Set when an attempt failed after the request already waited its bounded time for workers:
  // not resumed.
  bool final_ = false;
};

}  // namespace tandem::router_internal

#endif  // TANDEM_ROUTER_GENERATE_TRANSACTION_H_
