#include "kv_transfer/runner_kv.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "kv_transfer/kv_pack.h"

namespace tandem {

absl::StatusOr<std::string> PackRunnerKv(ModelRunner& runner, int layer,
                                         std::span<const int> block_table, int token_start,
                                         int token_count) {
  if (const KvCache* cache = runner.host_kv_cache()) {
    return GatherKv(*cache, layer, block_table, token_start, token_count);
  }
  if (token_count <= 0 || token_start < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv chunk: bad token range start %d count %d", token_start, token_count));
  }
  const KvChunkHeader h = MakeRunnerKvHeader(runner, 0, layer, token_start, token_count);
  absl::StatusOr<uint64_t> bytes = KvChunkPayloadBytes(h, UINT64_MAX);
  if (!bytes.ok()) return bytes.status();
  std::string out(*bytes, '\0');
  absl::Status s = runner.CopyKvOut(layer, block_table, token_start, token_count, out.data());
  if (!s.ok()) return s;
  return out;
}

KvChunkHeader MakeRunnerKvHeader(ModelRunner& runner, uint64_t request_id, int layer,
                                 int token_start, int token_count) {
  if (const KvCache* cache = runner.host_kv_cache()) {
    return MakeKvChunkHeader(*cache, request_id, layer, token_start, token_count);
  }
  const KvCacheSpec spec = runner.kv_spec();
  KvChunkHeader h = MakeKvChunkHeader(spec.width(), request_id, layer, token_start, token_count);
  h.dtype = spec.dtype;
  if (spec.dtype == DType::kFp8E4M3) h.scale_groups = static_cast<uint32_t>(spec.n_kv_heads);
  return h;
}

absl::Status UnpackRunnerKv(ModelRunner& runner, std::span<const char> payload,
                            const KvChunkHeader& h, std::span<const int> block_table) {
  if (KvCache* cache = runner.host_kv_cache()) return ScatterKv(payload, h, block_table, cache);
  if (absl::Status s = CheckKvChunk(h, runner.kv_spec()); !s.ok()) return s;
  if (h.token_count == 0 || h.token_count > (1u << 30) || h.token_start > (1u << 30)) {
    return absl::InvalidArgumentError("kv chunk: bad token range");
  }
  if (absl::Status s = CheckKvPayload(h, payload.size()); !s.ok()) return s;
  return runner.CopyKvIn(static_cast<int>(h.layer), block_table, static_cast<int>(h.token_start),
                         static_cast<int>(h.token_count), payload.data());
}

}  // namespace tandem
