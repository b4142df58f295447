// The NCCL KV transport behind the KvSender / KvReceiver interfaces (kv_transfer/kv_transfer.h),
// so the prefill and decode engines use it like tcp and local:
//
//   prefill: KvSender::Send(target "nccl://D:PORT", chunk, host payload)
//              -> KvStaging::StageForSend (pinned host -> device buffer)
//              -> NcclKvSender::Submit to peer "D:PORT" (bootstrapping a communicator through
//                 the NcclBootstrap RPC of the decode worker at D:PORT when the pool has none)
//              -> on completion: the buffer is returned, the target's pending count drops.
//   decode:  the DecodeWorker service's NcclBootstrap RPC -> NcclKvTransportReceiver::Bootstrap;
//            NcclKvReceiver -> Destination (device buffer) -> ncclRecv -> KvStaging::Deliver
//              (device -> pinned host -> KvSink::Accept).
//
// NCCL has no ACK: a send completes once the decode received the bytes, so Wait on the prefill
// reports transport errors (the watchdog's DEADLINE_EXCEEDED or UNAVAILABLE) but not the sink's
// verdict. A chunk the decode could not deliver reaches KvSink::Undeliverable, which fails the
// request there; the router sees it on the decode's stream (Start fails).
#ifndef TANDEM_KV_TRANSFER_NCCL_NCCL_TRANSPORT_H_
#define TANDEM_KV_TRANSFER_NCCL_NCCL_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kv_transfer/kv_transfer.h"
#include "kv_transfer/nccl/communicator.h"
#include "kv_transfer/nccl/nccl_kv.h"
#include "kv_transfer/nccl/staging.h"

namespace tandem {

// What a worker needs to run the NCCL transport: the communicators and the staging memory.
struct NcclTransportParts {
  std::shared_ptr<CommunicatorFactory> factory;
  std::shared_ptr<KvStaging> staging;
  NcclKvOptions options;  // options.checksum_payload is forced off without host-visible staging
};

// The real parts on CUDA device `device`: libtandem_nccl.so (dlopen) and device staging.
// FAILED_PRECONDITION naming --kv-transport=nccl and what is missing (the library, libnccl, a
// CUDA device) — never a hang.
absl::StatusOr<NcclTransportParts> LoadNcclTransport(int device);

// The prefill side. `bootstrap` calls the NcclBootstrap RPC of the decode worker whose gRPC
// address ("HOST:PORT") it is given. INVALID_ARGUMENT when `options` asks for payload
// corruption faults (no checksum on device memory: the receiver could not tell).
// A chunk's transfer must finish within options.io_timeout of Send, or the watchdog aborts its
// communicator.
class NcclKvTransportSender : public KvSender {
 public:
  // The leak check and the tests' view.
  virtual size_t num_comms() const = 0;
  virtual uint64_t bootstraps() const = 0;
  virtual uint64_t aborts() const = 0;
  virtual int64_t staging_buffers_in_use() const = 0;
};
absl::StatusOr<std::unique_ptr<NcclKvTransportSender>> MakeNcclKvSender(
    NcclTransportParts parts, NcclBootstrapFn bootstrap, const KvSenderOptions& options = {});

// The decode side: a KvReceiver plus the NcclBootstrap handler.
class NcclKvTransportReceiver : public KvReceiver {
 public:
  // The NcclBootstrap RPC: a unique id whose rank 0 this worker has started.
  virtual absl::StatusOr<NcclUniqueId> Bootstrap(const std::string& prefill_worker) = 0;
  // The decode worker's gRPC address ("HOST:PORT", known once its server is bound): endpoint()
  // is "nccl://" + it, and empty before.
  virtual void SetBootstrapAddress(const std::string& host_port) = 0;
  // The leak check and the tests' view.
  virtual size_t num_comms() const = 0;
  virtual int64_t staging_buffers_in_use() const = 0;
  virtual uint64_t chunks_delivered() const = 0;
  virtual uint64_t chunks_failed() const = 0;
};

// `sink` must outlive the receiver's Shutdown.
std::unique_ptr<NcclKvTransportReceiver> MakeNcclKvReceiver(NcclTransportParts parts, KvSink* sink);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_NCCL_NCCL_TRANSPORT_H_
