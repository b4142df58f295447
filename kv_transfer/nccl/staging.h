// Staging for the NCCL KV transport: NCCL sends from and receives into device memory, while the
// engine packs KV on the host today (kv_transfer/kv_pack.h). KvStaging is the seam between the
// two:
//
//   prefill: host payload -> pinned host buffer -> device buffer -> ncclSend      (StageForSend)
//   decode:  ncclRecv -> device buffer -> pinned host buffer -> KvSink::Accept    (Deliver)
//
// Once the engine keeps KV on the device, a staging that packs straight from the device cache
// into the send buffer (and scatters from the receive buffer into it) replaces the host copies
// behind the same interface; the transport does not change.
//
// Buffers come from StagingPool (size classes, reused), because cudaMalloc and cudaHostAlloc
// synchronise the device and cost far more than the copy of one chunk.
#ifndef TANDEM_KV_TRANSFER_NCCL_STAGING_H_
#define TANDEM_KV_TRANSFER_NCCL_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/kv_transfer.h"
#include "kv_transfer/nccl/nccl_api.h"
#include "kv_transfer/wire.h"

namespace tandem {

// Reusable raw buffers in power-of-two size classes (at least 4 KiB) from an allocator: device
// memory, pinned host memory, or plain host memory in tests. Thread-safe. Free buffers beyond
// `max_cached_bytes` go back to the allocator.
class StagingPool {
 public:
  struct Allocator {
    std::function<absl::StatusOr<char*>(size_t bytes)> alloc;
    std::function<void(char* p, size_t bytes)> free;
  };
  StagingPool(Allocator allocator, uint64_t max_cached_bytes, std::string what);
  ~StagingPool();  // frees the cached buffers; every lease must be returned first

  // A buffer of at least `bytes` (bytes > 0); the allocator's error, naming the pool.
  struct Lease {
    char* data = nullptr;
    size_t capacity = 0;
  };
  absl::StatusOr<Lease> Take(size_t bytes);
  void Return(const Lease& lease);

  // The leak check: buffers taken and not returned; buffers allocated in all (reuse shows as
  // allocations staying flat while Take is called again and again).
  int64_t in_use() const;
  int64_t allocations() const;
  uint64_t cached_bytes() const;

 private:
  static size_t SizeClass(size_t bytes);
  const Allocator allocator_;
  const uint64_t max_cached_bytes_;
  const std::string what_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<char*>> free_ ABSL_GUARDED_BY(mu_);  // by log2 of the class
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
};

// Memory NCCL reads from or writes into (device memory for the real communicator); returned to
// its pool when destroyed. `data()` is exactly the chunk's payload size.
class StagedKv {
 public:
  StagedKv(StagingPool* pool, StagingPool::Lease lease, size_t size)
      : pool_(pool), lease_(lease), size_(size) {}
  ~StagedKv() { pool_->Return(lease_); }
  StagedKv(const StagedKv&) = delete;
  StagedKv& operator=(const StagedKv&) = delete;
  std::span<char> data() { return {lease_.data, size_}; }

 private:
  StagingPool* const pool_;
  const StagingPool::Lease lease_;
  const size_t size_;
};

class KvStaging {
 public:
  virtual ~KvStaging() = default;
  // Prefill: the packed payload of one chunk, in transfer memory, ready for ncclSend.
  virtual absl::StatusOr<std::unique_ptr<StagedKv>> StageForSend(const KvChunkHeader& h,
                                                                 std::span<const char> payload) = 0;
  // Decode: transfer memory to receive a payload of `bytes` into.
  virtual absl::StatusOr<std::unique_ptr<StagedKv>> ReceiveBuffer(const KvChunkHeader& h,
                                                                  size_t bytes) = 0;
  // Decode: hands a received payload to the sink (which validates the lease and scatters it);
  // the sink's verdict, or the copy's error.
  virtual absl::Status Deliver(const KvChunkHeader& h, StagedKv& received, KvSink* sink) = 0;
  // Whether the transport can checksum payloads in this memory (host memory only).
  virtual bool host_visible() const = 0;
  // The leak check: staged buffers alive.
  virtual int64_t buffers_in_use() const = 0;
};

// Transfer memory is plain host memory: for the fake communicator (tests, benchmarks on the
// CPU). The copies are the same as the device staging's, minus the device.
std::unique_ptr<KvStaging> MakeHostKvStaging(uint64_t max_cached_bytes = uint64_t{256} << 20);

// Transfer memory on CUDA device `device`, with pinned host buffers for the copies, through
// libtandem_nccl.so's memory functions (nccl_api.h). By default nothing is freed before the
// staging is destroyed (its memory is the peak in flight): cudaFree and cudaFreeHost synchronise
// the device, which would wait for the NCCL kernel of a receive pending on a hung peer and stall
// the progress thread that runs the watchdog. The staging outlives its transport, so it is
// destroyed after every communicator was aborted.
std::unique_ptr<KvStaging> MakeDeviceKvStaging(const TandemNcclApi* api, int device,
                                               uint64_t max_cached_bytes = UINT64_MAX);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_NCCL_STAGING_H_
