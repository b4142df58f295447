#include "engine/kv_cache.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

absl::StatusOr<KvCache> KvCache::Create(const ModelConfig& config, int num_blocks, int block_size,
                                        int64_t max_bytes) {
  if (num_blocks <= 0) return absl::InvalidArgumentError("kv cache: num_blocks must be positive");
  if (block_size <= 0 || block_size > 4096) {
    return absl::InvalidArgumentError("kv cache: block_size must be in [1, 4096]");
  }
  KvCache c;
  c.n_layers_ = config.n_layers;
  c.num_blocks_ = num_blocks;
  c.block_size_ = block_size;
  c.width_ = config.kv_dim();
  const int64_t floats = 2 * c.LayerFloats() * c.n_layers_;
  if (max_bytes > 0 && floats * 4 > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "kv cache of %d blocks x %d tokens needs %d bytes, more than the %d allowed", num_blocks,
        block_size, floats * 4, max_bytes));
  }
  c.data_.reset(new float[static_cast<size_t>(floats)]);
  return c;
}

}  // namespace tandem
