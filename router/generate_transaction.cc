#include "router/generate_transaction.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/kv/block_pool.h"
#include "router/request_id.h"
#include "rpc/grpc_util.h"

namespace tandem::router_internal {
namespace {

double Since(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

// A waiter for workers, and the front of the line waiting for room, look again at least this
// often: an ejected worker comes back, and a silent one turns unhealthy, by the clock alone.
constexpr absl::Duration kRecheck = absl::Milliseconds(100);
constexpr absl::Duration kRecheckTaken = absl::Milliseconds(5);

// Whether a failed attempt may be resumed on other workers: the fault was a worker's or the
// KV transfer's, not the request's.
bool Resumable(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:        // a worker died or its stream broke
    case grpc::StatusCode::ABORTED:            // the KV transfer failed (refused, lost)
    case grpc::StatusCode::DATA_LOSS:          // a KV chunk failed its checksum
    case grpc::StatusCode::DEADLINE_EXCEEDED:  // an internal deadline (the client's is checked)
      return true;
    default:
      return false;
  }
}

// Whether a worker's answer means the worker failed (it died, misbehaved or is misconfigured),
// as opposed to a verdict on the request (INVALID_ARGUMENT), no room (RESOURCE_EXHAUSTED) or
// the client going away. Such a worker is reported to the registry, which ejects one that keeps
// failing.
bool WorkerFault(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return true;
    default:
      return false;
  }
}

}  // namespace

GenerateTransaction::~GenerateTransaction() {
  if (!in_flight_) return;
  {
    ClusterView::Locked cluster = c_.cluster->Lock();
    cluster.in_flight().erase(request_id_);
    if (quota_) cluster.quotas().End(call_.tenant, absl::Now());
    cluster.Notify();  // its room is free
  }
  if (watch_) c_.cluster->Unwatch(&*watch_);
}

async::Task<grpc::Status> GenerateTransaction::Run() {
  if (grpc::Status s = Begin(); !s.ok()) co_return s;
  for (int resumes = 0;;) {
    grpc::Status s = co_await RunAttempt();
    if (s.ok()) {
      RecordSuccess();
      co_return s;
    }
    grpc::Status final_status;
    const bool preempted = std::exchange(preempted_attempt_, false);
    const bool resume = co_await PrepareResume(s, resumes, preempted, &final_status);
    if (!resume) co_return final_status;
    if (!preempted) ++resumes;
  }
}

// Validation and a place among the requests in flight.
grpc::Status GenerateTransaction::Begin() {
  if (*c_.draining) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "router is draining (shutting down); send to another replica");
  }
  auto parsed = ValidateGenerateRequest(req_, *c_.config, *c_.tokenizer, c_.options->limits);
  if (!parsed.ok()) return ToGrpc(parsed.status());
  greq_ = std::move(*parsed);
  // Structured output: its constraint, for EndsWhole.
  if (absl::Status s = AttachConstraint(c_.constraints, &greq_->sampling); !s.ok()) {
    return ToGrpc(s);
  }
  prompt_len_ = static_cast<int>(greq_->prompt.size());
  request_id_ = ScopedRequestId(call_.caller, req_.request_id());
  client_id_ = req_.request_id().empty() ? request_id_ : req_.request_id();
  {
    ClusterView::Locked cluster = c_.cluster->Lock();
    if (static_cast<int>(cluster.in_flight().size()) >= c_.options->max_in_flight) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrFormat("router: %d requests in flight (the limit); retry after "
                                          "%d ms",
                                          c_.options->max_in_flight, c_.options->retry_after_ms));
    }
    if (cluster.in_flight().count(request_id_) > 0) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("request_id: \"%s\" is already in flight", client_id_));
    }
    // The API key's limits: generations in flight, tokens per minute.
    if (std::optional<TenantQuotas::Refusal> no = cluster.quotas().Start(
            call_.tenant, call_.limits, prompt_len_, absl::Now(), c_.options->retry_after_ms)) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, no->why);
    }
    quota_ = call_.limits.any();
    cluster.in_flight().insert(request_id_);
    in_flight_ = true;
  }
  phase_.emplace(c_.metrics);
  watch_.emplace(call_.gone);
  c_.cluster->Watch(&*watch_);
  detok_.emplace(c_.tokenizer, greq_->prompt);
  stop_.emplace(greq_->stop_strings);
  resp_.set_request_id(client_id_);
  return grpc::Status::OK;
}

