#include "engine/cuda/step_plan.h"

#include <algorithm>
#include <cstdio>

namespace tandem::cuda {
namespace {

std::string Err(const char* fmt, long a = 0, long b = 0, long c = 0, long d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), fmt, a, b, c, d);
  return buf;
}

size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

int ContextBucket(int max_context, const StepLimits& lim) {
  const int capacity = lim.max_blocks_per_seq() * lim.block_size;
  int c = kMinContextBucket;
  while (c < max_context && c < capacity) c *= 2;
  c = std::min(c, capacity);
  return (c + lim.block_size - 1) / lim.block_size * lim.block_size;  // whole blocks
}

int DecodeBucket(int num_seqs) {
  if (num_seqs < 1) return -1;
  for (int b : kDecodeBuckets) {
    if (num_seqs <= b) return b;
  }
  return -1;
}

StepLayout MakeStepLayout(int tokens, int rows, int seqs, int tiles, int max_blocks_per_seq) {
  StepLayout l;
  int off = 0;
  l.ids = off;
  off += tokens;
  l.token_seq = off;
  off += tokens;
  l.token_pos = off;
  off += tokens;
  l.slots = off;
  off += tokens;
  l.logit_rows = off;
  off += rows;
  // 16-byte aligned start for the tables (4 ints), as the kernels read them through int pointers
  // only, this is for tidiness of the copies, not a requirement.
  off = (off + 3) / 4 * 4;
  l.block_tables = off;
  off += seqs * max_blocks_per_seq;
  l.tiles = off;
  off += 2 * tiles;
  l.fi_q_indptr = off;
  off += seqs + 1;
  l.fi_kv_indptr = off;
  off += seqs + 1;
  l.fi_last_page_len = off;
  off += seqs;
  l.fi_kv_indices = off;
  off += seqs * max_blocks_per_seq;
  l.total = off;
  return l;
}

void BuildFiPageLists(std::span<const int> num_tokens, std::span<const int> start_pos,
                      const int32_t* tables, int stride, int block_size, FiPageLists* out) {
  *out = FiPageLists();
  out->q_indptr.push_back(0);
  out->kv_indptr.push_back(0);
  for (size_t s = 0; s < num_tokens.size(); ++s) {
    const int kv_len = start_pos[s] + num_tokens[s];
    const int pages = (kv_len + block_size - 1) / block_size;
    out->q_indptr.push_back(out->q_indptr.back() + num_tokens[s]);
    out->kv_indptr.push_back(out->kv_indptr.back() + pages);
    out->kv_last_page_len.push_back(kv_len - (pages - 1) * block_size);
    const int32_t* row = tables + static_cast<int64_t>(s) * stride;
    out->kv_indices.insert(out->kv_indices.end(), row, row + pages);
  }
}

void BuildAttentionTiles(std::span<const int> token_seq, std::vector<int32_t>* tiles) {
  const int n = static_cast<int>(token_seq.size());
  int t = 0;
  while (t < n) {
    int end = t + 1;
    while (end < n && end - t < kPrefillTileTokens && token_seq[end] == token_seq[t]) ++end;
    tiles->push_back(t);
    tiles->push_back(end - t);
    t = end;
  }
}

