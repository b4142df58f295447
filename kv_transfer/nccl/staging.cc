#include "kv_transfer/nccl/staging.h"

#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"

namespace tandem {

StagingPool::StagingPool(Allocator allocator, uint64_t max_cached_bytes, std::string what)
    : allocator_(std::move(allocator)),
      max_cached_bytes_(max_cached_bytes),
      what_(std::move(what)) {
  free_.resize(64);
}

StagingPool::~StagingPool() {
  absl::MutexLock lock(&mu_);
  for (size_t c = 0; c < free_.size(); ++c) {
    for (char* p : free_[c]) allocator_.free(p, size_t{1} << c);
  }
}

size_t StagingPool::SizeClass(size_t bytes) {
  return std::bit_width(std::max<size_t>(bytes, 4096) - 1);  // 2^class >= bytes
}

absl::StatusOr<StagingPool::Lease> StagingPool::Take(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError(what_ + ": empty buffer requested");
  if (bytes > (size_t{1} << 40)) {
    return absl::ResourceExhaustedError(absl::StrFormat("%s: %d bytes requested", what_, bytes));
  }
  const size_t c = SizeClass(bytes);
  {
    absl::MutexLock lock(&mu_);
    if (!free_[c].empty()) {
      Lease l{free_[c].back(), size_t{1} << c};
      free_[c].pop_back();
      cached_bytes_ -= l.capacity;
      ++in_use_;
      return l;
    }
  }
  absl::StatusOr<char*> p = allocator_.alloc(size_t{1} << c);
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrFormat("%s: allocating %d bytes: %s", what_,
                                                           size_t{1} << c, p.status().message()));
  }
  absl::MutexLock lock(&mu_);
  ++in_use_;
  ++allocations_;
  return Lease{*p, size_t{1} << c};
}

void StagingPool::Return(const Lease& lease) {
  const size_t c = SizeClass(lease.capacity);
  {
    absl::MutexLock lock(&mu_);
    --in_use_;
    if (cached_bytes_ + lease.capacity <= max_cached_bytes_) {
      free_[c].push_back(lease.data);
      cached_bytes_ += lease.capacity;
      return;
    }
  }
  allocator_.free(lease.data, lease.capacity);
}

int64_t StagingPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}
int64_t StagingPool::allocations() const {
  absl::MutexLock lock(&mu_);
  return allocations_;
}
uint64_t StagingPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

namespace {

absl::StatusOr<std::unique_ptr<StagedKv>> Stage(StagingPool& pool, size_t bytes) {
  absl::StatusOr<StagingPool::Lease> l = pool.Take(bytes);
  if (!l.ok()) return l.status();
  return std::make_unique<StagedKv>(&pool, *l, bytes);
}

// Transfer memory in host memory: the copies stand for the device copies of the real staging.
class HostKvStaging final : public KvStaging {
 public:
  explicit HostKvStaging(uint64_t max_cached_bytes)
      : pool_({[](size_t n) -> absl::StatusOr<char*> { return new char[n]; },
               [](char* p, size_t) { delete[] p; }},
              max_cached_bytes, "kv staging (host)") {}

  absl::StatusOr<std::unique_ptr<StagedKv>> StageForSend(const KvChunkHeader&,
                                                         std::span<const char> payload) override {
    absl::StatusOr<std::unique_ptr<StagedKv>> s = Stage(pool_, payload.size());
    if (!s.ok()) return s.status();
    std::memcpy((*s)->data().data(), payload.data(), payload.size());
    return s;
  }
  absl::StatusOr<std::unique_ptr<StagedKv>> ReceiveBuffer(const KvChunkHeader&,
                                                          size_t bytes) override {
    return Stage(pool_, bytes);
  }
  absl::Status Deliver(const KvChunkHeader& h, StagedKv& received, KvSink* sink) override {
    return sink->Accept(h, received.data());
  }
  bool host_visible() const override { return true; }
  int64_t buffers_in_use() const override { return pool_.in_use(); }

 private:
  StagingPool pool_;
};

absl::Status ApiError(const TandemNcclApi* api, int code, const char* what) {
  return absl::UnavailableError(
      absl::StrFormat("%s failed (%d): %s", what, code, api->last_error()));
}

// Device transfer memory; host copies go through pinned buffers (full-speed DMA, and cudaMemcpy
// from pinned memory has completed when it returns).
class DeviceKvStaging final : public KvStaging {
 public:
  DeviceKvStaging(const TandemNcclApi* api, int device, uint64_t max_cached_bytes)
      : api_(api),
        device_(device),
        device_pool_({[api, device](size_t n) -> absl::StatusOr<char*> {
                        void* p = nullptr;
                        if (int e = api->dev_malloc(device, &p, n)) {
                          return ApiError(api, e, "cudaMalloc");
                        }
                        return static_cast<char*>(p);
                      },
                      [api, device](char* p, size_t) { api->dev_free(device, p); }},
                     max_cached_bytes, absl::StrFormat("kv staging (device %d)", device)),
        host_pool_({[api](size_t n) -> absl::StatusOr<char*> {
                      void* p = nullptr;
                      if (int e = api->host_alloc(&p, n)) return ApiError(api, e, "cudaHostAlloc");
                      return static_cast<char*>(p);
                    },
                    [api](char* p, size_t) { api->host_free(p); }},
                   max_cached_bytes, "kv staging (pinned host)") {}

  absl::StatusOr<std::unique_ptr<StagedKv>> StageForSend(const KvChunkHeader&,
                                                         std::span<const char> payload) override {
    absl::StatusOr<std::unique_ptr<StagedKv>> pinned = Stage(host_pool_, payload.size());
    if (!pinned.ok()) return pinned.status();
    std::memcpy((*pinned)->data().data(), payload.data(), payload.size());
    absl::StatusOr<std::unique_ptr<StagedKv>> dev = Stage(device_pool_, payload.size());
    if (!dev.ok()) return dev.status();
    if (int e =
            api_->h2d(device_, (*dev)->data().data(), (*pinned)->data().data(), payload.size())) {
      return ApiError(api_, e, "kv staging: copy to device");
    }
    return dev;
  }
  absl::StatusOr<std::unique_ptr<StagedKv>> ReceiveBuffer(const KvChunkHeader&,
                                                          size_t bytes) override {
    return Stage(device_pool_, bytes);
  }
  absl::Status Deliver(const KvChunkHeader& h, StagedKv& received, KvSink* sink) override {
    const size_t n = received.data().size();
    absl::StatusOr<std::unique_ptr<StagedKv>> pinned = Stage(host_pool_, n);
    if (!pinned.ok()) return pinned.status();
    if (int e = api_->d2h(device_, (*pinned)->data().data(), received.data().data(), n)) {
      return ApiError(api_, e, "kv staging: copy from device");
    }
    return sink->Accept(h, (*pinned)->data());
  }
  bool host_visible() const override { return false; }
  int64_t buffers_in_use() const override { return device_pool_.in_use() + host_pool_.in_use(); }

 private:
  const TandemNcclApi* const api_;
  const int device_;
  StagingPool device_pool_;
  StagingPool host_pool_;
};

}  // namespace

std::unique_ptr<KvStaging> MakeHostKvStaging(uint64_t max_cached_bytes) {
  return std::make_unique<HostKvStaging>(max_cached_bytes);
}

std::unique_ptr<KvStaging> MakeDeviceKvStaging(const TandemNcclApi* api, int device,
                                               uint64_t max_cached_bytes) {
  return std::make_unique<DeviceKvStaging>(api, device, max_cached_bytes);
}

}  // namespace tandem
