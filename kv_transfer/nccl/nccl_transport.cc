#include "kv_transfer/nccl/nccl_transport.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/nccl/nccl_loader.h"
#include "kv_transfer/transport_common.h"

namespace tandem {

absl::StatusOr<NcclTransportParts> LoadNcclTransport(int device) {
  absl::StatusOr<const TandemNcclApi*> api = LoadNcclApi();
  if (!api.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--kv-transport=nccl needs libtandem_nccl.so (built with -DTANDEM_CUDA=ON where NCCL is "
        "installed; found next to the binary or through $TANDEM_NCCL_LIB), libnccl and a CUDA "
        "device: %s",
        api.status().message()));
  }
  const int devices = (*api)->device_count();
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "--kv-transport=nccl needs a CUDA device: libtandem_nccl.so loaded but no device is "
        "visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)");
  }
  absl::StatusOr<std::unique_ptr<CommunicatorFactory>> factory =
      MakeNcclCommunicatorFactory(device);
  if (!factory.ok()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("--kv-transport=nccl: %s", factory.status().message()));
  }
  NcclTransportParts parts;
  parts.factory = std::move(*factory);
  parts.staging = MakeDeviceKvStaging(*api, device);
  parts.options.checksum_payload = false;  // the payload is in device memory
  return parts;
}

namespace {

class SenderImpl final : public NcclKvTransportSender {
 public:
  SenderImpl(NcclTransportParts parts, NcclBootstrapFn bootstrap, const KvSenderOptions& options)
      : parts_(std::move(parts)),
        options_(options),
        tracker_(options),
        nccl_(parts_.factory.get(), std::move(bootstrap), parts_.options) {}
  ~SenderImpl() override { Shutdown(); }

  absl::Status Send(const KvTarget& target, const KvChunkHeader& header,
                    std::string payload) override {
    absl::StatusOr<KvSendTracker::Started> started =
        tracker_.BeginSend("nccl", target, header, std::move(payload));
    if (!started.ok()) return started.status();
    if (!started->chunk) return absl::OkStatus();  // dropped by fault injection
    KvOutgoingChunk& c = *started->chunk;
    absl::StatusOr<std::unique_ptr<StagedKv>> staged =
        parts_.staging->StageForSend(c.chunk, c.payload);
    if (!staged.ok()) {
      return tracker_.Abandon(
          c, absl::Status(staged.status().code(),
                          absl::StrFormat("kv nccl send to %s: %s", target.endpoint,
                                          staged.status().message())));
    }
    std::shared_ptr<StagedKv> buffer(std::move(*staged));
    const uint64_t bytes = c.payload.size();
    std::vector<NcclKvLayer> layers = {{c.chunk, buffer->data()}};
    absl::StatusOr<uint64_t> id = nccl_.Submit(
        started->endpoint.name, std::move(layers), absl::Now() + options_.io_timeout,
        [this, buffer, state = c.state, bytes](const absl::Status& s) mutable {
          buffer.reset();  // back to the staging pool: nothing reads it any more
          tracker_.Dequeued(bytes);
          tracker_.Complete(*state, s);
        },
        // A chunk of a forgotten or failed target is not sent: the prefill gave up.
        [this, state = c.state] { return tracker_.SkipReason(*state); });
    if (!id.ok()) return tracker_.Abandon(c, id.status());
    return absl::OkStatus();
  }

  absl::Status Wait(const KvTarget& target, absl::Time deadline) override {
    return tracker_.Wait(target, deadline);
  }
  void Forget(const KvTarget& target) override { tracker_.Forget(target); }
  size_t num_targets() const override { return tracker_.num_targets(); }
  void Shutdown() override { nccl_.Shutdown(); }

  size_t num_comms() const override { return nccl_.num_comms(); }
  uint64_t bootstraps() const override { return nccl_.bootstraps(); }
  uint64_t aborts() const override { return nccl_.aborts(); }
  int64_t staging_buffers_in_use() const override { return parts_.staging->buffers_in_use(); }

