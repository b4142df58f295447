// Fuzzes structured output (structured/): a JSON Schema compiler (or, for an input that begins
// with 'R', the regular-expression compiler of guided_regex) fed any text, then the matcher it
// builds driven by the rest of the input. The input is SCHEMA (or R PATTERN), a NUL byte, then
// choices: each choice byte picks one of the bytes the matcher allows next. Whatever the schema
// and the choices, the matcher never reaches a dead end (no byte allowed, yet not complete), and
// a JSON matcher never accepts a text that is not JSON: when it says Complete(), the text so far
// must parse.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "structured/json_matcher.h"
#include "structured/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const bool regex = !input.empty() && input[0] == 'R';
  auto schema = regex ? tandem::structured::JsonSchema::Regex(input.substr(1, split - 1))
                      : tandem::structured::JsonSchema::Compile(input.substr(0, split));
  if (!schema.ok() || split == std::string_view::npos) return 0;
  tandem::structured::JsonMatcher m((*schema)->root());
  std::string text;
  for (size_t i = split + 1; i < input.size() && !m.Done(); ++i) {
    std::vector<unsigned char> allowed;
    for (int b = 0; b < 256; ++b) {
      tandem::structured::JsonMatcher trial = m;
      if (trial.Feed(static_cast<unsigned char>(b)))
        allowed.push_back(static_cast<unsigned char>(b));
    }
    if (allowed.empty()) {
      if (!m.Complete()) __builtin_trap();  // a dead end: no byte can come, yet not done
      break;
    }
    const unsigned char pick = allowed[static_cast<unsigned char>(input[i]) % allowed.size()];
    if (!m.Feed(pick)) __builtin_trap();
    text += static_cast<char>(pick);
    if (!regex && m.Complete() && !nlohmann::json::accept(text)) __builtin_trap();
  }
  return 0;
}
