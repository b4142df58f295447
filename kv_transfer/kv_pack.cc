#include "kv_transfer/kv_pack.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

// Validates that tokens [token_start, token_start + token_count) of `layer` map to blocks of
// `cache` through `block_table`.
absl::Status CheckRange(const KvCache& cache, int64_t layer, std::span<const int> block_table,
                        int64_t token_start, int64_t token_count) {
  if (layer < 0 || layer >= cache.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: layer %d outside [0, %d)", layer, cache.n_layers()));
  }
  if (token_start < 0 || token_count <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: bad token range start %d count %d", token_start, token_count));
  }
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
  return absl::OkStatus();
}

// Calls fn(paged_row_offset_in_floats, wire_row, rows) for each run of rows contiguous in one
// block.
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

absl::StatusOr<std::string> GatherKv(const KvCache& cache, int layer,
                                     std::span<const int> block_table, int token_start,
                                     int token_count) {
  if (absl::Status s = CheckRange(cache, layer, block_table, token_start, token_count); !s.ok()) {
    return s;
  }
  const int64_t w = cache.width();
  const size_t half = static_cast<size_t>(token_count) * w * sizeof(float);
  std::string out(2 * half, '\0');
  char* k_out = out.data();
  char* v_out = out.data() + half;
  const float* k = cache.k(layer);
  const float* v = cache.v(layer);
  ForEachRun(cache, block_table, token_start, token_count,
             [&](int64_t offset, int64_t wire_row, int64_t rows) {
               const size_t at = wire_row * w * sizeof(float);
               const size_t n = rows * w * sizeof(float);
               std::memcpy(k_out + at, k + offset, n);
               std::memcpy(v_out + at, v + offset, n);
             });
  return out;
}

KvChunkHeader MakeKvChunkHeader(const KvCache& cache, uint64_t request_id, int layer,
                                int token_start, int token_count) {
  return MakeKvChunkHeader(cache.width(), request_id, layer, token_start, token_count);
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

absl::Status CheckKvChunk(const KvChunkHeader& h, int64_t width) {
  if (h.dtype != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrFormat("kv chunk: dtype %s is not supported yet", DTypeName(h.dtype)));
  }
  if (h.width != static_cast<uint32_t>(width)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: width %d, cache width %d", h.width, width));
  }
  return absl::OkStatus();
}

absl::Status CheckKvPayload(const KvChunkHeader& h, int64_t width, size_t payload_bytes) {
  const size_t want = 2 * static_cast<size_t>(h.token_count) * width * sizeof(float);
  if (payload_bytes != want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: payload has %d bytes, want %d", payload_bytes, want));
  }
  return absl::OkStatus();
}

absl::Status ScatterKv(std::span<const char> payload, const KvChunkHeader& h,
                       std::span<const int> block_table, KvCache* cache) {
  if (absl::Status s = CheckKvChunk(h, cache->width()); !s.ok()) return s;
  if (absl::Status s = CheckRange(*cache, h.layer, block_table, h.token_start, h.token_count);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckKvPayload(h, cache->width(), payload.size()); !s.ok()) return s;
  const int64_t w = cache->width();
  const size_t half = static_cast<size_t>(h.token_count) * w * sizeof(float);
  const char* k_in = payload.data();
  const char* v_in = payload.data() + half;
  float* k = cache->k(h.layer);
  float* v = cache->v(h.layer);
  ForEachRun(*cache, block_table, h.token_start, h.token_count,
             [&](int64_t offset, int64_t wire_row, int64_t rows) {
               const size_t at = wire_row * w * sizeof(float);
               const size_t n = rows * w * sizeof(float);
               std::memcpy(k + offset, k_in + at, n);
               std::memcpy(v + offset, v_in + at, n);
             });
  return absl::OkStatus();
}

}  // namespace tandem