 private:
  const NcclTransportParts parts_;
  const KvSenderOptions options_;
  KvSendTracker tracker_;
  NcclKvSender nccl_;  // last: its thread and callbacks use the members above
};

class ReceiverImpl final : public NcclKvTransportReceiver, private NcclKvSink {
 public:
  ReceiverImpl(NcclTransportParts parts, KvSink* sink)
      : parts_(std::move(parts)), sink_(sink), nccl_(parts_.factory.get(), this, parts_.options) {}
  ~ReceiverImpl() override { Shutdown(); }

  std::string endpoint() const override {
    absl::MutexLock lock(&mu_);
    return address_.empty() ? "" : "nccl://" + address_;
  }
  void Shutdown() override { nccl_.Shutdown(); }
  absl::StatusOr<NcclUniqueId> Bootstrap(const std::string& prefill_worker) override {
    return nccl_.Bootstrap(prefill_worker);
  }
  void SetBootstrapAddress(const std::string& host_port) override {
    absl::MutexLock lock(&mu_);
    address_ = host_port;
  }
  size_t num_comms() const override { return nccl_.num_comms(); }
  int64_t staging_buffers_in_use() const override { return parts_.staging->buffers_in_use(); }
  uint64_t chunks_delivered() const override { return nccl_.chunks_delivered(); }
  uint64_t chunks_failed() const override { return nccl_.chunks_failed(); }

 private:
  // NcclKvSink, on the receiver's progress thread.
  absl::StatusOr<std::span<char>> Destination(const KvChunkHeader& h) override {
    absl::StatusOr<uint64_t> bytes = KvChunkPayloadBytes(h, parts_.options.max_payload_bytes);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::unique_ptr<StagedKv>> buffer = parts_.staging->ReceiveBuffer(h, *bytes);
    if (!buffer.ok()) return buffer.status();
    std::span<char> data = (*buffer)->data();
    absl::MutexLock lock(&mu_);
    buffers_[data.data()] = std::move(*buffer);
    return data;
  }
  void Deliver(const KvChunkHeader& h, std::span<const char> payload) override {
    std::unique_ptr<StagedKv> buffer = Take(payload.data());
    absl::Status s = buffer != nullptr
                         ? parts_.staging->Deliver(h, *buffer, sink_)
                         : absl::InternalError("kv nccl receiver: payload in an unknown buffer");
    buffer.reset();
    if (!s.ok()) sink_->Undeliverable(h, s);
  }
  void Failed(const KvChunkHeader& h, std::span<char> destination,
              const absl::Status& status) override {
    if (!destination.empty()) Take(destination.data());
    sink_->Undeliverable(h, status);
  }
  std::unique_ptr<StagedKv> Take(const char* data) {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(data);
    if (it == buffers_.end()) return nullptr;
    std::unique_ptr<StagedKv> b = std::move(it->second);
    buffers_.erase(it);
    return b;
  }

  const NcclTransportParts parts_;
  KvSink* const sink_;
  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  // Receive buffers handed to NCCL, by address.
  absl::flat_hash_map<const char*, std::unique_ptr<StagedKv>> buffers_ ABSL_GUARDED_BY(mu_);
  NcclKvReceiver nccl_;  // last: its thread calls the sink methods above
};

NcclTransportParts Agree(NcclTransportParts parts) {
  // Payload checksums need host-visible transfer memory; both sides derive the same setting.
  if (!parts.staging->host_visible()) parts.options.checksum_payload = false;
  return parts;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclKvTransportSender>> MakeNcclKvSender(
    NcclTransportParts parts, NcclBootstrapFn bootstrap, const KvSenderOptions& options) {
  if (parts.factory == nullptr || parts.staging == nullptr || bootstrap == nullptr) {
    return absl::InvalidArgumentError("kv nccl sender: factory, staging and bootstrap required");
  }
  if (options.corrupt_chunk_index >= 0 || options.corrupt_every > 0) {
    return absl::InvalidArgumentError(
        "kv nccl sender: payload corruption faults are tcp/local only (no payload checksum on "
        "device memory, the receiver could not tell)");
  }
  return std::make_unique<SenderImpl>(Agree(std::move(parts)), std::move(bootstrap), options);
}

std::unique_ptr<NcclKvTransportReceiver> MakeNcclKvReceiver(NcclTransportParts parts,
                                                            KvSink* sink) {
  return std::make_unique<ReceiverImpl>(Agree(std::move(parts)), sink);
}

}  // namespace tandem
