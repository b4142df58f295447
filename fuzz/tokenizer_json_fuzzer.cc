// Fuzzes tokenizer.json loading (text/tokenizer/hf_tokenizer.h FromJson) and then uses what
// loaded: encodes a few texts (added tokens, byte fallback, Unicode, whitespace runs) and
// decodes ids around the vocabulary, each way the server does (Encode, Decode with options,
// IncrementalDecoder).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"
#include "text/tokenizer/hf_tokenizer.h"

namespace {

constexpr std::string_view kTexts[] = {
    "Hello world! It's 2024 and  spaces\t\ttabs\n\nnewlines.",
    "<s>[INST] ünïcödé 日本語 العربية 🙂 [/INST]</s><|im_start|>",
    "   leading and trailing   ",
    "\xff\xfe invalid \xc3 UTF-8 \xe2\x82",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tok = tandem::HfTokenizer::FromJson(json);
  if (!tok.ok()) return 0;
  const tandem::HfTokenizer& t = **tok;
  for (std::string_view text : kTexts) {
    for (bool special : {false, true}) {
      std::vector<int> ids = t.Encode(text, special);
      for (int id : ids) {
        if (id < 0) __builtin_trap();
      }
      (void)t.Decode(ids);
      (void)t.Decode(ids, {.skip_special_tokens = true, .clean_up_tokenization_spaces = true});
      tandem::IncrementalDecoder stream(&t, {});
      for (int id : ids) (void)stream.Add(id);
      (void)stream.Flush();
    }
  }
  std::vector<int> ids;
  for (int id = -2; id < 64; ++id) ids.push_back(id);
  for (int id = t.vocab_size() - 4; id < t.vocab_size() + 4; ++id) ids.push_back(id);
  (void)t.Decode(ids);
  for (int id : ids) {
    const std::string* s = t.IdToToken(id);
    if (s != nullptr && t.TokenToId(*s) < 0) __builtin_trap();
  }
  return 0;
}
