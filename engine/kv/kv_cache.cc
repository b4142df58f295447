#include "engine/kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

KvCacheSpec KvCacheSpec::For(const ModelConfig& config, int block_size, DType dtype, bool grouped) {
  KvCacheSpec spec;
  spec.n_layers = config.n_layers;
  spec.n_kv_heads = config.n_kv_heads;
  spec.head_dim = config.head_dim;
  spec.block_size = block_size;
  spec.dtype = dtype;
  if (!grouped || !config.MixedLayers()) return spec;
  int sliding = 0;
  for (int l = 0; l < config.n_layers; ++l) sliding += config.LayerIsLocal(l);
  const int per_group = std::gcd(sliding, config.n_layers - sliding);
  // Full-attention groups first, then sliding ones; layers fill their kind's groups in order.
  const int full_groups = (config.n_layers - sliding) / per_group;
  spec.group_window.assign(full_groups, 0);
  spec.group_window.resize(config.n_layers / per_group, config.sliding_window);
  spec.layer_group.resize(config.n_layers);
  spec.layer_slot.resize(config.n_layers);
  int seen[2] = {0, 0};  // layers placed so far: full, sliding
  for (int l = 0; l < config.n_layers; ++l) {
    const int kind = config.LayerIsLocal(l) ? 1 : 0;
    const int i = seen[kind]++;
    spec.layer_group[l] = (kind == 1 ? full_groups : 0) + i / per_group;
    spec.layer_slot[l] = i % per_group;
  }
  return spec;
}

int64_t KvCacheSpec::bytes_per_block() const {
  const int64_t layers = group_layers();
  const int64_t scales = dtype == DType::kFp8E4M3 ? int64_t{2} * layers * n_kv_heads * 4 : 0;
  return int64_t{2} * layers * width() * static_cast<int64_t>(DTypeSize(dtype)) * block_size +
         scales;
}

int KvCacheSpec::BlocksIn(int64_t bytes) const {
  return static_cast<int>(std::min<int64_t>(bytes / bytes_per_block(), int64_t{1} << 20));
}

absl::StatusOr<DType> ParseKvDtype(std::string_view name, DType compute) {
  if (name == "auto" || name.empty()) return compute;
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
  if (name == "fp8") return DType::kFp8E4M3;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--kv-dtype must be auto, f32, bf16, f16 or fp8, not \"%s\"", std::string(name)));
}

absl::StatusOr<KvCache> KvCache::Create(const ModelConfig& config, int num_blocks, int block_size,
                                        int64_t max_bytes, DType dtype) {
  if (num_blocks <= 0) return absl::InvalidArgumentError("kv cache: num_blocks must be positive");
  if (block_size <= 0 || block_size > 4096) {
    return absl::InvalidArgumentError("kv cache: block_size must be in [1, 4096]");
  }
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv cache: dtype %s is for weights only (f32, bf16, f16 or fp8)", DTypeName(dtype)));
  }
  KvCache c;
  c.spec_ = KvCacheSpec::For(config, block_size, dtype);
  c.num_blocks_ = num_blocks;
  const int64_t bytes = c.spec_.bytes_per_block() * num_blocks;
  if (max_bytes > 0 && bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "kv cache of %d blocks x %d tokens needs %d bytes, more than the %d allowed", num_blocks,
        block_size, bytes, max_bytes));
  }
  c.data_.reset(new char[static_cast<size_t>(2 * c.LayerBytes() * c.spec_.group_layers())]);
  if (dtype == DType::kFp8E4M3) {
    const int64_t n = int64_t{c.spec_.group_layers()} * num_blocks * 2 * c.spec_.n_kv_heads;
    c.scales_.reset(new float[static_cast<size_t>(n)]);
    std::fill(c.scales_.get(), c.scales_.get() + n, 1.0f);
  }
  return c;
}

float* KvCache::scales(int layer) {
  return scales_ == nullptr
             ? nullptr
             : scales_.get() + int64_t{spec_.slot_of(layer)} * num_blocks_ * 2 * spec_.n_kv_heads;
}

const float* KvCache::scales(int layer) const { return const_cast<KvCache*>(this)->scales(layer); }

KvLayerRef KvCache::layer(int layer) {
  KvLayerRef r;
  r.dtype = spec_.dtype;
  r.k = k_bytes(layer);
  r.v = v_bytes(layer);
  r.scales = scales(layer);
  r.block_size = spec_.block_size;
  r.n_kv_heads = spec_.n_kv_heads;
  r.head_dim = spec_.head_dim;
  return r;
}

void SetFp8Scales(KvCache* cache, int layer, std::span<const KvChunkRows> chunks, const float* k,
                  const float* v) {
  float* scales = cache->scales(layer);
  if (scales == nullptr) return;
  const KvCacheSpec& spec = cache->spec();
  const int bs = spec.block_size, heads = spec.n_kv_heads, hd = spec.head_dim;
  const int64_t width = spec.width();
  const int64_t per_block = int64_t{2} * heads;
  int64_t row = 0;  // the chunk's first row in k and v
  std::vector<float> seq(per_block);
  for (const KvChunkRows& ch : chunks) {
    if (ch.start_pos == 0) {
      for (int kv = 0; kv < 2; ++kv) {
        const float* x = kv == 0 ? k : v;
        for (int h = 0; h < heads; ++h) {
          float amax = 0.0f;
          for (int t = 0; t < ch.count; ++t) {
            const float* r = x + (row + t) * width + int64_t{h} * hd;
            for (int d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(r[d]));
          }
          // A zero (or denormal) range still needs a usable scale.
          seq[kv * heads + h] = std::max(amax * kFp8ScaleHeadroom / kFp8E4M3Max, 1e-12f);
        }
      }
    } else {
      // A sliding group's table may have let its first blocks go: its first held one.
      const int* held =
          std::find_if(ch.block_table.data(), ch.block_table.data() + ch.block_table.size(),
                       [](int b) { return b != kNoBlock; });
      std::copy_n(scales + int64_t{*held} * per_block, per_block, seq.begin());
    }
    // The blocks this chunk starts (all of them for a first chunk).
    const int first_block = ch.start_pos == 0 ? 0 : (ch.start_pos + bs - 1) / bs;
    const int end_block = (ch.start_pos + ch.count + bs - 1) / bs;
    for (int b = first_block; b < end_block; ++b) {
      if (ch.block_table[b] == kNoBlock) continue;  // behind a sliding window
      std::copy(seq.begin(), seq.end(), scales + int64_t{ch.block_table[b]} * per_block);
    }
    row += ch.count;
  }
}

}  // namespace tandem
