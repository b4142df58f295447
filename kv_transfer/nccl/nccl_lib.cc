// libtandem_nccl.so: the real NCCL communicator behind the C table in nccl_api.h. Built only
// when the CUDA toolkit and NCCL are found; dlopen()ed by nccl_loader.cc. Each communicator has
// its own stream and an event recorded after every group, so polling never blocks:
// ncclCommGetAsyncError reports initialisation in progress and asynchronous errors, the event
// reports whether the posted sends and receives finished.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>

#include "kv_transfer/nccl/nccl_api.h"

namespace {

thread_local char g_error[512] = "";

struct Comm {
  ncclComm_t comm = nullptr;
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  bool need_record = false;  // a group ended; record the event once NCCL enqueued it
};

int Nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return 0;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : "";
  std::snprintf(g_error, sizeof(g_error), "%s: %s %s", what, ncclGetErrorString(r),
                last != nullptr ? last : "");
  return static_cast<int>(r);
}
int Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  std::snprintf(g_error, sizeof(g_error), "%s: %s", what, cudaGetErrorString(e));
  return 1000 + static_cast<int>(e);
}

const char* LastError() { return g_error; }

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int GetUniqueId(char* id) {
  ncclUniqueId u;
  if (int e = Nccl(ncclGetUniqueId(&u), "ncclGetUniqueId")) return e;
  static_assert(sizeof(u.internal) == 128);
  std::memcpy(id, u.internal, 128);
  return 0;
}

int CommInit(const char* id, int nranks, int rank, int device, void** out) {
  if (int e = Cuda(cudaSetDevice(device), "cudaSetDevice")) return e;
  auto* c = new Comm;
  c->device = device;
  if (int e = Cuda(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream")) {
    delete c;
    return e;
  }
  if (int e = Cuda(cudaEventCreateWithFlags(&c->event, cudaEventDisableTiming), "event")) {
    cudaStreamDestroy(c->stream);
    delete c;
    return e;
  }
  ncclUniqueId u;
  std::memcpy(u.internal, id, 128);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (int e = Nccl(ncclCommInitRankConfig(&c->comm, nranks, u, rank, &config),
                   "ncclCommInitRankConfig")) {
    cudaEventDestroy(c->event);
    cudaStreamDestroy(c->stream);
    delete c;
    return e;
  }
  *out = c;
  return 0;
}

int GroupStart(void*) { return Nccl(ncclGroupStart(), "ncclGroupStart"); }
int GroupEnd(void* h) {
  auto* c = static_cast<Comm*>(h);
  c->need_record = true;
  return Nccl(ncclGroupEnd(), "ncclGroupEnd", c->comm);
}
int Send(void* h, const void* buf, size_t bytes, int peer) {
  auto* c = static_cast<Comm*>(h);
  if (int e = Cuda(cudaSetDevice(c->device), "cudaSetDevice")) return e;
  c->need_record = true;
  return Nccl(ncclSend(buf, bytes, ncclUint8, peer, c->comm, c->stream), "ncclSend", c->comm);
}
int Recv(void* h, void* buf, size_t bytes, int peer) {
  auto* c = static_cast<Comm*>(h);
  if (int e = Cuda(cudaSetDevice(c->device), "cudaSetDevice")) return e;
  c->need_record = true;
  return Nccl(ncclRecv(buf, bytes, ncclUint8, peer, c->comm, c->stream), "ncclRecv", c->comm);
}

int Poll(void* h) {
  auto* c = static_cast<Comm*>(h);
  ncclResult_t state = ncclSuccess;
  if (Nccl(ncclCommGetAsyncError(c->comm, &state), "ncclCommGetAsyncError", c->comm)) return -1;
  if (state == ncclInProgress) return TANDEM_NCCL_POLL_PENDING;
  if (state != ncclSuccess) {
    Nccl(state, "nccl async error", c->comm);
    return -1;
  }
  if (Cuda(cudaSetDevice(c->device), "cudaSetDevice")) return -1;
  if (c->need_record) {
    if (Cuda(cudaEventRecord(c->event, c->stream), "cudaEventRecord")) return -1;
    c->need_record = false;
  }
  const cudaError_t q = cudaEventQuery(c->event);
  if (q == cudaErrorNotReady) return TANDEM_NCCL_POLL_PENDING;
  if (Cuda(q, "cudaEventQuery")) return -1;
  return TANDEM_NCCL_POLL_IDLE;
}

void Release(Comm* c) {
  cudaSetDevice(c->device);
  cudaEventDestroy(c->event);
  cudaStreamDestroy(c->stream);
  delete c;
}
void Abort(void* h) {
  auto* c = static_cast<Comm*>(h);
  ncclCommAbort(c->comm);
  Release(c);
}
void Destroy(void* h) {
  auto* c = static_cast<Comm*>(h);
  ncclCommFinalize(c->comm);
  ncclResult_t state = ncclInProgress;
  while (ncclCommGetAsyncError(c->comm, &state) == ncclSuccess && state == ncclInProgress) {
  }
  ncclCommDestroy(c->comm);
  Release(c);
}

int DevMalloc(int device, void** p, size_t bytes) {
  if (int e = Cuda(cudaSetDevice(device), "cudaSetDevice")) return e;
  return Cuda(cudaMalloc(p, bytes), "cudaMalloc");
}
int DevFree(int device, void* p) {
  if (int e = Cuda(cudaSetDevice(device), "cudaSetDevice")) return e;
  return Cuda(cudaFree(p), "cudaFree");
}
int H2D(int device, void* d, const void* s, size_t b) {
  if (int e = Cuda(cudaSetDevice(device), "cudaSetDevice")) return e;
  if (int e = Cuda(cudaMemcpy(d, s, b, cudaMemcpyHostToDevice), "cudaMemcpy H2D")) return e;
  // From pageable memory cudaMemcpy may return before the DMA landed; NCCL's stream does not
  // synchronise with the legacy default stream, so wait for it here (cheap when pinned).
  return Cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}
int D2H(int device, void* d, const void* s, size_t b) {
  if (int e = Cuda(cudaSetDevice(device), "cudaSetDevice")) return e;
  return Cuda(cudaMemcpy(d, s, b, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

int HostAlloc(void** p, size_t bytes) {
  return Cuda(cudaHostAlloc(p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
}
int HostFree(void* p) { return Cuda(cudaFreeHost(p), "cudaFreeHost"); }

const TandemNcclApi kApi = {
    TANDEM_NCCL_ABI_VERSION,
    LastError,
    DeviceCount,
    GetUniqueId,
    CommInit,
    GroupStart,
    GroupEnd,
    Send,
    Recv,
    Poll,
    Abort,
    Destroy,
    DevMalloc,
    DevFree,
    H2D,
    D2H,
    HostAlloc,
    HostFree,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const TandemNcclApi* tandem_nccl_get_api(void) {
  return &kApi;
}