async::Task<grpc::Status> GenerateTransaction::RunAttempt() {
  Attempt a(this);
  a.prompt = greq_->prompt;
  a.prompt.insert(a.prompt.end(), generated_.begin(), generated_.end());
  a.len = static_cast<int>(a.prompt.size());
  a.remaining = greq_->max_tokens - static_cast<int>(generated_.size());
  a.total_tokens =
      static_cast<int>(std::min<int64_t>(int64_t{a.len} + a.remaining, c_.config->max_seq_len));
  a.queue_until = std::min(call_.deadline, absl::Now() + c_.options->queue_timeout);
  a.room_until = call_.deadline;
  grpc::Status s = co_await WaitForWorkers(a);
  if (s.ok()) s = co_await Admit(a);
  if (s.ok()) s = co_await Prefill(a);
  if (s.ok()) s = co_await Stream(a);
  co_return s;
}

grpc::Status GenerateTransaction::Enqueue(Attempt& a, ClusterView::Locked& cluster) {
  if (a.queued.ticket != 0) return grpc::Status::OK;
  const std::optional<uint64_t> ticket = cluster.line().Join(call_.tenant, req_.priority());
  if (!ticket) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrFormat("no decode worker has room and %d requests are queued "
                                        "(the limit); retry after %d ms",
                                        cluster.line().max_queued(), c_.options->retry_after_ms));
  }
  a.queued.ticket = *ticket;
  // A tenant streaming far fewer sequences than the one whose turn it is goes first: the rule by
  // which TakeFairShareLocked passes the turn, applied as it joins, so that it never waits for a
  // request of the tenant holding the places to be admitted before it looks.
  const std::string& first = cluster.line().turns().front();
  if (first != call_.tenant && cluster.shares().FarBelow(call_.tenant, first)) {
    cluster.line().GoFirst(call_.tenant);
  }
  return grpc::Status::OK;
}

grpc::Status GenerateTransaction::NoRoom() {
  final_ = true;
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "no decode worker had KV room before the request's deadline");
}

bool GenerateTransaction::MyTurnLocked(const Attempt& a, ClusterView::Locked& cluster) const {
  return cluster.line().MayLook(a.queued.ticket);
}

async::Task<bool> GenerateTransaction::Wait(WaitKind kind, uint64_t ticket, uint64_t epoch,
                                            absl::Time until) {
  wait_ = WaitRegistration();
  co_await async::Callback<bool>(c_.executor, [&](std::function<void(bool)> done) {
    auto wake = async::FirstOf<bool>(std::move(done));
    if (until < absl::InfiniteFuture()) {
      wait_.timer = c_.timer->At(until, [wake] { wake(true); });
    }
    if (call_.gone) wait_.subscription = call_.gone->Subscribe([wake] { wake(true); });
    if (kind == WaitKind::kTime) return;
    ClusterView::Locked cluster = c_.cluster->Lock();
    if (cluster.epoch() != epoch) {
      wake(true);  // something changed since the caller looked
    } else if (kind == WaitKind::kTurn) {
      wait_.ticket = ticket;
      cluster.AddTurnWaiter(ticket, wake);
    } else {
      wait_.change = cluster.AddChangeWaiter(wake);
    }
  });
  if (wait_.timer != 0) c_.timer->Cancel(wait_.timer);
  if (wait_.subscription != 0) call_.gone->Unsubscribe(wait_.subscription);
  if (wait_.ticket != 0 || wait_.change != 0) {
    ClusterView::Locked cluster = c_.cluster->Lock();
    cluster.RemoveWaiters(wait_.ticket, wait_.change);
  }
  co_return !IsGone();
}

