// Block-quantized weights in the layouts of GGUF files (ggml's block formats), and the 8-bit
// activation blocks the quantized matmul multiplies them with.
//
// A quantized row of `cols` elements is cols / BlockElems blocks of BlockBytes each, stored one
// after another; a matrix is rows of that size. Per block (d, m: float16 unless noted):
//   Q8_0  32 elements, 34 bytes: d, int8 q[32]                         value = d * q
//   Q4_0  32, 18: d, 16 bytes of nibbles                               value = d * (q - 8)
//   Q4_1  32, 20: d, m, 16 bytes of nibbles                            value = d * q + m
//   Q5_0  32, 22: d, 32 high bits, 16 bytes of nibbles                 value = d * (q - 16)
//   Q5_1  32, 24: d, m, 32 high bits, 16 bytes of nibbles              value = d * q + m
//     (element j < 16 is the low nibble of byte j, element j + 16 its high nibble; the fifth
//     bit of element j is bit j of the 32-bit little-endian high bits)
//   Q4_K  256, 144: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128
//         bytes of nibbles (each 32 bytes hold sub-block 2i in the low nibbles, 2i+1 in the
//         high ones)                                                 value = d * sc * q - dmin * m
//   Q5_K  256, 176: as Q4_K plus 32 bytes of high bits (bit 2i of byte l: element l of
//         sub-block 2i; bit 2i + 1: of sub-block 2i + 1), before the nibbles
//   Q6_K  256, 210: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales (sub-blocks of
//         16), d last                                                value = d * sc * (q - 32)
#ifndef TANDEM_KERNELS_QUANT_H_
#define TANDEM_KERNELS_QUANT_H_

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace tandem {

// Elements per block (1 for the plain dtypes) and bytes per block.
constexpr int64_t BlockElems(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return 256;
    default:
      return 1;
  }
}

constexpr int64_t BlockBytes(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return 34;
    case DType::kQ4_0:
      return 18;
    case DType::kQ4_1:
      return 20;
    case DType::kQ5_0:
      return 22;
    case DType::kQ5_1:
      return 24;
    case DType::kQ4_K:
      return 144;
    case DType::kQ5_K:
      return 176;
    case DType::kQ6_K:
      return 210;
    default:
      return static_cast<int64_t>(DTypeSize(t));
  }
}

inline bool IsQuantized(DType t) { return BlockElems(t) > 1; }
// Bytes of a row of `cols` elements (cols a multiple of BlockElems for quantized types).
inline int64_t RowBytes(DType t, int64_t cols) { return cols / BlockElems(t) * BlockBytes(t); }

// Dequantizes `n` elements (a multiple of BlockElems(t); any n for plain dtypes) to float32.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Quantizes `n` float32 elements (a multiple of BlockElems(t)) into `t`: round to nearest with
// a scale (and minimum) per block from its range. Q8_0 is ggml's reference quantizer byte for
// byte; K types search nothing (ggml's quantizers search scales: files made by llama.cpp are a
// little more accurate than this). Loading with --dtype, tests and `tandem model` tooling use
// it; the engine reads quantized files as they are.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

// Activations quantized for the integer dot products: blocks of 32 as two int8 parts, q and a
// residual r, with x ~= unit * (128 * q + r): q = round(x / d) with d = max|x| / 127 and
// r = round((x - d * q) / unit), unit = d / 128 (|r| <= 64). That is about 14 bits per value,
// so the dot products are nearly those of float32 (one int8 part alone, as llama.cpp's q8
// blocks, flips the top token at ~4% of a 135M model's positions; two flip under 1%), at the
// cost of a second integer product per block. `sum` and `sum16` are the sums of the quantized
// values (all 32, the first 16) for the formats with an offset or minimum:
// w = s * q_w + c gives sum(w * x) = s * unit * sum(q_w * (128 q + r)) + c * sum(x).
inline constexpr int kActBlock = 32;
struct ActBlock {
  float unit;
  float sum;
  float sum16;
  int8_t q[kActBlock];
  int8_t r[kActBlock];
};
// x[n] (n a multiple of 32) -> n / 32 blocks.
void QuantizeActivations(const float* x, ActBlock* out, int64_t n);

// 128 * sum(128 q + r) over a block: what biasing signed (Q8_0) weights by 128 to make them
// unsigned for the byte dot products adds to the block's integer sum.
inline int32_t Q8BlockBias(const ActBlock& a) {
  int32_t sum = 0;
  for (int l = 0; l < kActBlock; ++l) sum += 128 * a.q[l] + a.r[l];
  return 128 * sum;
}

}  // namespace tandem

#endif  // TANDEM_KERNELS_QUANT_H_