std::string PlanStep(std::span<const StepChunk> batch, const StepLimits& lim, bool pad_decode,
                     StepPlan* plan) {
  *plan = StepPlan();
  if (batch.empty()) return "forward: empty batch";
  if (lim.block_size <= 0 || lim.max_seq_len <= 0 || lim.num_blocks <= 0) {
    return "forward: model limits not set (block_size, max_seq_len, num_blocks)";
  }
  const int bs = lim.block_size;
  int num_tokens = 0, num_rows = 0, max_context = 0;
  bool decode_only = true;
  for (size_t s = 0; s < batch.size(); ++s) {
    const StepChunk& ch = batch[s];
    const long n = static_cast<long>(ch.tokens.size());
    if (n == 0) return Err("forward: sequence %ld has no tokens", static_cast<long>(s));
    if (ch.start_pos < 0 || ch.start_pos + n > lim.max_seq_len) {
      return Err("forward: sequence %ld: positions [%ld, %ld) exceed the context length %ld",
                 static_cast<long>(s), ch.start_pos, ch.start_pos + n, lim.max_seq_len);
    }
    for (int t : ch.tokens) {
      if (t < 0 || t >= lim.vocab_size) {
        return Err("forward: sequence %ld: token id %ld outside the vocabulary [0, %ld)",
                   static_cast<long>(s), t, lim.vocab_size);
      }
    }
    const long needed = (ch.start_pos + n + bs - 1) / bs;
    if (static_cast<long>(ch.block_table.size()) < needed) {
      return Err("forward: sequence %ld: %ld blocks cover fewer than %ld positions",
                 static_cast<long>(s), static_cast<long>(ch.block_table.size()), ch.start_pos + n);
    }
    for (long i = 0; i < needed; ++i) {
      if (ch.block_table[i] < 0 || ch.block_table[i] >= lim.num_blocks) {
        return Err("forward: sequence %ld: block id %ld out of range [0, %ld)",
                   static_cast<long>(s), ch.block_table[i], lim.num_blocks);
      }
    }
    num_tokens += static_cast<int>(n);
    num_rows += ch.all_logits ? static_cast<int>(n) : 1;
    max_context = std::max(max_context, ch.start_pos + static_cast<int>(n));
    if (n != 1 || ch.all_logits) decode_only = false;
  }
  const int num_seqs = static_cast<int>(batch.size());
  int padded = num_tokens;
  bool graph_step = false;
  if (decode_only && pad_decode && DecodeBucket(num_seqs) > 0) {
    // Padding that would not fit the capacities is skipped: the step then runs without a graph.
    const int bucket = DecodeBucket(num_seqs);
    if (bucket <= lim.max_batch_tokens && bucket <= lim.max_seqs &&
        num_rows + (bucket - num_tokens) <= lim.max_logit_rows) {
      padded = bucket;
      graph_step = true;
    }
  }
  if (padded > lim.max_batch_tokens) {
    return Err("forward: %ld tokens (padded to %ld) exceed max_batch_tokens %ld", num_tokens,
               padded, lim.max_batch_tokens);
  }
  const int padded_seqs = num_seqs + (padded - num_tokens);
  if (padded_seqs > lim.max_seqs) {
    return Err("forward: %ld sequences (padded to %ld) exceed max_seqs %ld", num_seqs, padded_seqs,
               lim.max_seqs);
  }
  const int padded_rows = num_rows + (padded - num_tokens);
  if (padded_rows > lim.max_logit_rows) {
    return Err("forward: %ld logit rows exceed max_logit_rows %ld", padded_rows,
               lim.max_logit_rows);
  }

  plan->decode_only = decode_only;
  plan->num_tokens = padded;
  plan->num_real_tokens = num_tokens;
  plan->num_seqs = padded_seqs;
  plan->num_rows = padded_rows;
  plan->num_real_rows = num_rows;
  plan->max_context = max_context;
  // The block-table stride: for a graph step, that of its context bucket (fixed for the graph);
  // else just what the longest chunk needs (a small upload).
  if (graph_step) plan->context_bucket = ContextBucket(max_context, lim);
  const int stride =
      plan->context_bucket > 0 ? plan->context_bucket / bs : (max_context + bs - 1) / bs;
  plan->table_stride = stride;

  std::vector<int32_t> token_seq(padded);
  {
    int t = 0;
    for (int s = 0; s < num_seqs; ++s) {
      for (size_t i = 0; i < batch[s].tokens.size(); ++i) token_seq[t++] = s;
    }
    for (int p = 0; t < padded; ++p) token_seq[t++] = num_seqs + p;
  }
  std::vector<int32_t> tiles;
  if (!decode_only) BuildAttentionTiles(token_seq, &tiles);
  plan->num_tiles = static_cast<int>(tiles.size() / 2);
  plan->layout = MakeStepLayout(padded, padded_rows, padded_seqs, plan->num_tiles, stride);
  const StepLayout& L = plan->layout;
  plan->meta.assign(L.total, 0);
  int32_t* m = plan->meta.data();
  std::copy(token_seq.begin(), token_seq.end(), m + L.token_seq);
  std::copy(tiles.begin(), tiles.end(), m + L.tiles);
  std::fill(m + L.block_tables, m + L.block_tables + padded_seqs * stride, lim.num_blocks);
  int t = 0, r = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const StepChunk& ch = batch[s];
    const int n = static_cast<int>(ch.tokens.size());
    const int needed = (ch.start_pos + n + bs - 1) / bs;
    std::copy_n(ch.block_table.begin(), needed, m + L.block_tables + s * stride);
    for (int i = 0; i < n; ++i, ++t) {
      const int pos = ch.start_pos + i;
      if (ch.all_logits || i == n - 1) m[L.logit_rows + r++] = t;
      m[L.ids + t] = ch.tokens[i];
      m[L.token_pos + t] = pos;
      m[L.slots + t] = ch.block_table[pos / bs] * bs + pos % bs;
    }
  }
  // Padding tokens: id 0 at position 0 of their own sequence, whose table is all pad block.
  for (; t < padded; ++t) {
    m[L.ids + t] = 0;
    m[L.token_pos + t] = 0;
    m[L.slots + t] = lim.num_blocks * bs;
    m[L.logit_rows + r++] = t;
  }
  std::vector<int> counts(padded_seqs, 1), starts(padded_seqs, 0);
  for (int s = 0; s < num_seqs; ++s) {
    counts[s] = static_cast<int>(batch[s].tokens.size());
    starts[s] = batch[s].start_pos;
  }
  FiPageLists fi;
  BuildFiPageLists(counts, starts, m + L.block_tables, stride, bs, &fi);
  std::copy(fi.q_indptr.begin(), fi.q_indptr.end(), m + L.fi_q_indptr);
  std::copy(fi.kv_indptr.begin(), fi.kv_indptr.end(), m + L.fi_kv_indptr);
  std::copy(fi.kv_last_page_len.begin(), fi.kv_last_page_len.end(), m + L.fi_last_page_len);
  std::copy(fi.kv_indices.begin(), fi.kv_indices.end(), m + L.fi_kv_indices);
  return "";
}

