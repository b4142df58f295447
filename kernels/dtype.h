// Element types of weights and KV data, and scalar conversions between them.
#ifndef TANDEM_KERNELS_DTYPE_H_
#define TANDEM_KERNELS_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem {

// kFp8E4M3: OCP FP8 E4M3 (1 sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinity;
// largest finite 448), used with a scale (value = stored * scale) for KV caches only.
// kQ*: block-quantized weights as GGUF files store them (kernels/quant.h), never KV.
enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kFp8E4M3 = 3,
  kQ8_0 = 8,
  kQ4_0 = 9,
  kQ4_1 = 10,
  kQ5_0 = 11,
  kQ5_1 = 12,
  kQ4_K = 13,
  kQ5_K = 14,
  kQ6_K = 15,
};

// Bytes per element of the plain dtypes; 0 for block-quantized ones (kernels/quant.h RowBytes).
inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kFp8E4M3:
      return 1;
    default:
      return 0;
  }
}
std::string_view DTypeName(DType t);

inline constexpr float kFp8E4M3Max = 448.0f;
// fp8 KV caches' scales get this headroom over the largest value of a sequence's first chunk,
// for the tokens that come later (engine/kv/kv_cache.h; the device twin in kernels/cuda).
inline constexpr float kFp8ScaleHeadroom = 2.0f;

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// FP8 E4M3: exact decoding (a 256-entry table), and encoding rounded to nearest even,
// saturating at ±448 (NaN stays NaN).
extern const float kFp8E4M3ToF32[256];
inline float Fp8E4M3ToF32(uint8_t b) { return kFp8E4M3ToF32[b]; }
uint8_t F32ToFp8E4M3(float f);

// Converts `n` elements of type `src_type` at `src` to float32 (fp8: unscaled; quantized
// types: n a multiple of their block).
void ConvertToF32(DType src_type, const void* src, float* dst, size_t n);

}  // namespace tandem

#endif  // TANDEM_KERNELS_DTYPE_H_