// A role with no healthy worker (one stalled or restarting) is waited for, in the same bounded
// queue as requests waiting for room: a stall delays requests, it does not fail them.
async::Task<grpc::Status> GenerateTransaction::WaitForWorkers(Attempt& a) {
  for (;;) {
    uint64_t epoch;
    {
      ClusterView::Locked cluster = c_.cluster->Lock();
      const absl::Time now = absl::Now();
      const bool prefill = cluster.registry().CountHealthy(WorkerRole::kPrefill, now) > 0;
      const bool decode = cluster.registry().CountHealthy(WorkerRole::kDecode, now) > 0;
      if (prefill && decode) co_return grpc::Status::OK;
      if (grpc::Status s = Enqueue(a, cluster); !s.ok()) co_return s;
      if (IsGone()) co_return ClientGone();
      if (now >= a.queue_until) {
        final_ = true;
        co_return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrFormat("no healthy %s worker within the queue timeout (%s)",
                                               prefill ? "decode" : "prefill",
                                               absl::FormatDuration(c_.options->queue_timeout)));
      }
      epoch = cluster.epoch();
    }
    // A worker registering or sending a heartbeat wakes the wait; a worker turning healthy by
    // the clock alone is seen within the health period.
    co_await Wait(WaitKind::kChange, 0, epoch, std::min(a.queue_until, absl::Now() + kRecheck));
  }
}

// Admission on a decode worker: the stream that lives as long as the request there. With no
// room anywhere the request waits in line (first come, first admitted; the queue's places are
// bounded) for room to free up, until its own deadline or until its client leaves: a full cache
// delays requests, it does not fail them.
async::Task<grpc::Status> GenerateTransaction::Admit(Attempt& a) {
  std::set<std::string> tried = failed_decode_;
  grpc::Status last_error(grpc::StatusCode::UNAVAILABLE, "no healthy decode worker");
  int unavailable = 0;  // workers that failed in this round
  bool widened = false;
  while (!a.decode) {
    std::optional<std::string> pick;
    // Set when the request waits: for its turn (not first in line) or for room (first).
    std::optional<absl::Time> wait_until;
    uint64_t epoch = 0;
    {
      ClusterView::Locked cluster = c_.cluster->Lock();
      const absl::Time now = absl::Now();
      if (!MyTurnLocked(a, cluster)) {
        // Requests that came first are waiting for room: wait behind them.
        if (grpc::Status s = Enqueue(a, cluster); !s.ok()) co_return s;
        if (IsGone()) co_return ClientGone();
        if (now >= a.room_until) co_return NoRoom();
        if (MyTurnLocked(a, cluster)) continue;  // it joined at the front
        wait_until = a.room_until;
        epoch = cluster.epoch();
      } else if (std::optional<std::string> why =
                     NeverFits(cluster.registry().LargestDecodeTokens(now), a.total_tokens)) {
        // A request that could not fit in any decode worker's whole cache never will.
        final_ = true;
        co_return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, *why);
      } else {
        pick = cluster.registry().PickDecode(a.len, a.total_tokens, now, tried);
        if (!pick && !widened && !failed_decode_.empty()) {
          // Every worker with room failed this request once: a transient fault is retried
          // anywhere (the registry ejects a worker that keeps failing).
          widened = true;
          tried.clear();
          pick = cluster.registry().PickDecode(a.len, a.total_tokens, now, tried);
        }
        if (!pick) {
          // No room anywhere (by the heartbeats' view or the workers' refusals), or no healthy
          // decode worker for a moment: wait for a request to end or a heartbeat, in a bounded
          // queue.
          const bool none_healthy = cluster.registry().CountHealthy(WorkerRole::kDecode, now) == 0;
          if (grpc::Status s = Enqueue(a, cluster); !s.ok()) co_return s;
          if (IsGone()) co_return ClientGone();
          if (none_healthy && now >= a.queue_until) {
            final_ = true;
            co_return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "no healthy decode worker within the queue timeout");
          }
          if (now >= a.room_until) co_return NoRoom();
          if (a.queued.ticket != 0 && MyTurnLocked(a, cluster)) TakeFairShareLocked(cluster);
          // A place taken from another tenant frees as soon as its worker lets it go: look
          // again soon.
          wait_until = std::min(a.room_until, now + (preempting_ != 0 ? kRecheckTaken : kRecheck));
          if (none_healthy) wait_until = std::min(*wait_until, a.queue_until);
          epoch = cluster.epoch();
          tried = failed_decode_;
        }
      }
    }
    if (wait_until) {
      co_await Wait(WaitKind::kTurn, a.queued.ticket, epoch, *wait_until);
      continue;
    }
    tried.insert(*pick);
    bool vanished = false;
    grpc::Status s = co_await TryAdmit(a, *pick, &vanished);
    if (a.decode) break;
    if (vanished) continue;
    if (IsGone()) co_return ClientGone();
    last_error =
        s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "decode worker closed the stream") : s;
    if (s.ok() || WorkerFault(s)) {
      Report(*pick, &failed_decode_);
      if (++unavailable >= c_.options->decode_attempts) co_return last_error;
    } else if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      co_return s;  // e.g. INVALID_ARGUMENT: another worker would say the same
    }
  }
  {
    ClusterView::Locked cluster = c_.cluster->Lock();
    a.queued.Release(cluster);  // admitted: the next in line may look for room
  }
  if (admitted_at_ == absl::Time()) {
    admitted_at_ = absl::Now();
    if (c_.metrics) {
      c_.metrics->queue_time.Observe(absl::ToDoubleSeconds(admitted_at_ - t0_));
    }
  }
  preempting_ = 0;
  replacing_.clear();
  // A decode worker that turns unhealthy (wedged, silent, draining past its deadline) is
  // abandoned: its stream is cancelled and the request resumed elsewhere.
  watch_->WatchWorker(a.decode->context(), a.decode_id);
  co_return grpc::Status::OK;
}

