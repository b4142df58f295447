#include "kv_transfer/kv_pack.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

// Validates that tokens [token_start, token_start + token_count) of `layer` map to blocks of
// `cache` through `block_table`, and returns the layer's blocks by logical block
// (KvCacheSpec::LayerTable).
absl::StatusOr<std::vector<int>> LayerRange(const KvCache& cache, int64_t layer,
                                            std::span<const int> table, int64_t token_start,
                                            int64_t token_count) {
  if (layer < 0 || layer >= cache.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: layer %d outside [0, %d)", layer, cache.n_layers()));
  }
  if (token_start < 0 || token_count <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: bad token range start %d count %d", token_start, token_count));
  }
  const std::vector<int> block_table = cache.spec().LayerTable(table, static_cast<int>(layer));
  const int64_t bs = cache.block_size();
  const int64_t end = token_start + token_count;
  if (end > static_cast<int64_t>(block_table.size()) * bs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: tokens [%d, %d) not covered by %d blocks of %d", token_start,
                        end, block_table.size(), bs));
  }
  for (int64_t b = token_start / bs; b <= (end - 1) / bs; ++b) {
    if (block_table[b] < 0 || block_table[b] >= cache.num_blocks()) {
      return absl::InvalidArgumentError(absl::StrFormat("kv chunk: block id %d outside [0, %d)",
                                                        block_table[b], cache.num_blocks()));
    }
  }
  return block_table;
}

// Calls fn(paged_row_offset_in_elements, wire_row, rows) for each run of rows contiguous in
// one block.
template <typename Fn>
void ForEachRun(const KvCache& cache, std::span<const int> block_table, int64_t token_start,
                int64_t token_count, Fn fn) {
  const int64_t bs = cache.block_size();
  const int64_t w = cache.width();
  int64_t t = token_start;
  const int64_t end = token_start + token_count;
  while (t < end) {
    const int64_t in_block = t % bs;
    const int64_t rows = std::min(bs - in_block, end - t);
    fn((int64_t{block_table[t / bs]} * bs + in_block) * w, t - token_start, rows);
    t += rows;
  }
}

}  // namespace

absl::StatusOr<std::string> GatherKv(const KvCache& cache, int layer, std::span<const int> table,
                                     int token_start, int token_count) {
  absl::StatusOr<std::vector<int>> block_table =
      LayerRange(cache, layer, table, token_start, token_count);
  if (!block_table.ok()) return block_table.status();
  const int64_t w = cache.width();
  const int64_t esize = static_cast<int64_t>(DTypeSize(cache.dtype()));
  const size_t half = static_cast<size_t>(token_count) * w * esize;
  const float* scales = cache.scales(layer);
  const int heads = cache.spec().n_kv_heads;
  const size_t scale_bytes = scales != nullptr ? size_t{2} * heads * 4 : 0;
  std::string out(2 * half + scale_bytes, '\0');
  char* k_out = out.data();
  char* v_out = out.data() + half;
  const char* k = cache.k_bytes(layer);
  const char* v = cache.v_bytes(layer);
  ForEachRun(cache, *block_table, token_start, token_count,
             [&](int64_t offset, int64_t wire_row, int64_t rows) {
               const size_t at = wire_row * w * esize;
               const size_t n = rows * w * esize;
               std::memcpy(k_out + at, k + offset * esize, n);
               std::memcpy(v_out + at, v + offset * esize, n);
             });
  if (scales != nullptr) {
    // The sequence's scales (every block of it holds them): the first block of the chunk's.
    const int block = (*block_table)[token_start / cache.block_size()];
    std::memcpy(out.data() + 2 * half, scales + int64_t{block} * 2 * heads, scale_bytes);
  }
  return out;
}

