// Copies KV rows between a paged cache and the contiguous wire layout of one chunk. These are
// the CPU twins of the CUDA pack/unpack kernels.
//
// Paged side (engine/kv/kv_cache.h): per layer K and V each [num_blocks, block_size, width] of the
// cache dtype; token t of a sequence lives, for a layer of group g, in the block of logical block
// t / block_size of g in the sequence's table (engine/kv/block_table.h; with one group,
// block_table[t / block_size]), row t % block_size. Wire side (kv_transfer/wire.h): K [token_count,
// width] then V [token_count, width], then (fp8) the scales.
#ifndef TANDEM_KV_TRANSFER_KV_PACK_H_
#define TANDEM_KV_TRANSFER_KV_PACK_H_

#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "kv_transfer/wire.h"

namespace tandem {

// Packs tokens [token_start, token_start + token_count) of `layer` into a payload of K then V
// rows [token_count, cache.width()] in the cache's dtype, as stored, and for fp8 the sequence's
// scales [2, n_kv_heads]. INVALID_ARGUMENT when the layer is out of range, the range is empty or
// not covered by `block_table`, or a block id is outside the cache.
absl::StatusOr<std::string> GatherKv(const KvCache& cache, int layer,
                                     std::span<const int> block_table, int token_start,
                                     int token_count);

// The header describing what GatherKv(cache, layer, ..., token_start, token_count) produced;
// the lease fields are left for the sender to fill.
KvChunkHeader MakeKvChunkHeader(const KvCache& cache, uint64_t request_id, int layer,
                                int token_start, int token_count);
// The same for a float32 cache of `width` elements per token row (one held elsewhere, e.g. on a
// device).
KvChunkHeader MakeKvChunkHeader(int width, uint64_t request_id, int layer, int token_start,
                                int token_count);

// Checks a chunk's header against a cache: its dtype (FAILED_PRECONDITION naming both when they
// differ), width and scale groups; and a payload's size against the header. ScatterKv's own
// checks; for caches held elsewhere (a float32 device cache of `width`) too.
absl::Status CheckKvChunk(const KvChunkHeader& h, const KvCacheSpec& spec);
absl::Status CheckKvChunk(const KvChunkHeader& h, int64_t width);
absl::Status CheckKvPayload(const KvChunkHeader& h, size_t payload_bytes);

// Unpacks a chunk into the blocks of `block_table` (the receiver's own, with its own block
// size), as stored, with its fp8 scales into every block it touches. Checks dtype, width,
// layer, payload size and that every touched block id is inside the cache, before writing.
absl::Status ScatterKv(std::span<const char> payload, const KvChunkHeader& h,
                       std::span<const int> block_table, KvCache* cache);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_KV_PACK_H_
