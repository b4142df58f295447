// Oniguruma, the regex engine Hugging Face tokenizers runs split patterns with, driven as the
// Rust `onig` crate's find_iter drives it: the reference for lib/regex/regex.h in
// regex_onig_test and bench/regex_bench.
#ifndef TANDEM_TESTS_TEXT_TOKENIZER_ONIG_REFERENCE_H_
#define TANDEM_TESTS_TEXT_TOKENIZER_ONIG_REFERENCE_H_

// glibc's <regex.h> (which GoogleTest includes) declares regex_t and struct re_registers too.
#define ONIG_ESCAPE_REGEX_T_COLLISION
#define re_registers onig_re_registers
#include <oniguruma.h>
#undef re_registers

#include <string>
#include <vector>

#include "lib/regex/regex.h"
#include "lib/unicode/unicode.h"

namespace tandem::testing {

// UTF-8, the default syntax, successive searches; an empty match at the previous match's end is
// skipped by one character.
class OnigReference {
 public:
  explicit OnigReference(const std::string& pattern) {
    OnigEncoding enc = ONIG_ENCODING_UTF8;
    onig_initialize(&enc, 1);
    OnigErrorInfo err;
    const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
    if (onig_new(&re_, p, p + pattern.size(), ONIG_OPTION_CAPTURE_GROUP, ONIG_ENCODING_UTF8,
                 ONIG_SYNTAX_DEFAULT, &err) != ONIG_NORMAL) {
      re_ = nullptr;
    }
    region_ = onig_region_new();
  }
  ~OnigReference() {
    onig_region_free(region_, 1);
    if (re_) onig_free(re_);
  }
  bool ok() const { return re_ != nullptr; }

  void FindAll(const std::string& text, std::vector<Regex::Match>* out) const {
    const auto* s = reinterpret_cast<const OnigUChar*>(text.data());
    const OnigUChar* end = s + text.size();
    size_t start = 0;
    long last_end = -1;
    while (start <= text.size()) {
      const int r = onig_search(re_, s, end, s + start, end, region_, ONIG_OPTION_NONE);
      if (r < 0) break;
      const size_t b = region_->beg[0], e = region_->end[0];
      if (b == e && static_cast<long>(e) == last_end) {
        if (start >= text.size()) break;
        start += unicode::Utf8SequenceLength(text[start]);
        continue;
      }
      out->push_back({b, e});
      last_end = static_cast<long>(e);
      start = b == e ? e + (e < text.size() ? unicode::Utf8SequenceLength(text[e]) : 1) : e;
    }
  }

 private:
  OnigRegex re_ = nullptr;
  OnigRegion* region_ = nullptr;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TEXT_TOKENIZER_ONIG_REFERENCE_H_
