// Host-side planning of one device forward step (no CUDA here, so the CPU tests cover it):
// validating a batch of sequence chunks, flattening it into per-token metadata, padding a
// decode-only step to its CUDA-graph bucket, packing every array into one int32 buffer (the
// step's single host→device copy) and sizing the device workspace.
//
// The semantics are those of Model::Forward (engine/model.h): chunk s brings tokens at positions
// [start_pos, start_pos + n) whose KV goes to block_table[pos / block_size], row pos %
// block_size; logits are produced for its last token, or for every token with all_logits.
#ifndef TANDEM_ENGINE_CUDA_STEP_PLAN_H_
#define TANDEM_ENGINE_CUDA_STEP_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_api.h"

namespace tandem::cuda {

// Query tokens per tile of the prefill attention kernel (prefill_attention.cu).
inline constexpr int kPrefillTileTokens = TANDEM_PREFILL_TILE_TOKENS;

// Batch sizes for which decode-only steps are captured as CUDA graphs.
inline constexpr int kDecodeBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

// The smallest bucket >= num_seqs, or -1 when num_seqs is < 1 or above the largest bucket.
int DecodeBucket(int num_seqs);

// Decode graphs are also keyed by a context bucket: the attention kernel's partition count and
// the block-table stride follow it, so a short context does not pay for the model's longest.
inline constexpr int kMinContextBucket = 512;

struct StepChunk {
  std::span<const int> tokens;       // [n] new token ids, n >= 1
  int start_pos = 0;                 // position of tokens[0]
  std::span<const int> block_table;  // >= ceil((start_pos + n) / block_size) block ids
  bool all_logits = false;
};

// The fixed sizes a step must fit in (those of the device model).
struct StepLimits {
  int vocab_size = 0;
  int max_seq_len = 0;  // positions must be < max_seq_len
  int num_blocks = 0;   // usable block ids are [0, num_blocks); num_blocks is the pad block
  int block_size = 0;
  int max_batch_tokens = 0;  // tokens per step (after padding)
  int max_seqs = 0;          // chunks per step (after padding)
  int max_logit_rows = 0;    // logit rows per step (after padding)

