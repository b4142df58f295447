#include "kv_transfer/nccl/nccl_kv.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace tandem {

NcclKvSender::NcclKvSender(CommunicatorFactory* factory, NcclBootstrapFn bootstrap,
                           const NcclKvOptions& options)
    : factory_(factory),
      bootstrap_(std::move(bootstrap)),
      options_(options),
      pool_(options.pool),
      thread_([this] { Run(); }) {}

NcclKvSender::~NcclKvSender() { Shutdown(); }

absl::StatusOr<uint64_t> NcclKvSender::Submit(const std::string& peer,
                                              std::vector<NcclKvLayer> layers, absl::Time deadline,
                                              DoneFn on_done, SkipFn skip) {
  if (peer.empty()) return absl::InvalidArgumentError("nccl kv transfer: peer is empty");
  if (layers.empty()) return absl::InvalidArgumentError("nccl kv transfer: no layers");
  auto t = std::make_shared<Transfer>();
  t->peer = peer;
  t->deadline = deadline;
  t->on_done = std::move(on_done);
  t->skip = std::move(skip);
  for (size_t i = 0; i < layers.size(); ++i) {
    absl::StatusOr<KvFrameHeader> h = MakeNcclLayerHeader(
        layers[i].chunk, layers[i].payload, options_.checksum_payload, options_.max_payload_bytes);
    if (!h.ok()) {
      return absl::Status(h.status().code(), absl::StrFormat("nccl kv transfer: layers[%d]: %s", i,
                                                             h.status().message()));
    }
    t->prepared.push_back(*h);
  }
  t->layers = std::move(layers);
  t->headers.resize(t->layers.size());

  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::FailedPreconditionError("nccl kv sender is shut down");
  absl::StatusOr<NcclCommPool::Entry*> entry = pool_.Pick(peer);
  if (!entry.ok()) return entry.status();
  if (*entry == nullptr) {
    // Bootstrap outside the lock: the RPC may take a while, the progress thread goes on.
    mu_.Unlock();
    absl::StatusOr<std::unique_ptr<Communicator>> comm = [&]() -> decltype(comm) {
      absl::StatusOr<NcclUniqueId> id = bootstrap_(peer);
      if (!id.ok()) {
        return absl::Status(id.status().code(), absl::StrFormat("nccl kv bootstrap with %s: %s",
                                                                peer, id.status().message()));
      }
      return factory_->InitRank(*id, 2, kNcclPrefillRank);
    }();
    mu_.Lock();
    if (!comm.ok()) return comm.status();
    if (shutdown_) {
      (*comm)->Abort();
      return absl::FailedPreconditionError("nccl kv sender is shut down");
    }
    *entry = pool_.Add(peer, std::move(*comm), absl::Now());
    channels_[(*entry)->id];
  }
  NcclCommPool::Entry* e = *entry;
  e->active++;
  e->last_used = absl::Now();
  t->id = next_transfer_id_++;
  t->comm_id = e->id;
  channels_[e->id].queue.push_back(t);
  if (!t->on_done) transfers_[t->id] = t;
  return t->id;
}

absl::Status NcclKvSender::Wait(uint64_t id, absl::Time wait_deadline) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrFormat("nccl kv transfer %d: unknown", id));
  }
  std::shared_ptr<Transfer> t = it->second;
  mu_.AwaitWithDeadline(absl::Condition(&t->done), wait_deadline);
  if (!t->done) {
    return absl::DeadlineExceededError(
        absl::StrFormat("nccl kv transfer %d: still running when the wait ended", id));
  }
  transfers_.erase(id);
  return t->status;
}

void NcclKvSender::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!shutdown_) {
      shutdown_ = true;
      for (auto& [id, ch] : channels_) {
        for (auto& t : ch.queue) Finish(*t, absl::CancelledError("nccl kv sender shut down"));
      }
      channels_.clear();
      pool_.AbortAll();
    }
  }
  if (thread_.joinable()) thread_.join();
}

