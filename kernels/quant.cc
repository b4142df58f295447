#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_blocks.h"

namespace tandem {
namespace {

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}
inline void PutHalf(uint8_t* p, float f) {
  const uint16_t h = F32ToF16(f);
  std::memcpy(p, &h, 2);
}
inline uint32_t Le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

using quant_blocks::ScaleMinK;

inline void PackScaleMinK(uint8_t* s, int j, int sc, int m) {
  if (j < 4) {
    s[j] = static_cast<uint8_t>((s[j] & 0xC0) | sc);
    s[j + 4] = static_cast<uint8_t>((s[j + 4] & 0xC0) | m);
  } else {
    s[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
    s[j - 4] = static_cast<uint8_t>((s[j - 4] & 0x3F) | ((sc >> 4) << 6));
    s[j] = static_cast<uint8_t>((s[j] & 0x3F) | ((m >> 4) << 6));
  }
}

void DequantizeBlock(DType t, const uint8_t* b, float* y) {
  switch (t) {
    case DType::kQ8_0: {
      const float d = Half(b);
      for (int i = 0; i < 32; ++i) y[i] = d * static_cast<int8_t>(b[2 + i]);
      return;
    }
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool offset = t == DType::kQ4_1;
      const float d = Half(b), m = offset ? Half(b + 2) : 0.0f;
      const uint8_t* qs = b + (offset ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        const int lo = qs[j] & 0xF, hi = qs[j] >> 4;
        y[j] = offset ? d * lo + m : d * (lo - 8);
        y[j + 16] = offset ? d * hi + m : d * (hi - 8);
      }
      return;
    }
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool offset = t == DType::kQ5_1;
      const float d = Half(b), m = offset ? Half(b + 2) : 0.0f;
      const uint32_t qh = Le32(b + (offset ? 4 : 2));
      const uint8_t* qs = b + (offset ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = offset ? d * lo + m : d * (lo - 16);
        y[j + 16] = offset ? d * hi + m : d * (hi - 16);
      }
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = t == DType::kQ5_K;
      const float d = Half(b), dmin = Half(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        ScaleMinK(scales, j, &sc, &m);
        const float scale = d * sc, min = dmin * m;
        const uint8_t* q = qs + 32 * (j / 2);
        const int shift = (j % 2) * 4;
        for (int l = 0; l < 32; ++l) {
          int v = (q[l] >> shift) & 0xF;
          if (five) v |= ((qh[l] >> j) & 1) << 4;
          y[32 * j + l] = scale * v - min;
        }
      }
      return;
    }
    case DType::kQ6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = Half(b + 208);
      for (int half = 0; half < 2; ++half) {
        const uint8_t* l0 = ql + 64 * half;
        const uint8_t* h0 = qh + 32 * half;
        const int8_t* s0 = sc + 8 * half;
        float* y0 = y + 128 * half;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((l0[l] & 0xF) | (((h0[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((l0[l + 32] & 0xF) | (((h0[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((l0[l] >> 4) | (((h0[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((l0[l + 32] >> 4) | (((h0[l] >> 6) & 3) << 4)) - 32;
          y0[l] = d * s0[is] * q1;
          y0[l + 32] = d * s0[is + 2] * q2;
          y0[l + 64] = d * s0[is + 4] * q3;
          y0[l + 96] = d * s0[is + 6] * q4;
        }
      }
      return;
    }
    default:
      return;
  }
}

inline int Clamp(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

// Q4_K / Q5_K: 8 sub-blocks of 32 with a scale and minimum each, themselves quantized to 6 bits
// against the block's d and dmin.
void QuantizeK(bool five, const float* x, uint8_t* b) {
  const int levels = five ? 31 : 15;
  float scale[8], min[8];
  for (int j = 0; j < 8; ++j) {
    float lo = x[32 * j], hi = lo;
    for (int l = 1; l < 32; ++l) {
      lo = std::min(lo, x[32 * j + l]);
      hi = std::max(hi, x[32 * j + l]);
    }
    lo = std::min(lo, 0.0f);  // the minimum is subtracted: keep it >= 0
    scale[j] = (hi - lo) / levels;
    min[j] = -lo;
  }
  const float max_scale = *std::max_element(scale, scale + 8);
  const float max_min = *std::max_element(min, min + 8);
  const float d = max_scale / 63, dmin = max_min / 63;
  std::memset(b, 0, five ? 176 : 144);
  PutHalf(b, d);
  PutHalf(b + 2, dmin);
  const float dq = Half(b), dminq = Half(b + 2);
  uint8_t* scales = b + 4;
  uint8_t* qh = b + 16;
  uint8_t* qs = b + (five ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    const int sc = dq > 0 ? Clamp(static_cast<int>(std::lround(scale[j] / dq)), 0, 63) : 0;
    const int m = dminq > 0 ? Clamp(static_cast<int>(std::lround(min[j] / dminq)), 0, 63) : 0;
    PackScaleMinK(scales, j, sc, m);
    const float s = dq * sc, mn = dminq * m;
    for (int l = 0; l < 32; ++l) {
      const int v =
          s > 0 ? Clamp(static_cast<int>(std::lround((x[32 * j + l] + mn) / s)), 0, levels) : 0;
      qs[32 * (j / 2) + l] |= static_cast<uint8_t>((v & 0xF) << ((j % 2) * 4));
      if (five) qh[l] |= static_cast<uint8_t>(((v >> 4) & 1) << j);
    }
  }
}

void QuantizeQ6K(const float* x, uint8_t* b) {
  float scale[16];
  for (int s = 0; s < 16; ++s) {
    float amax = 0, v = 0;
    for (int l = 0; l < 16; ++l) {
      if (std::fabs(x[16 * s + l]) > amax) {
        amax = std::fabs(x[16 * s + l]);
        v = x[16 * s + l];
      }
    }
    scale[s] = v / -32;  // the largest magnitude maps to -32 (the end with one more level)
  }
  float max_abs = 0, max_scale = 0;
  for (float s : scale) {
    if (std::fabs(s) > max_abs) {
      max_abs = std::fabs(s);
      max_scale = s;
    }
  }
  std::memset(b, 0, 210);
  const float d = max_scale / -128;
  PutHalf(b + 208, d);
  const float dq = Half(b + 208);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int s = 0; s < 16; ++s) {
    sc[s] = static_cast<int8_t>(
        dq != 0 ? Clamp(static_cast<int>(std::lround(scale[s] / dq)), -128, 127) : 0);
  }
  for (int i = 0; i < 256; ++i) {
    const float step = dq * sc[i / 16];
    const int q = step != 0 ? Clamp(static_cast<int>(std::lround(x[i] / step)), -32, 31) + 32 : 32;
    // Element i: half i / 128; within it, quarter (i % 128) / 32 and lane l = i % 32.
    const int half = i / 128, quarter = (i % 128) / 32, l = i % 32;
    uint8_t& low = ql[64 * half + l + 32 * (quarter % 2)];
    low |= static_cast<uint8_t>((q & 0xF) << (4 * (quarter / 2)));
    qh[32 * half + l] |= static_cast<uint8_t>(((q >> 4) & 3) << (2 * quarter));
  }
}

void QuantizeBlock(DType t, const float* x, uint8_t* b) {
  switch (t) {
    case DType::kQ8_0: {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      // ggml's reference (quantize_row_q8_0_ref): the float32 scale's reciprocal, the scale
      // stored as f16; so a Q8_0 made here is byte for byte the one llama-quantize and gguf-py
      // make.
      const float d = amax / 127;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      PutHalf(b, d);
      for (int i = 0; i < 32; ++i) {
        b[2 + i] = static_cast<uint8_t>(
            static_cast<int8_t>(Clamp(static_cast<int>(std::lround(x[i] * id)), -127, 127)));
      }
      return;
    }
    case DType::kQ4_0:
    case DType::kQ5_0: {
      // The largest magnitude maps to the end with one more level (-8 or -16).
      const int half = t == DType::kQ4_0 ? 8 : 16;
      float amax = 0, v = 0;
      for (int i = 0; i < 32; ++i) {
        if (std::fabs(x[i]) > amax) {
          amax = std::fabs(x[i]);
          v = x[i];
        }
      }
      PutHalf(b, v / -half);
      const float d = Half(b);
      uint32_t qh = 0;
      uint8_t* qs = b + (t == DType::kQ4_0 ? 2 : 6);
      for (int j = 0; j < 16; ++j) {
        const int lo = d != 0 ? Clamp(static_cast<int>(std::lround(x[j] / d)), -half, half - 1) : 0;
        const int hi =
            d != 0 ? Clamp(static_cast<int>(std::lround(x[j + 16] / d)), -half, half - 1) : 0;
        const int ql = lo + half, qhi = hi + half;
        qs[j] = static_cast<uint8_t>((ql & 0xF) | ((qhi & 0xF) << 4));
        qh |= static_cast<uint32_t>((ql >> 4) & 1) << j;
        qh |= static_cast<uint32_t>((qhi >> 4) & 1) << (j + 16);
      }
      if (t == DType::kQ5_0) std::memcpy(b + 2, &qh, 4);
      return;
    }
    case DType::kQ4_1:
    case DType::kQ5_1: {
      const int levels = t == DType::kQ4_1 ? 15 : 31;
      float lo = x[0], hi = x[0];
      for (int i = 1; i < 32; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      PutHalf(b, (hi - lo) / levels);
      PutHalf(b + 2, lo);
      const float d = Half(b), m = Half(b + 2);
      uint32_t qh = 0;
      uint8_t* qs = b + (t == DType::kQ4_1 ? 4 : 8);
      for (int j = 0; j < 16; ++j) {
        const int lo_q =
            d > 0 ? Clamp(static_cast<int>(std::lround((x[j] - m) / d)), 0, levels) : 0;
        const int hi_q =
            d > 0 ? Clamp(static_cast<int>(std::lround((x[j + 16] - m) / d)), 0, levels) : 0;
        qs[j] = static_cast<uint8_t>((lo_q & 0xF) | ((hi_q & 0xF) << 4));
        qh |= static_cast<uint32_t>((lo_q >> 4) & 1) << j;
        qh |= static_cast<uint32_t>((hi_q >> 4) & 1) << (j + 16);
      }
      if (t == DType::kQ5_1) std::memcpy(b + 4, &qh, 4);
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K:
      return QuantizeK(t == DType::kQ5_K, x, b);
    case DType::kQ6_K:
      return QuantizeQ6K(x, b);
    default:
      return;
  }
}

}  // namespace

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  if (!IsQuantized(t)) return ConvertToF32(t, src, dst, static_cast<size_t>(n));
  const int64_t be = BlockElems(t), bb = BlockBytes(t);
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / be; ++i) DequantizeBlock(t, b + i * bb, dst + i * be);
}

void QuantizeRow(DType t, const float* src, void* dst, int64_t n) {
  const int64_t be = BlockElems(t), bb = BlockBytes(t);
  auto* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / be; ++i) QuantizeBlock(t, src + i * be, b + i * bb);
}

void QuantizeActivations(const float* x, ActBlock* out, int64_t n) {
  for (int64_t i = 0; i < n / kActBlock; ++i) {
    const float* xb = x + i * kActBlock;
    float amax = 0;
    for (int l = 0; l < kActBlock; ++l) amax = std::max(amax, std::fabs(xb[l]));
    const float d = amax / 127, unit = d / 128;
    const float inv = d > 0 ? 1.0f / d : 0.0f, inv_unit = d > 0 ? 1.0f / unit : 0.0f;
    int sum = 0, sum16 = 0;
    for (int l = 0; l < kActBlock; ++l) {
      const int q = static_cast<int>(std::lrintf(xb[l] * inv));
      const int r =
          std::clamp(static_cast<int>(std::lrintf((xb[l] - d * q) * inv_unit)), -127, 127);
      out[i].q[l] = static_cast<int8_t>(q);
      out[i].r[l] = static_cast<int8_t>(r);
      sum += 128 * q + r;
      if (l == 15) sum16 = sum;
    }
    out[i].unit = unit;
    out[i].sum = unit * static_cast<float>(sum);
    out[i].sum16 = unit * static_cast<float>(sum16);
  }
}

}  // namespace tandem