  // ceil(max_seq_len / block_size): the longest block table.
  int max_blocks_per_seq() const { return (max_seq_len + block_size - 1) / block_size; }
};

// The context bucket of a decode graph step whose longest sequence has max_context positions:
// kMinContextBucket doubled until it covers max_context, capped at the capacity
// (max_blocks_per_seq() * block_size), in whole blocks.
int ContextBucket(int max_context, const StepLimits& limits);

// Checks a model description (sizes positive and consistent, dtypes known, head_dim <= 256,
// capacities within the graph buckets' needs); "" or the error naming the field.
std::string ValidateModelDesc(const TandemModelDesc& d);
StepLimits LimitsFromDesc(const TandemModelDesc& d);

// Offsets (in int32 elements) of the arrays inside the packed metadata buffer.
struct StepLayout {
  int ids = 0;           // [tokens] token ids
  int token_seq = 0;     // [tokens] chunk index of each token
  int token_pos = 0;     // [tokens] position of each token
  int slots = 0;         // [tokens] cache slot = block * block_size + offset
  int logit_rows = 0;    // [rows] token index whose logits are row r
  int block_tables = 0;  // [seqs, table stride] block ids (pad block beyond a chunk's)
  int tiles = 0;         // [num_tiles, 2] (first token, token count) of each attention tile
  // FlashInfer's page lists of the same sequences (kernels/cuda/fi_attention.h FiSequences), for
  // KV caches of bf16 and fp8: query-row and page offsets, the last page's fill, and the pages
  // (each sequence's first blocks of its table, packed; room for seqs * table stride).
  int fi_q_indptr = 0;       // [seqs + 1]
  int fi_kv_indptr = 0;      // [seqs + 1]
  int fi_last_page_len = 0;  // [seqs]
  int fi_kv_indices = 0;     // [<= seqs * table stride]
  int total = 0;             // ints in the buffer
};

// The layout for capacities (tokens, rows, seqs, tiles, table stride); a decode graph of bucket
// B and context bucket C always uses (B, B, B, 0, C / block_size), so its device addresses are
// the same at every replay.
StepLayout MakeStepLayout(int tokens, int rows, int seqs, int tiles, int table_stride);

struct StepPlan {
  bool decode_only = false;  // every chunk has one token and wants its last logits only
  int num_tokens = 0;        // after padding (== bucket for a padded decode step)
  int num_real_tokens = 0;
  int num_seqs = 0;       // after padding
  int num_rows = 0;       // logit rows after padding
  int num_real_rows = 0;  // rows the caller gets back: the first num_real_rows
  int num_tiles = 0;
  int max_context = 0;     // max over tokens of position + 1
  int context_bucket = 0;  // > 0: a padded decode step for a graph (its context bucket)
  int table_stride = 0;    // block ids per row of the packed block tables
  StepLayout layout;
  std::vector<int32_t> meta;  // [layout.total], the one host→device copy
};

// FlashInfer's page lists (StepLayout fi_*) of sequences with num_tokens[s] new tokens from
// start_pos[s], whose block tables are rows of `tables` (`stride` ids each): query rows in order,
// pages [0, ceil((start_pos + n) / block_size)) of each table, the last holding the rest.
struct FiPageLists {
  std::vector<int32_t> q_indptr, kv_indptr, kv_last_page_len, kv_indices;
};
void BuildFiPageLists(std::span<const int> num_tokens, std::span<const int> start_pos,
                      const int32_t* tables, int stride, int block_size, FiPageLists* out);

// Tiles of at most kPrefillTileTokens consecutive tokens of one chunk, appended to `tiles` as
// (first token, count) pairs; token_seq [num_tokens] must group each chunk's tokens together.
void BuildAttentionTiles(std::span<const int> token_seq, std::vector<int32_t>* tiles);

// Byte offset of the sampling parameters after a step's metadata of `meta_ints` ints.
inline size_t SampleParamsOffset(size_t meta_ints) { return (meta_ints * 4 + 15) / 16 * 16; }

// Validates `batch` against `limits` and fills `plan`; `pad_decode` pads a decode-only step to
// its bucket with tokens that write only to the pad block (id num_blocks) and whose logits are
// dropped (unless the bucket exceeds a capacity: then the step stays unpadded). Returns "" or the
// error, naming the chunk and field.
std::string PlanStep(std::span<const StepChunk> batch, const StepLimits& limits, bool pad_decode,
                     StepPlan* plan);

// Device workspace of a model for `limits` (bytes, each region 256-byte aligned).
struct WorkspaceShape {
  int dim = 0, hidden_dim = 0, q_dim = 0, kv_dim = 0, n_heads = 0, head_dim = 0, vocab_size = 0;
  bool bf16_weights = false;
  bool fi_attention = false;  // bf16/fp8 KV: attention through FlashInfer, in bf16
};
struct WorkspaceLayout {
  size_t x = 0, xb = 0, q = 0, k = 0, v = 0, att = 0, hb = 0, hb2 = 0;  // activations
  size_t rows = 0;                                                      // [max_logit_rows, dim]
  size_t logits = 0;                                                    // [max_logit_rows, vocab]
  size_t x16 = 0;           // bf16 copy of a GEMM input: [max_batch_tokens, max cols]
  size_t q16 = 0, o16 = 0;  // fi_attention: bf16 queries and output [max_batch_tokens, q_dim]
  size_t attn = 0;          // split-K decode attention partials
  size_t attn_bytes = 0;
  size_t sample = 0;  // sampler workspace
  size_t sample_bytes = 0;
  size_t tokens = 0;  // [max_logit_rows] sampled tokens
  // The step's upload: the packed metadata (at most meta_ints ints), then at the next 16-byte
  // boundary the rows' sampling parameters; meta_bytes in all.
  size_t meta = 0;
  size_t meta_ints = 0;
  size_t meta_bytes = 0;
  size_t bad = 0;  // one int: embedding's bad-id flag
  size_t total = 0;
};
// attn_bytes / sample_bytes come from the kernels' own sizing functions (passed in, so this
// stays free of CUDA); sample_param_bytes is sizeof(TandemSampleRowParams).
WorkspaceLayout MakeWorkspaceLayout(const WorkspaceShape& s, const StepLimits& limits,
                                    size_t attn_bytes, size_t sample_bytes,
                                    size_t sample_param_bytes);

// The largest packed metadata any step within `limits` can need (ints).
int MaxMetaInts(const StepLimits& limits);

}  // namespace tandem::cuda

#endif  // TANDEM_ENGINE_CUDA_STEP_PLAN_H_