size_t NcclKvSender::num_transfers() const {
  absl::MutexLock lock(&mu_);
  return transfers_.size();
}
size_t NcclKvSender::num_comms() const {
  absl::MutexLock lock(&mu_);
  return pool_.size();
}
uint64_t NcclKvSender::bootstraps() const {
  absl::MutexLock lock(&mu_);
  return pool_.bootstraps();
}
uint64_t NcclKvSender::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}

void NcclKvSender::Run() {
  absl::MutexLock lock(&mu_);
  while (!shutdown_) {
    Step(absl::Now());
    mu_.AwaitWithTimeout(absl::Condition(&shutdown_), options_.poll_interval);
  }
}

void NcclKvSender::Finish(Transfer& t, absl::Status status) {
  t.done = true;
  t.status = std::move(status);
  if (t.on_done) {
    DoneFn done = std::move(t.on_done);
    t.on_done = nullptr;
    done(t.status);
  }
}

void NcclKvSender::FailComm(uint64_t comm_id, const absl::Status& cause) {
  NcclCommPool::Entry* e = pool_.Find(comm_id);
  const std::string peer = e != nullptr ? e->peer : "?";
  pool_.Invalidate(comm_id);  // ncclCommAbort
  ++aborts_;
  auto it = channels_.find(comm_id);
  if (it == channels_.end()) return;
  bool head = true;
  for (auto& t : it->second.queue) {
    if (head) {
      Finish(*t, cause);
    } else {
      Finish(*t, absl::UnavailableError(absl::StrFormat(
                     "nccl kv transfer %d: communicator %d to %s aborted because transfer %d "
                     "failed: %s",
                     t->id, comm_id, peer, it->second.queue.front()->id, cause.message())));
    }
    head = false;
  }
  channels_.erase(it);
}

