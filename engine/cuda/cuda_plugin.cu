// libtandem_cuda.so's exported C table: the kernel entries (kernels/cuda/) and the device model's
// model_* entries (device_model.cu).
#include "engine/cuda/device_model.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/ops.h"

namespace {

TandemCudaApi MakeApi() {
  TandemCudaApi api{};
  tandem::cuda::FillKernelEntries(&api);
  api.model_create = tandem::cuda::ModelCreate;
  api.model_destroy = tandem::cuda::ModelDestroy;
  api.model_info = tandem::cuda::ModelInfo;
  api.model_forward = tandem::cuda::ModelForward;
  api.model_pack_kv = tandem::cuda::ModelPackKv;
  api.model_unpack_kv = tandem::cuda::ModelUnpackKv;
  api.paged_attention_fi = tandem::cuda::PagedAttentionFi;
  return api;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const TandemCudaApi* tandem_cuda_get_api(void) {
  static const TandemCudaApi api = MakeApi();
  return &api;
}
