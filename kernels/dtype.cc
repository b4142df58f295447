#include "kernels/dtype.h"

#include <cmath>

#include "kernels/quant.h"

namespace tandem {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kFp8E4M3:
      return "fp8";
    case DType::kQ8_0:
      return "q8_0";
    case DType::kQ4_0:
      return "q4_0";
    case DType::kQ4_1:
      return "q4_1";
    case DType::kQ5_0:
      return "q5_0";
    case DType::kQ5_1:
      return "q5_1";
    case DType::kQ4_K:
      return "q4_k";
    case DType::kQ5_K:
      return "q5_k";
    case DType::kQ6_K:
      return "q6_k";
  }
  return "?";
}

namespace {

struct Fp8Table {
  float v[256];
  constexpr Fp8Table() : v() {
    for (int b = 0; b < 256; ++b) {
      const int exp = (b >> 3) & 15, mant = b & 7;
      float x;
      if (exp == 15 && mant == 7) {
        x = __builtin_nanf("");
      } else if (exp == 0) {
        x = static_cast<float>(mant) / 512.0f;  // subnormal: mant * 2^-9
      } else {
        x = (1.0f + static_cast<float>(mant) / 8.0f);
        for (int e = exp - 7; e > 0; --e) x *= 2.0f;
        for (int e = exp - 7; e < 0; ++e) x /= 2.0f;
      }
      v[b] = (b & 0x80) ? -x : x;
    }
  }
};
constexpr Fp8Table kFp8Table;

}  // namespace

const float kFp8E4M3ToF32[256] = {
#define TANDEM_FP8_ROW(i)                                                                         \
  kFp8Table.v[i], kFp8Table.v[i + 1], kFp8Table.v[i + 2], kFp8Table.v[i + 3], kFp8Table.v[i + 4], \
      kFp8Table.v[i + 5], kFp8Table.v[i + 6], kFp8Table.v[i + 7]
    TANDEM_FP8_ROW(0),   TANDEM_FP8_ROW(8),   TANDEM_FP8_ROW(16),  TANDEM_FP8_ROW(24),
    TANDEM_FP8_ROW(32),  TANDEM_FP8_ROW(40),  TANDEM_FP8_ROW(48),  TANDEM_FP8_ROW(56),
    TANDEM_FP8_ROW(64),  TANDEM_FP8_ROW(72),  TANDEM_FP8_ROW(80),  TANDEM_FP8_ROW(88),
    TANDEM_FP8_ROW(96),  TANDEM_FP8_ROW(104), TANDEM_FP8_ROW(112), TANDEM_FP8_ROW(120),
    TANDEM_FP8_ROW(128), TANDEM_FP8_ROW(136), TANDEM_FP8_ROW(144), TANDEM_FP8_ROW(152),
    TANDEM_FP8_ROW(160), TANDEM_FP8_ROW(168), TANDEM_FP8_ROW(176), TANDEM_FP8_ROW(184),
    TANDEM_FP8_ROW(192), TANDEM_FP8_ROW(200), TANDEM_FP8_ROW(208), TANDEM_FP8_ROW(216),
    TANDEM_FP8_ROW(224), TANDEM_FP8_ROW(232), TANDEM_FP8_ROW(240), TANDEM_FP8_ROW(248),
#undef TANDEM_FP8_ROW
};

uint8_t F32ToFp8E4M3(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;  // NaN
  float a;
  std::memcpy(&a, &abs, 4);
  if (a >= kFp8E4M3Max) return sign | 0x7e;  // saturate (Inf too)
  if (a < 0.015625f) {                       // below the smallest normal, 2^-6
    // Subnormals are multiples of 2^-9: round a * 512 to nearest even.
    const float q = std::nearbyint(a * 512.0f);  // the default rounding mode: to nearest even
    return sign | static_cast<uint8_t>(q);       // q == 8 is the smallest normal, 0x08
  }
  const int exp = static_cast<int>(abs >> 23) - 127;  // -6 .. 8
  uint32_t mant = abs & 0x7fffffu;
  // Keep 3 of 23 mantissa bits, rounding to nearest even.
  const uint32_t rest = mant & 0xfffffu;
  mant >>= 20;
  if (rest > 0x80000u || (rest == 0x80000u && (mant & 1u))) ++mant;
  int e = exp + 7;
  if (mant == 8) {
    mant = 0;
    ++e;
  }
  if (e > 15 || (e == 15 && mant == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(e << 3 | mant);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (incl. Inf) after rounding
  if (abs < 0x38800000u) {                        // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;           // rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp - 150); in units of the f16 subnormal step 2^-24 that is
    // mant >> (126 - exp), rounded to nearest even.
    const uint32_t drop = 126 - exp;
    uint32_t q = mant >> drop;
    const uint32_t rem = mant & ((1u << drop) - 1);
    const uint32_t halfway = 1u << (drop - 1);
    if (rem > halfway || (rem == halfway && (q & 1))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);  // round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

void ConvertToF32(DType src_type, const void* src, float* dst, size_t n) {
  switch (src_type) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kFp8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToF32(s[i]);
      return;
    }
    default:
      return DequantizeRow(src_type, src, dst, static_cast<int64_t>(n));
  }
}

}  // namespace tandem
