#include "engine/load_tokenizer.h"

#include <sys/stat.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "engine/llama2c_tokenizer.h"
#include "engine/tokenizer/hf_tokenizer.h"

namespace tandem {
namespace {

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path,
                                                         int expected_vocab_size) {
  const bool hf =
      absl::EndsWith(path, ".json") || (IsDir(path) && IsFile(path + "/tokenizer.json"));
  if (hf) {
    auto t = HfTokenizer::Load(path);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  std::string file = path;
  if (IsDir(path)) {
    if (!IsFile(path + "/tokenizer.bin")) {
      return absl::NotFoundError(
          absl::StrFormat("%s holds neither tokenizer.json nor tokenizer.bin", path));
    }
    file = path + "/tokenizer.bin";
  }
  auto t = Llama2cTokenizer::Load(file, expected_vocab_size);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Tokenizer>(std::move(*t));
}

absl::StatusOr<std::string> FindTokenizerFor(const std::string& model_path, int vocab_size) {
  std::vector<std::string> candidates;
  if (IsDir(model_path)) {
    candidates = {model_path + "/tokenizer.json", model_path + "/tokenizer.bin"};
  } else {
    const size_t slash = model_path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : model_path.substr(0, slash);
    candidates = {dir + "/tokenizer.bin", dir + absl::StrFormat("/tok%d.bin", vocab_size)};
  }
  for (const auto& c : candidates) {
    if (IsFile(c)) return c;
  }
  return absl::NotFoundError(
      absl::StrFormat("no tokenizer found for %s (looked for %s, ...); pass --tokenizer",
                      model_path, candidates[0]));
}

}  // namespace tandem
