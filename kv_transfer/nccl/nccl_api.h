/* The plain C interface of libtandem_nccl.so, the real NCCL communicator. Binaries never link it
 * (nor libnccl, nor libcuda): kv_transfer/nccl/nccl_loader.cc dlopen()s it, so every binary
 * starts on machines without a GPU. Every int function returns 0 on success or an NCCL/CUDA
 * error code with last_error() describing it. */
#ifndef TANDEM_KV_TRANSFER_NCCL_NCCL_API_H_
#define TANDEM_KV_TRANSFER_NCCL_NCCL_API_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TANDEM_NCCL_ABI_VERSION 2
#define TANDEM_NCCL_POLL_IDLE 0
#define TANDEM_NCCL_POLL_PENDING 1

typedef struct TandemNcclApi {
  int abi_version;
  const char* (*last_error)(void);
  /* Number of usable CUDA devices; 0 without a driver or GPU (never an error). */
  int (*device_count)(void);
  int (*get_unique_id)(char* id /* [128] */);
  /* Non-blocking ncclCommInitRankConfig on `device` with its own stream; *comm is an opaque
   * handle. */
  int (*comm_init)(const char* id /* [128] */, int nranks, int rank, int device, void** comm);
  int (*group_start)(void* comm);
  int (*group_end)(void* comm);
  int (*send)(void* comm, const void* d_buf, size_t bytes, int peer);
  int (*recv)(void* comm, void* d_buf, size_t bytes, int peer);
  /* TANDEM_NCCL_POLL_IDLE, TANDEM_NCCL_POLL_PENDING, or -1 with last_error() set to the
   * communicator's asynchronous error. */
  int (*poll)(void* comm);
  /* ncclCommAbort and free the handle; never waits for the peer. */
  void (*abort)(void* comm);
  /* ncclCommFinalize + ncclCommDestroy (only when idle) and free the handle. */
  void (*destroy)(void* comm);
  /* Device memory and copies, for the transport's staging (staging.h), tests and benchmarks.
   * Copies are synchronous: done when the call returns. */
  int (*dev_malloc)(int device, void** d_ptr, size_t bytes);
  int (*dev_free)(int device, void* d_ptr);
  int (*h2d)(int device, void* d_dst, const void* src, size_t bytes);
  int (*d2h)(int device, void* dst, const void* d_src, size_t bytes);
  /* Page-locked host memory (cudaHostAlloc), the fast side of h2d and d2h. */
  int (*host_alloc)(void** h_ptr, size_t bytes);
  int (*host_free)(void* h_ptr);
} TandemNcclApi;

const TandemNcclApi* tandem_nccl_get_api(void);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KV_TRANSFER_NCCL_NCCL_API_H_ */