KvChunkHeader MakeKvChunkHeader(const KvCache& cache, uint64_t request_id, int layer,
                                int token_start, int token_count) {
  KvChunkHeader h = MakeKvChunkHeader(cache.width(), request_id, layer, token_start, token_count);
  h.dtype = cache.dtype();
  if (h.dtype == DType::kFp8E4M3) h.scale_groups = static_cast<uint32_t>(cache.spec().n_kv_heads);
  return h;
}

KvChunkHeader MakeKvChunkHeader(int width, uint64_t request_id, int layer, int token_start,
                                int token_count) {
  KvChunkHeader h;
  h.request_id = request_id;
  h.layer = static_cast<uint32_t>(layer);
  h.token_start = static_cast<uint32_t>(token_start);
  h.token_count = static_cast<uint32_t>(token_count);
  h.dtype = DType::kF32;
  h.width = static_cast<uint32_t>(width);
  return h;
}

absl::Status CheckKvChunk(const KvChunkHeader& h, const KvCacheSpec& spec) {
  if (h.dtype != spec.dtype) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "kv chunk: dtype %s, this worker's KV cache is %s (prefill and decode workers must use "
        "the same --kv-dtype)",
        DTypeName(h.dtype), DTypeName(spec.dtype)));
  }
  if (h.width != static_cast<uint32_t>(spec.width())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: width %d, cache width %d", h.width, spec.width()));
  }
  const uint32_t groups = spec.dtype == DType::kFp8E4M3 ? spec.n_kv_heads : 0;
  if (h.scale_groups != groups) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: %d scale groups, the cache has %d", h.scale_groups, groups));
  }
  return absl::OkStatus();
}

absl::Status CheckKvChunk(const KvChunkHeader& h, int64_t width) {
  KvCacheSpec spec;
  spec.n_kv_heads = 1;
  spec.head_dim = static_cast<int>(width);
  return CheckKvChunk(h, spec);
}

absl::Status CheckKvPayload(const KvChunkHeader& h, size_t payload_bytes) {
  absl::StatusOr<uint64_t> want = KvChunkPayloadBytes(h, UINT64_MAX);
  if (!want.ok()) return want.status();
  if (payload_bytes != *want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: payload has %d bytes, want %d", payload_bytes, *want));
  }
  return absl::OkStatus();
}

absl::Status ScatterKv(std::span<const char> payload, const KvChunkHeader& h,
                       std::span<const int> table, KvCache* cache) {
  if (absl::Status s = CheckKvChunk(h, cache->spec()); !s.ok()) return s;
  absl::StatusOr<std::vector<int>> layer_table =
      LayerRange(*cache, h.layer, table, h.token_start, h.token_count);
  if (!layer_table.ok()) return layer_table.status();
  const std::vector<int>& block_table = *layer_table;
  if (absl::Status s = CheckKvPayload(h, payload.size()); !s.ok()) return s;
  const int64_t w = cache->width();
  const int64_t esize = static_cast<int64_t>(DTypeSize(cache->dtype()));
  const size_t half = static_cast<size_t>(h.token_count) * w * esize;
  const char* k_in = payload.data();
  const char* v_in = payload.data() + half;
  char* k = cache->k_bytes(h.layer);
  char* v = cache->v_bytes(h.layer);
  ForEachRun(*cache, block_table, h.token_start, h.token_count,
             [&](int64_t offset, int64_t wire_row, int64_t rows) {
               const size_t at = wire_row * w * esize;
               const size_t n = rows * w * esize;
               std::memcpy(k + offset * esize, k_in + at, n);
               std::memcpy(v + offset * esize, v_in + at, n);
             });
  if (float* scales = cache->scales(h.layer); scales != nullptr) {
    // The sequence's scales into every block the chunk touches.
    const int heads = static_cast<int>(h.scale_groups);
    const int64_t bs = cache->block_size();
    for (int64_t b = h.token_start / bs; b <= (int64_t{h.token_start} + h.token_count - 1) / bs;
         ++b) {
      std::memcpy(scales + int64_t{block_table[b]} * 2 * heads, payload.data() + 2 * half,
                  size_t{2} * heads * 4);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