async::Task<grpc::Status> GenerateTransaction::TryAdmit(Attempt& a, std::string pick,
                                                        bool* vanished) {
  if (c_.metrics) c_.metrics->routing_decisions(pick, "decode").Increment();
  auto address = c_.cluster->AddressOf(pick);
  if (!address) {
    *vanished = true;
    co_return grpc::Status(grpc::StatusCode::NOT_FOUND, "decode worker vanished");
  }
  v1::DecodeClientMessage admit;
  v1::DecodeAdmit* m = admit.mutable_admit();
  m->set_request_id(request_id_);
  m->mutable_prompt_ids()->Add(a.prompt.begin(), a.prompt.end());
  *m->mutable_sampling() = ToProto(greq_->sampling);
  m->set_max_tokens(a.remaining);
  m->set_ignore_eos(greq_->ignore_eos);
  m->set_disable_speculation(!greq_->speculative);
  if (!replacing_.empty() && pick == replacing_worker_) m->set_replaces_request_id(replacing_);
  m->set_output_tokens(static_cast<int>(generated_.size()));
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(call_.deadline));
  c_.cluster->Prove(c.get(), internal_method::kDecode, *address, admit);
  watch_->Watch(c.get());
  std::shared_ptr<DecodeCall> stream = c_.cluster->OpenDecode(*address, std::move(c));
  v1::DecodeServerMessage reply;
  grpc::Status refused;
  bool ok = co_await stream->Write(admit);
  if (ok) ok = co_await stream->Read(&reply);
  if (ok && reply.has_admitted()) {
    KvTarget target = tandem::FromProto(reply.admitted().kv_target());
    // A prefill worker sends the prompt's KV where the target says: only to the KV endpoint
    // this decode worker registered, never to an address of its choosing.
    refused = c_.cluster->CheckKvTarget(pick, target);
    if (refused.ok()) {
      a.target = target;
      a.decode = std::move(stream);
      a.decode_id = pick;
      ClusterView::Locked cluster = c_.cluster->Lock();
      cluster.registry().ReportSuccess(pick);
      co_return grpc::Status::OK;
    }
  }
  grpc::Status s = co_await stream->Finish(/*cancel=*/!refused.ok());
  if (!refused.ok()) s = refused;
  watch_->Unwatch(stream->context());
  co_return s;
}

