// The paged KV cache storage: per layer, K and V as [num_blocks, block_size, n_kv_heads,
// head_dim] float32. Which blocks belong to which sequence is the BlockPool's business
// (engine/block_pool.h); this class only holds the memory.
#ifndef TANDEM_ENGINE_KV_CACHE_H_
#define TANDEM_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace tandem {

class KvCache {
 public:
  // Fails when the cache would not fit in `max_bytes` (0 = no limit).
  static absl::StatusOr<KvCache> Create(const ModelConfig& config, int num_blocks, int block_size,
                                        int64_t max_bytes = 0);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int n_layers() const { return n_layers_; }
  int width() const { return width_; }  // n_kv_heads * head_dim

  float* k(int layer) { return data_.get() + LayerOffset(layer); }
  float* v(int layer) { return data_.get() + LayerOffset(layer) + LayerFloats(); }
  const float* k(int layer) const { return data_.get() + LayerOffset(layer); }
  const float* v(int layer) const { return data_.get() + LayerOffset(layer) + LayerFloats(); }

  // Bytes of K plus V for one token across all layers.
  int64_t bytes_per_token() const { return int64_t{2} * n_layers_ * width_ * 4; }

 private:
  int64_t LayerFloats() const { return int64_t{num_blocks_} * block_size_ * width_; }
  int64_t LayerOffset(int layer) const { return 2 * LayerFloats() * layer; }

  int n_layers_ = 0, num_blocks_ = 0, block_size_ = 0, width_ = 0;
  std::unique_ptr<float[]> data_;  // uninitialized: pages are touched only when written
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_CACHE_H_
