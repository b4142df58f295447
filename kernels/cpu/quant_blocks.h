// Reading the float part of a quantized weight block (kernels/quant.h), shared by the quantized
// matmul paths (quant_matmul.cc, avx512_kernels.inc) and the block codecs (quant.cc). Plain C++:
// no vector instructions, so that every ISA path can include it.
#ifndef TANDEM_KERNELS_CPU_QUANT_BLOCKS_H_
#define TANDEM_KERNELS_CPU_QUANT_BLOCKS_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/quant.h"

namespace tandem::quant_blocks {

// Q4_K / Q5_K: the 6-bit scale and minimum of sub-block j (0..7) from the 12 packed bytes.
inline void ScaleMinK(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The float part of weight block k (32 elements): s and c for elements [0, 16) and [16, 32), with
// w = s * q + c. They are read as two float16 values h0, h1 times small factors (s0 = h0 * a0,
// c0 = h1 * b0, ...), so that each path converts the halves its own way (F16C where it has it).
struct BlockScales {
  float s0, s1, c0, c1;
};
struct RawScales {
  uint16_t h0, h1;
  float a0, a1, b0, b1;
};

inline uint16_t Bits16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

template <DType T>
inline RawScales RawScalesOf(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::kQ8_0) {
    const uint16_t d = Bits16(row + k * 34);
    return {d, d, 1, 1, 0, 0};
  } else if constexpr (T == DType::kQ4_0 || T == DType::kQ5_0) {
    const uint16_t d = Bits16(row + k * BlockBytes(T));
    const float c = T == DType::kQ4_0 ? -8 : -16;
    return {d, d, 1, 1, c, c};
  } else if constexpr (T == DType::kQ4_1 || T == DType::kQ5_1) {
    const uint8_t* b = row + k * BlockBytes(T);
    return {Bits16(b), Bits16(b + 2), 1, 1, 1, 1};
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    const uint8_t* b = row + (k / 8) * BlockBytes(T);
    int sc, m;
    ScaleMinK(b + 4, static_cast<int>(k % 8), &sc, &m);
    const float fs = static_cast<float>(sc), fm = -static_cast<float>(m);
    return {Bits16(b), Bits16(b + 2), fs, fs, fm, fm};
  } else {  // Q6_K
    const uint8_t* b = row + (k / 8) * 210;
    const int j = static_cast<int>(k % 8);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * (j / 4) + 2 * (j % 4);
    const uint16_t d = Bits16(b + 208);
    const float a0 = sc[0], a1 = sc[1];
    return {d, d, a0, a1, -32 * a0, -32 * a1};
  }
}

// The scales from the raw halves converted to h0, h1.
inline BlockScales ScalesFrom(const RawScales& r, float h0, float h1) {
  return {h0 * r.a0, h0 * r.a1, h1 * r.b0, h1 * r.b1};
}

template <DType T>
inline BlockScales ScalesOf(const uint8_t* row, int64_t k) {
  const RawScales r = RawScalesOf<T>(row, k);
  return ScalesFrom(r, F16ToF32(r.h0), F16ToF32(r.h1));
}

// Calls fn(std::integral_constant<DType, T>{}) for the quantized type t.
template <typename Fn>
void ForQuantType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kQ8_0:
      return fn(std::integral_constant<DType, DType::kQ8_0>{});
    case DType::kQ4_0:
      return fn(std::integral_constant<DType, DType::kQ4_0>{});
    case DType::kQ4_1:
      return fn(std::integral_constant<DType, DType::kQ4_1>{});
    case DType::kQ5_0:
      return fn(std::integral_constant<DType, DType::kQ5_0>{});
    case DType::kQ5_1:
      return fn(std::integral_constant<DType, DType::kQ5_1>{});
    case DType::kQ4_K:
      return fn(std::integral_constant<DType, DType::kQ4_K>{});
    case DType::kQ5_K:
      return fn(std::integral_constant<DType, DType::kQ5_K>{});
    case DType::kQ6_K:
      return fn(std::integral_constant<DType, DType::kQ6_K>{});
    default:
      return;
  }
}

}  // namespace tandem::quant_blocks

#endif  // TANDEM_KERNELS_CPU_QUANT_BLOCKS_H_
