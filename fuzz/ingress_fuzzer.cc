// Fuzzes the router's request validation (router/ingress.h ValidateGenerateRequest) with a
// GenerateRequest parsed from the input, against the real stories260K model config and its
// tokenizer. A request that passes must be one the engine can run: a non-empty prompt of ids
// inside the vocabulary that fits the context, max_tokens in [1, context], sane sampling.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/model.h"
#include "router/ingress.h"
#include "tandem/v1/generation.pb.h"
#include "text/load_tokenizer.h"

namespace {

struct Model {
  tandem::ModelConfig config;
  std::unique_ptr<tandem::Tokenizer> tokenizer;
};

const Model& Get() {
  static const Model* const m = [] {
    const std::string dir = std::string(TANDEM_SHARED_DIR) + "/models/stories260K/";
    auto config = tandem::LoadModelConfig(dir + "stories260K.bin");
    if (!config.ok()) {
      std::fprintf(stderr, "ingress_fuzzer: %s\n", config.status().ToString().c_str());
      std::abort();
    }
    auto tok = tandem::LoadTokenizer(dir + "tok512.bin", config->vocab_size);
    if (!tok.ok()) {
      std::fprintf(stderr, "ingress_fuzzer: %s\n", tok.status().ToString().c_str());
      std::abort();
    }
    return new Model{*config, *std::move(tok)};
  }();
  return *m;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::v1::GenerateRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  const Model& m = Get();
  tandem::IngressLimits limits;
  limits.max_text_bytes = 64 << 10;
  auto out = tandem::ValidateGenerateRequest(req, m.config, *m.tokenizer, limits);
  if (!out.ok()) {
    if (out.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  if (out->prompt.empty() || static_cast<int64_t>(out->prompt.size()) >= m.config.max_seq_len) {
    __builtin_trap();
  }
  for (int id : out->prompt) {
    if (id < 0 || id >= m.config.vocab_size) __builtin_trap();
  }
  if (out->max_tokens < 1 || out->max_tokens > m.config.max_seq_len) __builtin_trap();
  const auto& s = out->sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0 || s.top_k < 0 || !(s.top_p > 0) ||
      s.top_p > 1) {
    __builtin_trap();
  }
  for (const std::string& stop : out->stop_strings) {
    if (stop.empty()) __builtin_trap();
  }
  return 0;
}