std::string ValidateModelDesc(const TandemModelDesc& d) {
  struct Field {
    const char* name;
    long value;
  };
  const Field positive[] = {{"dim", d.dim},
                            {"hidden_dim", d.hidden_dim},
                            {"n_layers", d.n_layers},
                            {"n_heads", d.n_heads},
                            {"n_kv_heads", d.n_kv_heads},
                            {"head_dim", d.head_dim},
                            {"vocab_size", d.vocab_size},
                            {"max_seq_len", d.max_seq_len},
                            {"num_blocks", d.num_blocks},
                            {"block_size", d.block_size},
                            {"max_batch_tokens", d.max_batch_tokens},
                            {"max_seqs", d.max_seqs},
                            {"max_logit_rows", d.max_logit_rows}};
  for (const Field& f : positive) {
    if (f.value <= 0) return std::string("model desc: ") + f.name + " must be > 0";
  }
  if (d.n_heads % d.n_kv_heads != 0) {
    return "model desc: n_heads must be a multiple of n_kv_heads";
  }
  if (d.head_dim % 2 != 0 || d.head_dim > 256) {
    return "model desc: head_dim must be even and <= 256";
  }
  if (d.weight_dtype != 0 && d.weight_dtype != 2) {
    return "model desc: weight_dtype must be 0 (f32) or 2 (bf16)";
  }
  if (d.rope_style != 0 && d.rope_style != 1) return "model desc: rope_style must be 0 or 1";
  if (d.rope_inv_freq == nullptr) return "model desc: rope_inv_freq is null";
  if (d.sliding_window < 0) return "model desc: sliding_window must be >= 0";
  if (d.max_seqs > d.max_batch_tokens) {
    return "model desc: max_seqs must be <= max_batch_tokens";
  }
  if (d.kv_dtype != TANDEM_KV_F32 && d.kv_dtype != TANDEM_KV_BF16 && d.kv_dtype != TANDEM_KV_FP8) {
    return "model desc: kv_dtype must be 0 (f32), 2 (bf16) or 3 (fp8)";
  }
  if (d.kv_dtype == TANDEM_KV_FP8 && d.n_kv_heads > 256) {
    return "model desc: an fp8 KV cache needs n_kv_heads <= 256";
  }
  if (static_cast<long long>(d.num_blocks + 1) * d.block_size > (1ll << 31) - 1) {
    return "model desc: (num_blocks + 1) * block_size must fit in an int (cache slots)";
  }
  return "";
}

