// One request through the cluster, as the router runs it: admission on a decode worker, the
// prefill, the token stream and the resumes after faults (GenerateTransaction). Internal to the
// router (a friend of Router, reading its registry, queue and channels under its lock).
#ifndef TANDEM_ROUTER_GENERATE_TRANSACTION_H_
#define TANDEM_ROUTER_GENERATE_TRANSACTION_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/request.h"
#include "engine/sampling/stop.h"
#include "router/cancel_hub.h"
#include "router/router.h"
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

using DecodeStream = grpc::ClientReaderWriter<v1::DecodeClientMessage, v1::DecodeServerMessage>;

// One request, over as many attempts as faults require, as a transaction whose phases are the
// steps of RunAttempt and Run:
//   admit     wait (bounded) for healthy workers, then admit `prompt + tokens streamed so far` on
//             a decode worker, which leases KV blocks for it;
//   prefill   a prefill worker computes the prompt's KV into that lease and the first token;
//   stream    relay the decode worker's tokens to the client;
//   resume    after a worker death or a failed KV transfer, back off and start a new attempt
//             after the last token the client has, on workers that have not failed this
//             request (sampling is keyed by (seed, position), so the resumed tokens are the
//             ones the failed worker would have produced);
//   finish    the last message written, the metrics recorded.
// The router's lock is taken only around registry and queue bookkeeping.
class GenerateTransaction {
 public:
  GenerateTransaction(Router* router, const v1::GenerateRequest& req, const StreamCall& call)
      : r_(router), req_(req), call_(call), t0_(absl::Now()) {}
  ~GenerateTransaction();

  grpc::Status Run();

 private:
  // What one attempt holds; destroyed (the decode stream closed, the queue place given back)
  // when the attempt ends.
  struct Attempt {
    explicit Attempt(Router* r) : queued{r} {}
    std::vector<int> prompt;  // the request's prompt + the tokens already streamed
    int len = 0;
    int remaining = 0;       // tokens still allowed
    int total_tokens = 0;    // what the request may reach: prompt + remaining, within the context
    absl::Time queue_until;  // waiting for a healthy worker of a role, until then
    absl::Time room_until;   // waiting for KV room on a decode worker, until then
    // A place in the router's wait queue (tenants in turn, first come first admitted within
    // one), taken while the request
    // waits for workers or for KV room, given back when it is admitted or gives up.
    struct QueueSlot {
      Router* r;
      uint64_t ticket = 0;  // 0: not in line
      void ReleaseLocked() {
        if (ticket == 0) return;
        r->line_.Leave(ticket);
        ticket = 0;
        r->room_cv_.notify_all();  // the next in line may try
      }
      ~QueueSlot() {
        std::lock_guard<std::mutex> lock(r->mu_);
        ReleaseLocked();
      }
    } queued;
    std::unique_ptr<grpc::ClientContext> d_ctx;
    std::unique_ptr<DecodeStream> d_stream;
    std::string decode_id;
    KvTarget target;
    v1::PrefillResponse presp;
    // Closes the decode stream on every exit once admitted; cancelling it frees the blocks
    // there.
    struct StreamCloser {
      StreamCloser(grpc::ClientContext* c, DecodeStream* s, CancelWatcher* w) : c(c), s(s), w(w) {}
      StreamCloser(const StreamCloser&) = delete;
      StreamCloser& operator=(const StreamCloser&) = delete;
      grpc::ClientContext* c;
      DecodeStream* s;
      CancelWatcher* w;
      bool finished = false;
      ~StreamCloser() {
        if (!finished) {
          c->TryCancel();
          s->Finish().ok();
        }
        w->Unwatch(c);
      }
    };
    std::optional<StreamCloser> closer;
  };

  grpc::Status Begin();
  grpc::Status RunAttempt();
  grpc::Status Enqueue(Attempt& a);  // under r_->mu_
  // Under r_->mu_: whether `a` may look for room now (no one waits, or it is first in line).
  bool MyTurnLocked(const Attempt& a) const;
  // The request's deadline passed while it waited for KV room.
  grpc::Status NoRoom();
  grpc::Status WaitForWorkers(Attempt& a);
  grpc::Status Admit(Attempt& a);
  // One admission try on decode worker `pick`: OK and the stream in `a`, or why not (*vanished:
  // the worker left the registry).
  grpc::Status TryAdmit(Attempt& a, const std::string& pick, bool* vanished);
  grpc::Status Prefill(Attempt& a);
  grpc::Status Stream(Attempt& a);
  grpc::Status DecodeBroke(Attempt& a, grpc::Status s);
  // The next state after a failed attempt: kResume, or the final status in *final_status.
  bool PrepareResume(const grpc::Status& s, int resumes, grpc::Status* final_status);
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
  bool Write();
  void ClearResponse();
  // The client's own timer fires first and cancels the stream; our copy of its deadline (sent as
  // a relative timeout) lands a little later. A cancel that close to the deadline is the
  // deadline.
  grpc::Status ClientGone() const;
  bool IsGone();
  // A worker that failed this request: not picked again for it, and reported to the registry.
  void Report(const std::string& worker, std::set<std::string>* failed);

  Router* const r_;
  const v1::GenerateRequest& req_;
  const StreamCall& call_;
  const absl::Time t0_;
  std::optional<GenerationRequest> greq_;
  int prompt_len_ = 0;
  std::string request_id_;  // scoped to the caller (router/request_id.h): logs, workers
  std::string client_id_;   // what the client sees: its own id, or the one the router drew
  bool in_flight_ = false;
  std::optional<PhaseGauges> phase_;
  std::optional<CancelWatcher> watcher_;
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
