// The benchmark text of the tokenizer benchmarks: the tokenizer reference vectors' texts
// (English, code, Chinese, Japanese, Korean, Arabic, emoji, whitespace runs, ...) repeated.
#ifndef TANDEM_BENCH_TOKENIZER_TEXTS_H_
#define TANDEM_BENCH_TOKENIZER_TEXTS_H_

#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"

namespace tandem::bench {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The texts of `dir`/{qwen3,mistral}.vectors.json, one per line, repeated to at least
// `target_bytes`.
inline std::string VectorsText(const std::string& dir, size_t target_bytes) {
  std::string unit;
  for (const char* name : {"qwen3", "mistral"}) {
    const auto vectors = nlohmann::json::parse(ReadFile(dir + "/" + name + ".vectors.json"));
    for (const auto& v : vectors) unit += v["text"].get<std::string>() + "\n";
  }
  std::string text;
  while (text.size() < target_bytes) text += unit;
  return text;
}

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_TOKENIZER_TEXTS_H_