// Prefill into the lease: the prompt's KV is sent to the decode worker, the first token comes
// back.
async::Task<grpc::Status> GenerateTransaction::Prefill(Attempt& a) {
  const int bs = [&] {
    ClusterView::Locked cluster = c_.cluster->Lock();
    return cluster.registry().PrefillBlockSize();
  }();
  const std::vector<uint64_t> hashes =
      bs > 0 ? PrefixBlockHashes(std::span<const int>(a.prompt).first(a.len), bs, (a.len - 1) / bs)
             : std::vector<uint64_t>();
  std::optional<std::string> prefill_id;
  {
    ClusterView::Locked cluster = c_.cluster->Lock();
    prefill_id = cluster.registry().PickPrefill(hashes, absl::Now(), failed_prefill_);
    if (!prefill_id) prefill_id = cluster.registry().PickPrefill(hashes, absl::Now(), {});
  }
  if (!prefill_id) {
    co_return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy prefill worker");
  }
  if (c_.metrics) c_.metrics->routing_decisions(*prefill_id, "prefill").Increment();
  auto p_address = c_.cluster->AddressOf(*prefill_id);
  if (!p_address) {
    co_return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker vanished");
  }
  v1::PrefillRequest preq;
  preq.set_request_id(request_id_);
  preq.mutable_prompt_ids()->Add(a.prompt.begin(), a.prompt.end());
  *preq.mutable_sampling() = ToProto(greq_->sampling);
  *preq.mutable_kv_target() = ToProto(a.target);
  preq.set_output_tokens(static_cast<int>(generated_.size()));
  // Waiting in a busy prefill worker's queue is not a failure: the call lives as long as the
  // request, its compute is bounded by the prefill timeout (counted by the worker from when the
  // prompt starts computing), and a worker that stalls (its step loop stops: health) is given
  // up on and the request resumed elsewhere.
  preq.set_compute_timeout_ms(static_cast<int32_t>(
      std::min<int64_t>(absl::ToInt64Milliseconds(c_.options->prefill_timeout), INT32_MAX)));
  grpc::ClientContext p_ctx;
  p_ctx.set_deadline(absl::ToChronoTime(call_.deadline));
  c_.cluster->Prove(&p_ctx, internal_method::kPrefill, *p_address, preq);
  watch_->Watch(&p_ctx);
  watch_->WatchWorker(&p_ctx, *prefill_id);
  auto stub = v1::PrefillWorker::NewStub(c_.cluster->ChannelFor(*p_address));
  grpc::Status ps = co_await CallPrefill(stub.get(), &p_ctx, &preq, &a.presp, c_.executor);
  const bool abandoned = watch_->abandoned(&p_ctx);
  watch_->Unwatch(&p_ctx);
  c_.cluster->Learn(*p_address, p_ctx);
  if (IsGone()) co_return ClientGone();
  if (!ps.ok() && abandoned) {
    Report(*prefill_id, &failed_prefill_);
    co_return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrFormat("prefill worker %s turned unhealthy", *prefill_id));
  }
  if (!ps.ok()) {
    // UNAVAILABLE / DEADLINE_EXCEEDED: the prefill worker died or stalled; DATA_LOSS: what it
    // sent failed the checksum. ABORTED: the decode side refused or lost the KV (no blame here;
    // a dead decode worker is found at the next admission).
    if (WorkerFault(ps) || ps.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      Report(*prefill_id, &failed_prefill_);
    } else if (ps.error_code() == grpc::StatusCode::ABORTED) {
      // The KV did not land in this decode worker's lease (it refused it, or its KV endpoint
      // did not answer as the decode worker it registered): the resumed attempt tries another
      // first, without counting it against the worker.
      failed_decode_.insert(a.decode_id);
    }
    co_return ps;
  }
  if (a.presp.first_token() < 0 || a.presp.first_token() >= c_.config->vocab_size) {
    Report(*prefill_id, &failed_prefill_);
    co_return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrFormat("prefill worker %s answered token id %d, outside the "
                                           "vocabulary",
                                           *prefill_id, a.presp.first_token()));
  }
  {
    ClusterView::Locked cluster = c_.cluster->Lock();
    cluster.registry().ReportSuccess(*prefill_id);
  }
  if (generated_.empty()) {
    first_presp_ = a.presp;
    if (c_.metrics) c_.metrics->prompt_tokens.Increment(prompt_len_);
  }
  co_return grpc::Status::OK;
}

