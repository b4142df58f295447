// Fuzzes encoding and decoding of arbitrary request text with the real tokenizers of
// ../shared/testdata/tokenizers (byte-level BPE: Qwen3; sentencepiece-style BPE with byte
// fallback: Mistral): normalizers, the pre-tokenizer regexes, added-token matching and BPE.
// The input's first byte picks the tokenizer; decoded text must be valid UTF-8 after
// IncrementalDecoder.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"
#include "text/tokenizer/hf_tokenizer.h"

namespace {

std::vector<std::unique_ptr<tandem::HfTokenizer>>& Tokenizers() {
  static auto* const all = [] {
    auto* v = new std::vector<std::unique_ptr<tandem::HfTokenizer>>();
    for (const char* name : {"qwen3", "mistral"}) {
      const std::string path =
          std::string(TANDEM_SHARED_DIR) + "/testdata/tokenizers/" + name + ".tokenizer.json";
      auto t = tandem::HfTokenizer::Load(path);
      if (!t.ok()) {
        std::fprintf(stderr, "tokenizer_encode_fuzzer: %s\n", t.status().ToString().c_str());
        std::abort();
      }
      v->push_back(*std::move(t));
    }
    return v;
  }();
  return *all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& all = Tokenizers();
  const tandem::HfTokenizer& t = *all[data[0] % all.size()];
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<int> ids = t.Encode(text, /*add_special_tokens=*/true);
  auto checked = t.EncodeChecked(text, /*add_special_tokens=*/false);
  const bool valid = tandem::ToValidUtf8(text) == text;
  if (checked.ok() != valid) __builtin_trap();
  for (int id : ids) {
    if (id < 0 || id >= t.vocab_size()) __builtin_trap();
  }
  (void)t.Decode(ids);
  tandem::IncrementalDecoder stream(&t, {});
  std::string streamed;
  for (int id : ids) streamed += stream.Add(id);
  streamed += stream.Flush();
  if (tandem::ToValidUtf8(streamed) != streamed) __builtin_trap();
  return 0;
}
