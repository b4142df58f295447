#include "text/load_tokenizer.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"
#include "nlohmann/json.hpp"
#include "text/gguf_tokenizer.h"
#include "text/llama2c_tokenizer.h"
#include "text/tokenizer/hf_tokenizer.h"

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
  if (IsFile(path) && IsGgufFile(path)) {
    auto gguf = GgufFile::Read(path);
    if (!gguf.ok()) return gguf.status();
    auto files = GgufTokenizer(*gguf);
    if (!files.ok()) return files.status();
    auto t = HfTokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json);
    if (!t.ok()) {
      return absl::Status(
          t.status().code(),
          absl::StrFormat("%s: the tokenizer in its metadata: %s", path, t.status().message()));
    }
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
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
  if (IsFile(model_path) && IsGgufFile(model_path)) return model_path;  // it carries its own
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

absl::StatusOr<TokenizerChatTemplate> LoadChatTemplate(const std::string& model_path,
                                                       const std::string& tokenizer_path,
                                                       const std::string& chat_template_path) {
  namespace fs = std::filesystem;
  // The tokenizer_config.json that names the special tokens (and usually holds the template):
  // a GGUF file's own, or the file beside the tokenizer or in the model directory, with
  // chat_template.jinja beside it when the config has no template (transformers 5 writes it
  // there).
  std::string config_text;
  for (const std::string& p : {tokenizer_path, model_path}) {
    if (p.empty()) continue;
    std::error_code ec;
    if (fs::is_regular_file(p, ec) && IsGgufFile(p)) {
      auto gguf = GgufFile::Read(p);
      if (!gguf.ok()) return gguf.status();
      auto files = GgufTokenizer(*gguf);
      if (!files.ok()) return files.status();
      config_text = files->tokenizer_config_json;
      break;
    }
    const fs::path dir = fs::is_directory(p, ec) ? fs::path(p) : fs::path(p).parent_path();
    if (!fs::exists(dir / "tokenizer_config.json", ec)) continue;
    auto text = ReadFileToString((dir / "tokenizer_config.json").string());
    if (!text.ok()) return text.status();
    config_text = *text;
    auto config = nlohmann::ordered_json::parse(config_text, nullptr, false);
    if (config.is_object() && !config.contains("chat_template") &&
        fs::exists(dir / "chat_template.jinja", ec)) {
      auto jinja = ReadFileToString((dir / "chat_template.jinja").string());
      if (!jinja.ok()) return jinja.status();
      config["chat_template"] = *jinja;
      config_text = config.dump();
    }
    break;
  }
  if (chat_template_path.empty()) {
    if (config_text.empty()) return absl::NotFoundError("no tokenizer_config.json for the model");
    return TokenizerChatTemplate::FromConfig(config_text);
  }
  auto text = ReadFileToString(chat_template_path);
  if (!text.ok()) return text.status();
  if (chat_template_path.ends_with(".json")) return TokenizerChatTemplate::FromConfig(*text);
  // A bare Jinja template: with the special tokens of the model's config, when it has one.
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(config_text, nullptr, false);
  if (!config.is_object()) config = nlohmann::ordered_json::object();
  config["chat_template"] = *text;
  return TokenizerChatTemplate::FromConfig(config.dump());
}

}  // namespace tandem
