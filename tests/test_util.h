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

// The tiny random-weight Gemma 3 of scripts/make_gemma3_fixtures.py (an HF directory, with a
// borrowed 320-token tokenizer).
inline std::string Gemma3Dir() { return SourceDir() + "/tests/fixtures/hf/gemma3_f32"; }

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
