// Paths and helpers shared by the tests.
#ifndef TANDEM_TESTS_TEST_UTIL_H_
#define TANDEM_TESTS_TEST_UTIL_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "formats/mapped_file.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {

// ../shared beside the checkout: the model and the oracles (never modified).
inline std::string SharedDir() { return TANDEM_SHARED_DIR; }
inline std::string Stories260K() { return SharedDir() + "/models/stories260K/stories260K.bin"; }
inline std::string Tok512() { return SharedDir() + "/models/stories260K/tok512.bin"; }
inline std::string SourceDir() { return TANDEM_SOURCE_DIR; }
inline std::string BinDir() { return TANDEM_BIN_DIR; }
// The tiny random-weight Qwen3 of scripts/make_qwen3_fixtures.py: an HF directory (with its
// tokenizer and chat template) and the same model as GGUF files, `name` qwen3_f32 or qwen3_q8_0.
inline std::string Qwen3Dir() { return SourceDir() + "/tests/fixtures/hf/qwen3_f32"; }
inline std::string Qwen3Gguf(const std::string& name) {
  return SourceDir() + "/tests/fixtures/gguf/qwen3/" + name + ".gguf";
}

// The tiny random-weight mixtures of experts of scripts/make_moe_fixtures.py: HF directories
// (`name` qwen3_moe_f32, qwen3_moe_mixed_f32 or mixtral_f32, with the Qwen3 tokenizer) and GGUF
// files (`family` qwen3_moe or mixtral, `name` <family>_f32 or <family>_q8_0).
inline std::string MoeDir(const std::string& name) {
  return SourceDir() + "/tests/fixtures/hf/" + name;
}
inline std::string MoeGguf(const std::string& family, const std::string& name) {
  return SourceDir() + "/tests/fixtures/gguf/" + family + "/" + name + ".gguf";
}

// The tiny random-weight Gemma 3 of scripts/make_gemma3_fixtures.py (an HF directory, with a
// borrowed 320-token tokenizer).
inline std::string Gemma3Dir() { return SourceDir() + "/tests/fixtures/hf/gemma3_f32"; }

// A real model's GGUF: $<env_name>, else where scripts/test.sh found it at configure time
// (`configured`), else fetch_model.sh's default cache. "OFF" at configure time (the sanitizer
// build of scripts/fuzz.sh, where a 100M-parameter model would run for minutes) gives "": its
// tests skip.
inline std::string RealModelPath(const char* env_name, const std::string& configured,
                                 const std::string& file_name) {
  if (const char* env = std::getenv(env_name); env != nullptr && *env) return env;
  if (configured == "OFF") return "";
  if (!configured.empty()) return configured;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/tandem/" + file_name;
}
// SmolLM2-135M-Instruct Q4_1 (scripts/fetch_model.sh --smollm2).
inline std::string SmolLM2Path() {
  return RealModelPath("TANDEM_SMOLLM2_GGUF", TANDEM_SMOLLM2_GGUF,
                       "SmolLM2-135M-Instruct.Q4_1.gguf");
}
// Gemma 3 270M Q4_K_M (scripts/fetch_model.sh --gemma3).
inline std::string Gemma270MPath() {
  return RealModelPath("TANDEM_GEMMA3_GGUF", TANDEM_GEMMA3_GGUF, "gemma-3-270m-q4_k_m.gguf");
}

inline nlohmann::json LoadJson(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return nlohmann::json();
  return nlohmann::json::parse(*text, nullptr, false);
}

// A fresh directory under $TMPDIR, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem_test_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TEST_UTIL_H_
