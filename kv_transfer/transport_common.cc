#include "kv_transfer/transport_common.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "lib/crc32c/crc32c.h"

namespace tandem {
namespace {

// Debian's absl has its own string_view type.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

bool operator==(const KvTarget& a, const KvTarget& b) {
  return a.endpoint == b.endpoint && a.lease_id == b.lease_id && a.generation == b.generation &&
         a.capability == b.capability;
}

absl::StatusOr<KvEndpoint> ParseTcpAddress(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv endpoint: \"%s\" is not HOST:PORT", address));
  }
  int port = 0;
  if (!absl::SimpleAtoi(ToAbsl(address.substr(colon + 1)), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat("kv endpoint: bad port in \"%s\"", address));
  }
  std::string_view host = address.substr(0, colon);
  // IPv6 literals are written in brackets: [::1]:PORT.
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  KvEndpoint e;
  e.kind = "tcp";
  e.host = std::string(host);
  e.port = port;
  return e;
}

absl::StatusOr<KvEndpoint> ParseKvEndpoint(std::string_view endpoint) {
  if (endpoint.starts_with("tcp://")) return ParseTcpAddress(endpoint.substr(6));
  if (endpoint.starts_with("nccl://")) {
    absl::StatusOr<KvEndpoint> e = ParseTcpAddress(endpoint.substr(7));
    if (!e.ok()) return e.status();
    e->kind = "nccl";
    e->name = std::string(endpoint.substr(7));  // the decode worker's gRPC address
    return e;
  }
  if (endpoint.starts_with("local://") && endpoint.size() > 8) {
    KvEndpoint e;
    e.kind = "local";
    e.name = std::string(endpoint.substr(8));
    return e;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "kv endpoint: \"%s\" is not tcp://HOST:PORT, local://NAME or nccl://HOST:PORT", endpoint));
}

absl::StatusOr<KvOutgoingChunk> KvSendTracker::Begin(const KvTarget& target,
                                                     const KvChunkHeader& header,
                                                     std::string payload) {
  KvOutgoingChunk out;
  out.chunk = header;
  out.chunk.lease_id = target.lease_id;
  out.chunk.generation = target.generation;
  out.chunk.capability = target.capability;
  absl::StatusOr<uint64_t> want = KvChunkPayloadBytes(out.chunk, options_.max_frame_bytes);
  if (!want.ok()) return want.status();
  if (*want != payload.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv send: payload has %d bytes, header says %d", payload.size(), *want));
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = targets_.try_emplace(KeyOf(target));
  if (inserted) it->second = std::make_shared<KvTargetState>();
  if (!it->second->first_error.ok()) return it->second->first_error;
  if (queued_bytes_ + payload.size() > options_.max_queued_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "kv send: %d bytes already queued, limit %d", queued_bytes_, options_.max_queued_bytes));
  }
  const int64_t index = next_chunk_index_.fetch_add(1);
  if (index == options_.corrupt_chunk_index) out.fault = KvFault::kCorrupt;
  if (index == options_.drop_chunk_index) out.fault = KvFault::kDrop;
  if (options_.corrupt_every > 0 && (index + 1) % options_.corrupt_every == 0) {
    out.fault = KvFault::kCorrupt;
  }
  if (options_.drop_every > 0 && (index + 1) % options_.drop_every == 0) {
    out.fault = KvFault::kDrop;
  }
  ++it->second->pending;
  queued_bytes_ += payload.size();
  out.state = it->second;
  out.payload = std::move(payload);
  return out;
}

absl::StatusOr<KvSendTracker::Started> KvSendTracker::BeginSend(std::string_view kind,
                                                                const KvTarget& target,
                                                                const KvChunkHeader& header,
                                                                std::string payload) {
  absl::StatusOr<KvEndpoint> ep = ParseKvEndpoint(target.endpoint);
  if (!ep.ok()) return ep.status();
  if (ep->kind != kind) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv %s sender: cannot reach %s: that decode worker uses --kv-transport=%s "
                        "and this prefill worker %s (every worker of a cluster must use the same)",
                        kind, target.endpoint, ep->kind, kind));
  }
  absl::StatusOr<KvOutgoingChunk> out = Begin(target, header, std::move(payload));
  if (!out.ok()) return out.status();
  Started started{*std::move(ep), std::nullopt};
  if (out->fault == KvFault::kDrop) {
    Dequeued(out->payload.size());
  } else {
    started.chunk = *std::move(out);
  }
  return started;
}

absl::Status KvSendTracker::Abandon(const KvOutgoingChunk& chunk, absl::Status why) {
  Dequeued(chunk.payload.size());
  Complete(*chunk.state, why);
  return why;
}

void KvSendTracker::Dequeued(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  queued_bytes_ -= bytes;
}

void KvSendTracker::Complete(KvTargetState& state, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  --state.pending;
  if (state.first_error.ok() && !status.ok()) state.first_error = status;
}

absl::Status KvSendTracker::SkipReason(const KvTargetState& state) const {
  absl::MutexLock lock(&mu_);
  if (state.forgotten) return absl::CancelledError("kv send: target forgotten");
  return state.first_error;
}

absl::Status KvSendTracker::Wait(const KvTarget& target, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = targets_.find(KeyOf(target));
  if (it == targets_.end()) {
    return absl::NotFoundError(absl::StrFormat("kv send: nothing sent to lease %d gen %d at %s",
                                               target.lease_id, target.generation,
                                               target.endpoint));
  }
  std::shared_ptr<KvTargetState> s = it->second;
  auto settled = [&s]() { return s->pending == 0 || !s->first_error.ok(); };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  if (!s->first_error.ok()) return s->first_error;
  if (s->pending == 0) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrFormat("kv send: lease %d gen %d: %d chunks unacknowledged at the deadline",
                      target.lease_id, target.generation, s->pending));
}

void KvSendTracker::Forget(const KvTarget& target) {
  absl::MutexLock lock(&mu_);
  auto it = targets_.find(KeyOf(target));
  if (it == targets_.end()) return;
  it->second->forgotten = true;
  targets_.erase(it);
}

size_t KvSendTracker::num_targets() const {
  absl::MutexLock lock(&mu_);
  return targets_.size();
}

absl::Status DeliverKvChunk(KvSink* sink, const KvFrameHeader& h, std::span<const char> payload) {
  if (Crc32c(payload) != h.payload_crc) {
    return absl::DataLossError(absl::StrFormat(
        "kv chunk: payload checksum mismatch (lease %d layer %d tokens [%d, %d))", h.chunk.lease_id,
        h.chunk.layer, h.chunk.token_start, uint64_t{h.chunk.token_start} + h.chunk.token_count));
  }
  return sink->Accept(h.chunk, payload);
}

void CorruptKvPayload(std::string* payload) {
  if (!payload->empty()) (*payload)[payload->size() / 2] ^= 0x5A;
}

}  // namespace tandem
