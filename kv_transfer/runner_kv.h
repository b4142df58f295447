// KV transfer over a model runner's cache (engine/model_runner.h): the sender's packing and the
// receiver's unpacking of one chunk, whether the cache is in host memory (kv_pack.h's gather and
// scatter) or on a device (copied by the runner); in the cache's dtype either way.
#ifndef TANDEM_KV_TRANSFER_RUNNER_KV_H_
#define TANDEM_KV_TRANSFER_RUNNER_KV_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model_runner.h"
#include "kv_transfer/wire.h"

namespace tandem {

// Payload of tokens [token_start, token_start + token_count) of `layer` (kv_pack.h GatherKv's
// layout). INVALID_ARGUMENT for an empty or negative range, or one the block table or cache
// does not cover.
absl::StatusOr<std::string> PackRunnerKv(ModelRunner& runner, int layer,
                                         std::span<const int> block_table, int token_start,
                                         int token_count);

// The header of what PackRunnerKv produced; the lease fields are left for the sender.
KvChunkHeader MakeRunnerKvHeader(ModelRunner& runner, uint64_t request_id, int layer,
                                 int token_start, int token_count);

// Writes a received chunk into the blocks of `block_table`, after checking its dtype, width,
// range and payload size against the runner's cache.
absl::Status UnpackRunnerKv(ModelRunner& runner, std::span<const char> payload,
                            const KvChunkHeader& h, std::span<const int> block_table);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_RUNNER_KV_H_