// The first token from the prefill, the rest from the decode worker.
async::Task<grpc::Status> GenerateTransaction::Stream(Attempt& a) {
  {
    ClusterView::Locked cluster = c_.cluster->Lock();
    JoinSharesLocked(a, cluster);
  }
  // Out of the shares on every exit (the attempt's end frees its room: the line looks again).
  struct Unshare {
    GenerateTransaction* t;
    ~Unshare() { t->LeaveShares(); }
  } unshare{this};
  const bool first_ever = generated_.empty();
  const bool done_at_first = AddToken(a.presp.first_token(), &a.presp.first_logprobs());
  if (first_ever) {
    ttft_ = Since(t0_);
    resp_.mutable_timings()->set_ttft_seconds(ttft_);
  }
  if (done_at_first) {
    if (grpc::Status s = EndsWhole(); !s.ok()) co_return s;
    FinishResponse();
    const bool written = co_await Write();
    if (!written) co_return ClientGone();
    co_return grpc::Status::OK;  // the attempt's end cancels the decode stream: blocks freed
  }
  if (!(co_await Write())) co_return ClientGone();
  v1::DecodeClientMessage start;
  start.mutable_start()->set_first_token(a.presp.first_token());
  if (!(co_await a.decode->Write(start))) co_return co_await DecodeBroke(a);
  v1::DecodeServerMessage msg;
  for (;;) {
    const bool got = co_await a.decode->Read(&msg);
    if (!got) break;
    bool ended = false;
    if (msg.has_tokens()) {
      const v1::DecodeTokens& t = msg.tokens();
      for (int id : t.ids()) {
        if (id < 0 || id >= c_.config->vocab_size) {
          // Nothing of this message was sent: the request resumes after what the client has.
          ClearResponse();
          Report(a.decode_id, &failed_decode_);
          co_return grpc::Status(
              grpc::StatusCode::UNAVAILABLE,
              absl::StrFormat("decode worker %s sent token id %d, outside the vocabulary",
                              a.decode_id, id));
        }
      }
      for (int i = 0; i < t.ids_size() && !ended; ++i) {
        ended = AddToken(t.ids(i), i < t.logprobs_size() ? &t.logprobs(i) : nullptr);
      }
    } else if (msg.has_finished()) {
      // The decode worker ended on the same conditions the router checks; trust its reason only
      // if the router had not already ended.
      if (!finish_) finish_ = FinishReason::kLength;
      ended = true;
    }
    if (ended) {
      if (grpc::Status s = EndsWhole(); !s.ok()) co_return s;
      FinishResponse();
      if (!(co_await Write())) co_return ClientGone();
      co_return grpc::Status::OK;
    }
    if (resp_.token_ids_size() > 0 && !(co_await Write())) co_return ClientGone();
  }
  co_return co_await DecodeBroke(a);
}

async::Task<grpc::Status> GenerateTransaction::DecodeBroke(Attempt& a) {
  grpc::Status s = co_await a.decode->Finish(/*cancel=*/false);
  if (IsGone()) co_return ClientGone();
  if (preempted_.exchange(false)) {
    preempted_attempt_ = true;
    co_return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "another tenant took this request's place on the decode worker");
  }
  if (watch_->abandoned(a.decode->context())) {
    Report(a.decode_id, &failed_decode_);
    co_return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrFormat("decode worker %s turned unhealthy", a.decode_id));
  }
  if (s.ok()) {
    co_return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode stream ended without Finished");
  }
  if (WorkerFault(s)) Report(a.decode_id, &failed_decode_);
  co_return s;
}

