// Writes GGUF files for tests and fuzz seeds: metadata of every kind Tandem reads, tensors of
// any ggml type, and small random Llama models whose matrices are stored in a chosen dtype.
#ifndef TANDEM_TESTS_ENGINE_GGUF_WRITER_H_
#define TANDEM_TESTS_ENGINE_GGUF_WRITER_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

namespace tandem::testing {

// The ggml type id of a Tandem dtype (255, a type no reader knows, for the others).
inline uint32_t GgmlType(DType t) { return GgmlTypeOf(t).value_or(255); }

class GgufWriter {
 public:
  void String(const std::string& key, const std::string& v) {
    Key(key, 8);
    Str(v);
  }
  void U32(const std::string& key, uint32_t v) {
    Key(key, 4);
    Put(v);
  }
  void F32(const std::string& key, float v) {
    Key(key, 6);
    Put(v);
  }
  void Bool(const std::string& key, bool v) {
    Key(key, 7);
    Put<uint8_t>(v);
  }
  void Strings(const std::string& key, const std::vector<std::string>& v) {
    Key(key, 9);
    Put<uint32_t>(8);
    Put<uint64_t>(v.size());
    for (const std::string& s : v) Str(s);
  }
  void Floats(const std::string& key, const std::vector<float>& v) {
    Key(key, 9);
    Put<uint32_t>(6);
    Put<uint64_t>(v.size());
    for (float f : v) Put(f);
  }
  void Ints(const std::string& key, const std::vector<int32_t>& v) {
    Key(key, 9);
    Put<uint32_t>(5);
    Put<uint64_t>(v.size());
    for (int32_t i : v) Put(i);
  }
  // `dims`: ne[0] (the row length) first, as GGUF stores them.
  void Tensor(const std::string& name, uint32_t ggml_type, std::vector<int64_t> dims,
              std::string bytes) {
    tensors_.push_back({name, ggml_type, std::move(dims), std::move(bytes)});
  }

  std::string Build(uint32_t version = 3, uint64_t alignment = 32) const {
    std::string out;
    auto put = [&out](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    out += "GGUF";
    put(version);
    put(static_cast<uint64_t>(tensors_.size()));
    put(static_cast<uint64_t>(kv_count_));
    out += kv_;
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      put(static_cast<uint64_t>(t.name.size()));
      out += t.name;
      put(static_cast<uint32_t>(t.dims.size()));
      for (int64_t d : t.dims) put(static_cast<uint64_t>(d));
      put(t.type);
      put(offset);
      offsets.push_back(offset);
      offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    const size_t data = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data + offsets[i], '\0');
      out += tensors_[i].bytes;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    return out;
  }

 private:
  struct T {
    std::string name;
    uint32_t type;
    std::vector<int64_t> dims;
    std::string bytes;
  };
  template <typename V>
  void Put(V v) {
    kv_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void Str(const std::string& s) {
    Put<uint64_t>(s.size());
    kv_ += s;
  }
  void Key(const std::string& key, uint32_t type) {
    ++kv_count_;
    Str(key);
    Put(type);
  }

  std::string kv_;
  size_t kv_count_ = 0;
  std::vector<T> tensors_;
};

// `n` floats (normal, std `scale`) stored as `t` (a whole number of its blocks).
inline std::string RandomTensorBytes(DType t, int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  if (t == DType::kF32) return std::string(reinterpret_cast<const char*>(v.data()), 4 * n);
  if (t == DType::kF16 || t == DType::kBF16) {
    std::string out(2 * n, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = t == DType::kF16 ? F32ToF16(v[i]) : F32ToBf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
    return out;
  }
  std::string out(n / BlockElems(t) * BlockBytes(t), '\0');
  QuantizeRow(t, v.data(), out.data(), n);
  return out;
}

struct TinyLlamaShape {
  int dim = 256, hidden = 512, layers = 2, heads = 4, kv_heads = 2, vocab = 64;
};

// A random Llama model (general.architecture "llama") whose matrices are stored as `matrices`
// (the embedding and the output too), norms in F32. Deterministic in `seed`.
inline GgufWriter TinyLlama(DType matrices, uint32_t seed = 1, TinyLlamaShape s = {}) {
  std::mt19937 rng(seed);
  GgufWriter w;
  w.String("general.architecture", "llama");
  w.String("general.name", "tiny");
  w.U32("llama.context_length", 128);
  w.U32("llama.embedding_length", s.dim);
  w.U32("llama.block_count", s.layers);
  w.U32("llama.feed_forward_length", s.hidden);
  w.U32("llama.attention.head_count", s.heads);
  w.U32("llama.attention.head_count_kv", s.kv_heads);
  w.F32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.F32("llama.rope.freq_base", 10000.0f);
  w.U32("general.alignment", 32);
  const int kv = s.dim / s.heads * s.kv_heads;
  const uint32_t type = GgmlType(matrices);
  auto matrix = [&](const std::string& name, int rows, int cols) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    w.Tensor(name, type, {cols, rows},
             RandomTensorBytes(matrices, int64_t{rows} * cols, rng, scale));
  };
  auto norm = [&](const std::string& name) {
    std::vector<float> ones(s.dim, 1.0f);
    w.Tensor(name, 0, {s.dim}, std::string(reinterpret_cast<const char*>(ones.data()), 4 * s.dim));
  };
  matrix("token_embd.weight", s.vocab, s.dim);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", s.dim, s.dim);
    matrix(p + "attn_k.weight", kv, s.dim);
    matrix(p + "attn_v.weight", kv, s.dim);
    matrix(p + "attn_output.weight", s.dim, s.dim);
    norm(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", s.hidden, s.dim);
    matrix(p + "ffn_up.weight", s.hidden, s.dim);
    matrix(p + "ffn_down.weight", s.dim, s.hidden);
  }
  norm("output_norm.weight");
  matrix("output.weight", s.vocab, s.dim);
  return w;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_ENGINE_GGUF_WRITER_H_