StepLimits LimitsFromDesc(const TandemModelDesc& d) {
  StepLimits l;
  l.vocab_size = d.vocab_size;
  l.max_seq_len = d.max_seq_len;
  l.num_blocks = d.num_blocks;
  l.block_size = d.block_size;
  l.max_batch_tokens = d.max_batch_tokens;
  l.max_seqs = d.max_seqs;
  l.max_logit_rows = d.max_logit_rows;
  return l;
}

int MaxMetaInts(const StepLimits& lim) {
  const int tiles = lim.max_batch_tokens / kPrefillTileTokens + lim.max_seqs + 1;
  return MakeStepLayout(lim.max_batch_tokens, lim.max_logit_rows, lim.max_seqs, tiles,
                        lim.max_blocks_per_seq())
      .total;
}

WorkspaceLayout MakeWorkspaceLayout(const WorkspaceShape& s, const StepLimits& lim,
                                    size_t attn_bytes, size_t sample_bytes,
                                    size_t sample_param_bytes) {
  WorkspaceLayout w;
  size_t off = 0;
  const size_t T = static_cast<size_t>(lim.max_batch_tokens);
  const size_t R = static_cast<size_t>(lim.max_logit_rows);
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += AlignUp(bytes);
    return at;
  };
  w.x = take(T * s.dim * 4);
  w.xb = take(T * s.dim * 4);
  w.q = take(T * s.q_dim * 4);
  w.k = take(T * s.kv_dim * 4);
  w.v = take(T * s.kv_dim * 4);
  w.att = take(T * s.q_dim * 4);
  w.hb = take(T * s.hidden_dim * 4);
  w.hb2 = take(T * s.hidden_dim * 4);
  w.rows = take(R * s.dim * 4);
  w.logits = take(R * s.vocab_size * 4);
  const size_t max_cols = std::max({s.dim, s.hidden_dim, s.q_dim});
  w.x16 = take(s.bf16_weights ? T * max_cols * 2 : 0);
  w.q16 = take(s.fi_attention ? T * s.q_dim * 2 : 0);
  w.o16 = take(s.fi_attention ? T * s.q_dim * 2 : 0);
  w.attn_bytes = attn_bytes;
  w.attn = take(attn_bytes);
  w.sample_bytes = sample_bytes;
  w.sample = take(sample_bytes);
  w.tokens = take(R * 4);
  w.meta_ints = static_cast<size_t>(MaxMetaInts(lim));
  w.meta_bytes = SampleParamsOffset(w.meta_ints) + R * sample_param_bytes;
  w.meta = take(w.meta_bytes);
  w.bad = take(4);
  w.total = off;
  return w;
}

}  // namespace tandem::cuda
