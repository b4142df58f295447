// The CPU attention's arguments for a test's token list, shared by the CPU kernel tests and the
// CUDA twins that compare against them.
#ifndef TANDEM_TESTS_KERNELS_ATTENTION_ARGS_H_
#define TANDEM_TESTS_KERNELS_ATTENTION_ARGS_H_

#include <vector>

#include "kernels/backend.h"

namespace tandem::testing {

// Tokens of sequences token_seq[t] at positions token_pos[t] over block tables `tables` [seqs,
// mb] (host pointers into the vectors, which must outlive the result).
inline PagedAttentionArgs AttentionArgs(int n_heads, int n_kv_heads, int head_dim, int block_size,
                                        int mb, int window, const std::vector<int>& token_seq,
                                        const std::vector<int>& token_pos,
                                        const std::vector<int>& tables) {
  PagedAttentionArgs a;
  a.num_tokens = static_cast<int>(token_seq.size());
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.block_size = block_size;
  a.max_blocks_per_seq = mb;
  a.token_seq = token_seq.data();
  a.token_pos = token_pos.data();
  a.block_tables = tables.data();
  a.sliding_window = window;
  return a;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_KERNELS_ATTENTION_ARGS_H_