void NcclKvSender::Step(absl::Time now) {
  for (NcclCommPool::Entry* e : pool_.entries()) {
    const uint64_t comm_id = e->id;
    Channel& ch = channels_[comm_id];
    // Transfers waiting behind another one fail alone when their deadline passes.
    for (auto it = ch.queue.begin(); it != ch.queue.end();) {
      Transfer& t = **it;
      const bool started = it == ch.queue.begin() && t.next_layer > 0;
      if (!started && now > t.deadline && it != ch.queue.begin()) {
        Finish(t, absl::DeadlineExceededError(absl::StrFormat(
                      "nccl kv transfer %d to %s: deadline passed while queued behind another "
                      "transfer",
                      t.id, t.peer)));
        it = ch.queue.erase(it);
        e->active--;
      } else {
        ++it;
      }
    }
    absl::StatusOr<CommPoll> poll = e->comm->Poll();
    if (ch.queue.empty()) {
      // An idle communicator whose peer went away leaves the pool now, not on its next use.
      if (!poll.ok()) FailComm(comm_id, poll.status());
      continue;
    }
    if (!poll.ok()) {
      FailComm(comm_id, absl::UnavailableError(absl::StrFormat(
                            "nccl kv transfer %d to %s: communicator failed: %s",
                            ch.queue.front()->id, e->peer, poll.status().message())));
      continue;
    }
    Transfer* head = ch.queue.front().get();
    if (now > head->deadline) {
      FailComm(comm_id,
               absl::DeadlineExceededError(absl::StrFormat(
                   "nccl kv transfer %d to %s: deadline passed with %d of %d layers posted%s; "
                   "communicator aborted",
                   head->id, head->peer, head->next_layer, head->layers.size(),
                   head->next_layer == 0 ? " (communicator still initialising)" : "")));
      continue;
    }
    if (*poll == CommPoll::kPending) continue;
    if (ch.posted) {  // the head's last posted layer completed
      ch.posted = false;
      if (head->next_layer == head->layers.size()) {
        Finish(*head, absl::OkStatus());
        ch.queue.pop_front();
        e->active--;
        e->last_used = now;
        // The next one starts now, unless its deadline passed while it waited (it fails alone:
        // nothing of it is on the wire).
        while (!ch.queue.empty() && now > ch.queue.front()->deadline) {
          Transfer& t = *ch.queue.front();
          Finish(t, absl::DeadlineExceededError(absl::StrFormat(
                        "nccl kv transfer %d to %s: deadline passed while queued behind another "
                        "transfer",
                        t.id, t.peer)));
          ch.queue.pop_front();
          e->active--;
        }
        if (ch.queue.empty()) continue;
        head = ch.queue.front().get();
      }
    }
    if (head->next_layer == 0 && head->skip) {
      if (absl::Status why = head->skip(); !why.ok()) {
        // Nothing of it is on the wire: it leaves alone; the next one starts on the next step.
        Finish(*head, std::move(why));
        ch.queue.pop_front();
        e->active--;
        continue;
      }
    }
    const size_t i = head->next_layer;
    head->headers[i] = EncodeNcclLayerHeader(head->prepared[i], ch.seq);
    absl::Status s = e->comm->GroupStart();
    if (s.ok()) s = e->comm->Send(head->headers[i], kNcclDecodeRank);
    if (s.ok()) s = e->comm->Send(head->layers[i].payload, kNcclDecodeRank);
    absl::Status end = e->comm->GroupEnd();  // always close the group
    if (s.ok()) s = end;
    if (!s.ok()) {
      FailComm(comm_id, absl::UnavailableError(absl::StrFormat(
                            "nccl kv transfer %d to %s: posting layer %d: %s", head->id, head->peer,
                            head->layers[i].chunk.layer, s.message())));
      continue;
    }
    ch.seq++;
    head->next_layer++;
    ch.posted = true;
  }
  const int evicted = pool_.EvictIdle(now);
  if (evicted > 0) {
    for (auto it = channels_.begin(); it != channels_.end();) {
      if (pool_.Find(it->first) == nullptr) {
        channels_.erase(it++);
      } else {
        ++it;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

NcclKvReceiver::NcclKvReceiver(CommunicatorFactory* factory, NcclKvSink* sink,
                               const NcclKvOptions& options)
    : factory_(factory), sink_(sink), options_(options), thread_([this] { Run(); }) {}

NcclKvReceiver::~NcclKvReceiver() { Shutdown(); }

absl::StatusOr<NcclUniqueId> NcclKvReceiver::Bootstrap(const std::string& peer) {
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(channels_.size()) >= options_.max_receiver_comms) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("nccl kv receiver: %d communicators already (the limit); bootstrap "
                          "from %s refused",
                          channels_.size(), peer));
    }
  }
  absl::StatusOr<NcclUniqueId> id = factory_->NewUniqueId();
  if (!id.ok()) return id.status();
  absl::StatusOr<std::unique_ptr<Communicator>> comm = factory_->InitRank(*id, 2, kNcclDecodeRank);
  if (!comm.ok()) return comm.status();
  absl::MutexLock lock(&mu_);
  if (shutdown_) {
    (*comm)->Abort();
    return absl::FailedPreconditionError("nccl kv receiver is shut down");
  }
  auto ch = std::make_unique<Channel>();
  ch->peer = peer;
  ch->comm = std::move(*comm);
  ch->stage_deadline = absl::Now() + options_.receiver_init_timeout;
  channels_[next_id_++] = std::move(ch);
  return *id;
}

void NcclKvReceiver::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!shutdown_) {
      shutdown_ = true;
      std::vector<uint64_t> ids;
      for (auto& [id, ch] : channels_) ids.push_back(id);
      for (uint64_t id : ids) Abort(id, absl::CancelledError("nccl kv receiver shut down"));
    }
  }
  if (thread_.joinable()) thread_.join();
}

size_t NcclKvReceiver::num_comms() const {
  absl::MutexLock lock(&mu_);
  return channels_.size();
}
uint64_t NcclKvReceiver::chunks_delivered() const {
  absl::MutexLock lock(&mu_);
  return delivered_;
}
uint64_t NcclKvReceiver::chunks_failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}
uint64_t NcclKvReceiver::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}

void NcclKvReceiver::Run() {
  absl::MutexLock lock(&mu_);
  while (!shutdown_) {
    Step(absl::Now());
    mu_.AwaitWithTimeout(absl::Condition(&shutdown_), options_.poll_interval);
  }
}

