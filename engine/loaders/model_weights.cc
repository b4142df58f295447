#include "engine/loaders/model_weights.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "kernels/quant.h"

namespace tandem {
namespace {

// The dtype a matrix of `cols` columns takes when converted to `dtype`: f16 when its rows are
// not whole 32-element blocks (as llama-quantize does).
DType FitDType(DType dtype, int64_t cols) {
  if (cols % BlockElems(dtype) == 0) return dtype;
  if (cols % 32 != 0) return DType::kF16;
  switch (dtype) {
    case DType::kQ4_K:
      return DType::kQ5_0;
    case DType::kQ5_K:
      return DType::kQ5_1;
    default:
      return DType::kQ8_0;
  }
}

}  // namespace

std::vector<WeightRef*> LayerWeights::MutableMatrices() {
  std::vector<WeightRef*> out;
  for (WeightRef* m : {&wq, &wk, &wv, &wo, &w1, &w2, &w3, &router}) {
    if (m->data != nullptr) out.push_back(m);
  }
  for (ExpertWeights& e : experts) {
    for (WeightRef* m : {&e.w1, &e.w2, &e.w3}) {
      if (m->data != nullptr) out.push_back(m);
    }
  }
  return out;
}

std::vector<const WeightRef*> LayerWeights::Matrices() const {
  std::vector<WeightRef*> mutable_refs = const_cast<LayerWeights*>(this)->MutableMatrices();
  return {mutable_refs.begin(), mutable_refs.end()};
}

HfMoeNames::HfMoeNames(const ModelConfig& c, int layer)
    : prefix(
          absl::StrFormat("model.layers.%d.%s", layer,
                          c.architecture == "MixtralForCausalLM" ? "block_sparse_moe." : "mlp.")),
      mixtral(c.architecture == "MixtralForCausalLM") {}

std::string HfMoeNames::Expert(int e, const char* name) const {
  return absl::StrFormat("%sexperts.%d.%s.weight", prefix, e, name);
}

const float* ModelWeights::Own(DType dtype, const void* data, int64_t n) {
  std::vector<float>& buf = owned.emplace_back(static_cast<size_t>(n));
  ConvertToF32(dtype, data, buf.data(), static_cast<size_t>(n));
  return buf.data();
}

void ModelWeights::ConvertMatrices(DType dtype) {
  // Tied matrices share one converted buffer: keyed by the source pointer.
  absl::flat_hash_map<const void*, WeightRef> converted;  // source -> converted
  auto convert = [&](WeightRef& m) {
    const DType to = FitDType(dtype, m.cols);
    if (m.data == nullptr || m.dtype == to) return;
    if (auto it = converted.find(m.data); it != converted.end()) {
      m = it->second;
      return;
    }
    const size_t n = static_cast<size_t>(m.rows) * m.cols;
    const void* dst;
    if (to == DType::kF32) {
      dst = Own(m.dtype, m.data, static_cast<int64_t>(n));
    } else {
      std::vector<float> row(m.cols);
      std::vector<uint16_t>* half = nullptr;
      std::vector<uint8_t>* blocks = nullptr;
      if (IsQuantized(to)) {
        blocks = &owned_blocks.emplace_back(static_cast<size_t>(m.rows * RowBytes(to, m.cols)));
        dst = blocks->data();
      } else {
        half = &owned16.emplace_back(n);
        dst = half->data();
      }
      for (int64_t r = 0; r < m.rows; ++r) {
        ConvertToF32(m.dtype, static_cast<const char*>(m.data) + r * RowBytes(m.dtype, m.cols),
                     row.data(), m.cols);
        if (blocks != nullptr) {
          QuantizeRow(to, row.data(), blocks->data() + r * RowBytes(to, m.cols), m.cols);
          continue;
        }
        uint16_t* out = half->data() + r * m.cols;
        for (int64_t c = 0; c < m.cols; ++c) {
          out[c] = to == DType::kF16 ? F32ToF16(row[c]) : F32ToBf16(row[c]);
        }
      }
    }
    const WeightRef before = m;
    m = WeightRef{to, dst, m.rows, m.cols};
    converted.emplace(before.data, m);
  };
  convert(token_embedding);
  convert(classifier);
  for (LayerWeights& l : layers) {
    // A mixture's router stays as stored, as llama.cpp's quantizer leaves it: the experts a token
    // takes are decided by its small differences.
    for (WeightRef* m : l.MutableMatrices()) {
      if (m != &l.router) convert(*m);
    }
  }
}

}  // namespace tandem