async::Task<bool> GenerateTransaction::PrepareResume(grpc::Status s, int resumes, bool preempted,
                                                     grpc::Status* final_status) {
  if (IsGone()) {
    *final_status = ClientGone();
    co_return false;
  }
  if (!preempted && (!Resumable(s) || final_)) {
    *final_status = s;
    co_return false;
  }
  if (!preempted && resumes >= c_.options->max_resumes) {
    *final_status = grpc::Status(s.error_code(), absl::StrFormat("%s (gave up after %d resumes)",
                                                                 s.error_message(), resumes));
    co_return false;
  }
  // An attempt fails only between writes: every token in `generated_` reached the client, and
  // the resumed prompt ends with the last of them.
  ClearResponse();
  finish_.reset();
  if (preempted) co_return true;  // another tenant took its place: at once, not a fault
  if (c_.metrics) c_.metrics->resumes.Increment();
  // Back off a little (100 ms, doubling, at most 1 s): a worker that just came back needs a
  // heartbeat to be routable again.
  const absl::Time resume_at =
      std::min(call_.deadline, absl::Now() + absl::Milliseconds(100 << std::min(resumes, 3)));
  co_await Wait(WaitKind::kTime, 0, 0, resume_at);
  if (IsGone()) {
    *final_status = ClientGone();
    co_return false;
  }
  std::fprintf(stderr, "[tandem-router] %s: resuming after %d tokens (%s)\n", request_id_.c_str(),
               static_cast<int>(generated_.size()), s.error_message().c_str());
  co_return true;
}

void GenerateTransaction::TakeFairShareLocked(ClusterView::Locked& cluster) {
  for (const std::string& t : cluster.line().turns()) {
    if (t != call_.tenant && cluster.shares().FarBelow(t, call_.tenant)) {
      cluster.line().PassTurn();  // the poorer tenant looks first (and may take one of ours)
      cluster.Notify();
      return;
    }
  }
  if (preempting_ != 0 && cluster.streaming().count(preempting_) > 0) return;  // asked already
  preempting_ = 0;
  replacing_.clear();
  const std::optional<uint64_t> victim = cluster.shares().VictimFor(call_.tenant);
  if (!victim) return;
  auto it = cluster.streaming().find(*victim);
  if (it == cluster.streaming().end() || it->second->share_ctx_ == nullptr) return;
  preempting_ = *victim;
  replacing_ = it->second->request_id_;
  replacing_worker_ = it->second->share_worker_;
  it->second->preempted_ = true;
  it->second->share_ctx_->TryCancel();
}

void GenerateTransaction::JoinSharesLocked(Attempt& a, ClusterView::Locked& cluster) {
  share_id_ = cluster.NextShareId();
  share_ctx_ = a.decode->context();
  share_worker_ = a.decode_id;
  preempted_ = false;
  cluster.shares().Add(call_.tenant, share_id_);
  cluster.streaming()[share_id_] = this;
}

void GenerateTransaction::LeaveShares() {
  ClusterView::Locked cluster = c_.cluster->Lock();
  if (share_id_ == 0) return;
  cluster.shares().Remove(call_.tenant, share_id_);
  cluster.streaming().erase(share_id_);
  share_id_ = 0;
  share_ctx_ = nullptr;
  cluster.Notify();  // its room frees: the front of the line looks again
}

void GenerateTransaction::RecordSuccess() {
  RouterMetrics* m = c_.metrics;
  if (m == nullptr) return;
  const double e2e = Since(t0_);
  const int n = static_cast<int>(generated_.size());
  m->success(FinishReasonName(*finish_)).Increment();
  m->request_prompt_tokens.Observe(static_cast<double>(greq_->prompt.size()));
  m->request_generation_tokens.Observe(n);
  m->e2e_request_latency.Observe(e2e);
  if (n > 1) m->time_per_output_token.Observe((e2e - ttft_) / (n - 1));
  // vLLM's phases: from admission (its "scheduled") to the first token and on to the last.
  const double queue = absl::ToDoubleSeconds(admitted_at_ - t0_);
  m->request_prefill_time.Observe(std::max(0.0, ttft_ - queue));
  m->request_decode_time.Observe(std::max(0.0, e2e - ttft_));
  m->request_inference_time.Observe(std::max(0.0, e2e - queue));
  m->request_params_max_tokens.Observe(greq_->max_tokens);
}