void NcclKvReceiver::Abort(uint64_t id, const absl::Status& cause) {
  auto it = channels_.find(id);
  if (it == channels_.end()) return;
  Channel& ch = *it->second;
  if (ch.posted && ch.stage == Stage::kPayload && !ch.refused) {
    sink_->Failed(ch.header.chunk, ch.destination, cause);
    ++failed_;
  }
  ch.comm->Abort();
  ++aborts_;
  channels_.erase(it);
}

void NcclKvReceiver::Step(absl::Time now) {
  std::vector<uint64_t> ids;
  for (auto& [id, ch] : channels_) ids.push_back(id);
  for (uint64_t id : ids) {
    Channel& ch = *channels_[id];
    absl::StatusOr<CommPoll> poll = ch.comm->Poll();
    if (!poll.ok()) {
      Abort(id, absl::UnavailableError(absl::StrFormat("nccl kv communicator with %s failed: %s",
                                                       ch.peer, poll.status().message())));
      continue;
    }
    if (*poll == CommPoll::kPending) {
      if (now > ch.stage_deadline) {
        Abort(
            id,
            absl::DeadlineExceededError(
                ch.stage == Stage::kPayload
                    ? absl::StrFormat("nccl kv: payload of request %d layer %d from %s did "
                                      "not arrive in time; communicator aborted",
                                      ch.header.chunk.request_id, ch.header.chunk.layer, ch.peer)
                : !ch.initialised
                    ? absl::StrFormat("nccl kv: %s did not join within %s of its bootstrap; "
                                      "communicator aborted",
                                      ch.peer, absl::FormatDuration(options_.receiver_init_timeout))
                    : absl::StrFormat("nccl kv: nothing from %s for %s; communicator aborted",
                                      ch.peer,
                                      absl::FormatDuration(options_.receiver_idle_timeout))));
      }
      continue;
    }
    if (ch.posted && ch.stage == Stage::kHeader) {
      absl::StatusOr<KvFrameHeader> h =
          DecodeNcclLayerHeader(ch.header_buf, ch.seq, options_.max_payload_bytes);
      if (!h.ok()) {
        Abort(id, absl::Status(h.status().code(),
                               absl::StrFormat("nccl kv header from %s: %s; communicator aborted",
                                               ch.peer, h.status().message())));
        continue;
      }
      ch.seq++;
      ch.header = *h;
      absl::StatusOr<std::span<char>> dest = sink_->Destination(h->chunk);
      ch.refused = !dest.ok() || dest->size() != h->payload_length;
      if (ch.refused) {
        ch.refusal = !dest.ok() ? dest.status()
                                : absl::InternalError(absl::StrFormat(
                                      "nccl kv sink gave %d bytes for a %d-byte payload",
                                      dest->size(), h->payload_length));
        ch.scratch.resize(h->payload_length);
        ch.destination = std::span<char>(ch.scratch);
      } else {
        ch.destination = *dest;
      }
      absl::Status s = ch.comm->Recv(ch.destination, kNcclPrefillRank);
      if (!s.ok()) {
        Abort(id, s);
        continue;
      }
      ch.stage = Stage::kPayload;
      ch.stage_deadline = now + options_.payload_timeout;
      continue;
    }
    if (ch.posted && ch.stage == Stage::kPayload) {
      if (ch.refused) {
        sink_->Failed(ch.header.chunk, {}, ch.refusal);
        ++failed_;
      } else if (absl::Status v =
                     VerifyNcclPayload(ch.header, ch.destination, options_.checksum_payload);
                 !v.ok()) {
        sink_->Failed(ch.header.chunk, ch.destination, v);
        ++failed_;
      } else {
        sink_->Deliver(ch.header.chunk, ch.destination);
        ++delivered_;
      }
      ch.scratch.clear();
      ch.scratch.shrink_to_fit();
      ch.stage = Stage::kHeader;
      ch.posted = false;
    }
    // Idle (just initialised, or a payload done): wait for the next header.
    absl::Status s = ch.comm->Recv(ch.header_buf, kNcclPrefillRank);
    if (!s.ok()) {
      Abort(id, s);
      continue;
    }
    ch.stage = Stage::kHeader;
    ch.posted = true;
    ch.initialised = true;
    ch.stage_deadline = now + options_.receiver_idle_timeout;
  }
}

}  // namespace tandem
