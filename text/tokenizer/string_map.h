// A hash map keyed by std::string that can be probed with std::string_view without building a
// string. (Debian's Abseil is built with its own absl::string_view, so flat_hash_map's built-in
// heterogeneous lookup does not accept std::string_view.)
#ifndef TANDEM_TEXT_TOKENIZER_STRING_MAP_H_
#define TANDEM_TEXT_TOKENIZER_STRING_MAP_H_

#include <functional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"

namespace tandem {

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

struct StringViewEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

template <typename V>
using StringMap = absl::flat_hash_map<std::string, V, StringViewHash, StringViewEq>;

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_STRING_MAP_H_