bool GenerateTransaction::AddToken(int token, const v1::TokenLogprobs* logprobs) {
  generated_.push_back(token);
  const int n = static_cast<int>(generated_.size());
  resp_.add_token_ids(token);
  if (logprobs != nullptr && greq_->sampling.logprobs) *resp_.add_logprobs() = *logprobs;
  finish_ = CheckFinish(*c_.config, *greq_, token, n, prompt_len_ + n);
  if (finish_ == FinishReason::kStop) return true;  // EOS: no text
  bool stopped = false;
  resp_.mutable_text()->append(stop_->Add(detok_->Add(token), &stopped));
  if (stopped) finish_ = FinishReason::kStop;
  return finish_.has_value();
}

grpc::Status GenerateTransaction::EndsWhole() const {
  const OutputConstraint* c = greq_->sampling.constraint.get();
  if (c == nullptr || finish_ != FinishReason::kStop || generated_.empty()) {
    return grpc::Status::OK;
  }
  const std::vector<int>& eos = c_.config->eos_token_ids;
  std::span<const int> text(generated_);
  if (std::find(eos.begin(), eos.end(), text.back()) != eos.end())
    text = text.first(text.size() - 1);
  if (c->Completes(text)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      "structured output (sampling.json_schema, choice or regex): the model "
                      "ended its output before the value was complete (no token of its "
                      "vocabulary could continue it)");
}

void GenerateTransaction::FinishResponse() {
  if (*finish_ != FinishReason::kStop) {
    bool stopped = false;
    std::string tail = stop_->Add(detok_->Flush(), &stopped);
    if (!stopped) tail += stop_->Flush();
    resp_.mutable_text()->append(tail);
  }
  resp_.set_finish_reason(ToProto(*finish_));
  resp_.mutable_usage()->set_prompt_tokens(prompt_len_);
  resp_.mutable_usage()->set_completion_tokens(static_cast<int>(generated_.size()));
  v1::Timings* t = resp_.mutable_timings();
  t->set_queue_seconds(absl::ToDoubleSeconds(admitted_at_ - t0_));
  t->set_prefill_seconds(first_presp_.queue_seconds() + first_presp_.compute_seconds() +
                         first_presp_.kv_transfer_seconds());
  t->set_kv_transfer_seconds(first_presp_.kv_transfer_seconds());
  t->set_ttft_seconds(ttft_);
  t->set_e2e_seconds(Since(t0_));
}

async::Task<bool> GenerateTransaction::Write() {
  const bool sent = co_await async::Callback<bool>(
      c_.executor, [this](std::function<void(bool)> done) { call_.write(resp_, std::move(done)); });
  if (!sent) co_return false;
  const int n = resp_.token_ids_size();
  if (quota_ && n > 0) {
    ClusterView::Locked cluster = c_.cluster->Lock();
    cluster.quotas().Charge(call_.tenant, n, absl::Now());
  }
  ClearResponse();
  RouterMetrics* m = c_.metrics;
  if (m == nullptr || n == 0) co_return true;
  const absl::Time now = absl::Now();
  if (last_token_at_ == absl::Time()) {
    m->time_to_first_token.Observe(ttft_);
    phase_->Running();  // the first message holds the first token only
  } else {
    const double each = absl::ToDoubleSeconds(now - last_token_at_) / n;
    for (int i = 0; i < n; ++i) m->inter_token_latency.Observe(each);
  }
  last_token_at_ = now;
  m->generation_tokens.Increment(n);
  co_return true;
}

void GenerateTransaction::ClearResponse() {
  resp_.Clear();
  resp_.set_request_id(client_id_);
}

grpc::Status GenerateTransaction::ClientGone() const {
  if (absl::Now() + absl::Milliseconds(50) >= call_.deadline) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

bool GenerateTransaction::IsGone() {
  return (call_.gone && call_.gone->fired()) || absl::Now() >= call_.deadline;
}

void GenerateTransaction::Report(const std::string& worker, std::set<std::string>* failed) {
  failed->insert(worker);
  ClusterView::Locked cluster = c_.cluster->Lock();
  cluster.registry().ReportFailure(worker, absl::Now());
}

}  // namespace tandem::router_internal
