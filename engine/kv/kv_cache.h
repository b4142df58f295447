// The paged KV cache: its spec (shape, block size, dtype, layer groups: what a block costs, in
// one place) and its storage: per layer of a group (a "slot"), K and V as [num_blocks,
// block_size, n_kv_heads, head_dim] of the cache dtype, and for fp8 a scale per block, K/V and
// KV head. A block holds one group's layers (engine/kv/block_table.h: one group of every layer,
// or for models mixing sliding-window and full-attention layers, groups of equally many layers
// of one kind); layer l lives in slot layer_slot[l] of the blocks of its group's table. Which
// blocks belong to which sequence is the BlockPool's business (engine/kv/block_pool.h); this
// class only holds the memory.
//
// fp8 (E4M3) scales are per sequence, per layer and KV head: the sequence's first chunk sets
// them from its values (amax with headroom; SetFp8Scales), every block of the sequence holds a
// copy (so kernels find a slot's scale by its block), and the KV transfer ships them.
#ifndef TANDEM_ENGINE_KV_KV_CACHE_H_
#define TANDEM_ENGINE_KV_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/block_table.h"
#include "engine/model_config.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace tandem {

// What one block of a model's KV cache costs, in one place.
struct KvCacheSpec {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
  // Layer groups (engine/kv/block_table.h). Empty: one group of every layer, layer l in slot l.
  std::vector<int> group_window;  // [n_groups] 0 = full attention, else the sliding window
  std::vector<int> layer_group;   // [n_layers]
  std::vector<int> layer_slot;    // [n_layers] its index among its group's layers

  // Models with both sliding-window and full-attention layers (ModelConfig::MixedLayers) get
  // groups of gcd(#sliding, #full) layers with `grouped`; everything else one group.
  static KvCacheSpec For(const ModelConfig& config, int block_size, DType dtype,
                         bool grouped = true);
  int width() const { return n_kv_heads * head_dim; }
  int n_groups() const { return group_window.empty() ? 1 : static_cast<int>(group_window.size()); }
  int group_layers() const { return n_layers / n_groups(); }  // layers a block holds
  int group_of(int layer) const { return layer_group.empty() ? 0 : layer_group[layer]; }
  int slot_of(int layer) const { return layer_slot.empty() ? layer : layer_slot[layer]; }
  KvTableLayout table_layout() const { return {block_size, group_window}; }
  // Layer `layer`'s blocks in a sequence's table, by logical block (kNoBlock where none).
  std::vector<int> LayerTable(std::span<const int> table, int layer) const {
    return GroupTable(table_layout(), table, group_of(layer));
  }
  // The first prompt position a decode of a `prompt_len`-token prompt reads in `layer`: past
  // the window of a sliding group, 0 otherwise. What a prefill worker sends of that layer.
  int KeepFrom(int layer, int prompt_len) const {
    return table_layout().KeepFrom(group_of(layer), prompt_len);
  }
  // K and V of one token, every layer (fp8 scales not included: they are per block).
  int64_t bytes_per_token() const {
    return int64_t{2} * n_layers * width() * static_cast<int64_t>(DTypeSize(dtype));
  }
  // A block: its tokens in its group's layers, and for fp8 their scales.
  int64_t bytes_per_block() const;
  // Blocks that fit in `bytes` (at most 2^20).
  int BlocksIn(int64_t bytes) const;
};

// `--kv-dtype`: "auto" (the model's compute dtype, float32 on the CPU engine), "f32", "bf16",
// "f16" or "fp8"; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<DType> ParseKvDtype(std::string_view name, DType compute = DType::kF32);

class KvCache {
 public:
  // Fails when the cache would not fit in `max_bytes` (0 = no limit).
  static absl::StatusOr<KvCache> Create(const ModelConfig& config, int num_blocks, int block_size,
                                        int64_t max_bytes = 0, DType dtype = DType::kF32);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return spec_.block_size; }
  int n_layers() const { return spec_.n_layers; }  // the model's layers
  int width() const { return spec_.width(); }      // n_kv_heads * head_dim
  DType dtype() const { return spec_.dtype; }
  const KvCacheSpec& spec() const { return spec_; }

  // Layer `layer` for the kernels.
  KvLayerRef layer(int layer);
  // The raw K and V of a layer (of dtype()).
  char* k_bytes(int layer) { return data_.get() + LayerOffset(layer); }
  char* v_bytes(int layer) { return data_.get() + LayerOffset(layer) + LayerBytes(); }
  const char* k_bytes(int layer) const { return data_.get() + LayerOffset(layer); }
  const char* v_bytes(int layer) const { return data_.get() + LayerOffset(layer) + LayerBytes(); }
  // float32 caches only.
  float* k(int layer) { return reinterpret_cast<float*>(k_bytes(layer)); }
  float* v(int layer) { return reinterpret_cast<float*>(v_bytes(layer)); }
  const float* k(int layer) const { return reinterpret_cast<const float*>(k_bytes(layer)); }
  const float* v(int layer) const { return reinterpret_cast<const float*>(v_bytes(layer)); }
  // fp8 only: [num_blocks, 2, n_kv_heads] scales of a layer (null for other dtypes).
  float* scales(int layer);
  const float* scales(int layer) const;

  // Bytes of K plus V for one token across all layers.
  int64_t bytes_per_token() const { return spec_.bytes_per_token(); }

 private:
  int64_t LayerBytes() const {
    return int64_t{num_blocks_} * spec_.block_size * spec_.width() *
           static_cast<int64_t>(DTypeSize(spec_.dtype));
  }
  int64_t LayerOffset(int layer) const { return 2 * LayerBytes() * spec_.slot_of(layer); }

  KvCacheSpec spec_;
  int num_blocks_ = 0;
  std::unique_ptr<char[]> data_;     // uninitialized: pages are touched only when written
  std::unique_ptr<float[]> scales_;  // fp8: [group_layers, num_blocks, 2, n_kv_heads]
};

// fp8 caches: sets the scales of layer `layer` for a forward step's sequences, before their
// K/V rows k, v [tokens, width] are written. A sequence's first chunk (start_pos 0) sets its
// scales from its rows (per K/V and KV head: amax * headroom / 448) in every block of its table
// it writes; a later chunk copies the sequence's scales (its first held block's) into each block
// it starts. `chunks` are (start_pos, count, the layer's group table: KvCacheSpec::LayerTable)
// with their rows consecutive in k and v.
struct KvChunkRows {
  int start_pos;
  int count;
  std::span<const int> block_table;
};
void SetFp8Scales(KvCache* cache, int layer, std::span<const KvChunkRows> chunks, const float* k,
                  const float* v);

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_KV_CACHE_H_
