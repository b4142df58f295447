// The real NCCL communicator, from libtandem_nccl.so loaded at run time. Searched:
// $TANDEM_NCCL_LIB, then libtandem_nccl.so next to the running executable, then the dynamic
// linker's path. UNAVAILABLE with every reason when the library is missing (built without
// CUDA/NCCL) or no GPU is usable; binaries never link NCCL, so they start everywhere.
#ifndef TANDEM_KV_TRANSFER_NCCL_NCCL_LOADER_H_
#define TANDEM_KV_TRANSFER_NCCL_NCCL_LOADER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kv_transfer/nccl/communicator.h"
#include "kv_transfer/nccl/nccl_api.h"

namespace tandem {

// The library's table (loaded once per process), or why it is not available.
absl::StatusOr<const TandemNcclApi*> LoadNcclApi();

// Communicators on CUDA device `device`. INVALID_ARGUMENT for a device outside
// [0, device_count).
absl::StatusOr<std::unique_ptr<CommunicatorFactory>> MakeNcclCommunicatorFactory(int device);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_NCCL_NCCL_LOADER_H_
