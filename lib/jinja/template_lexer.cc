#include "lib/jinja/template_lexer.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/jinja/status_macros.h"
#include "lib/unicode/unicode.h"

namespace tandem::jinja {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Python's str.rstrip(): trailing whitespace, Unicode included.
void RStripPy(std::string* text) {
  auto cps = SplitCodePoints(*text);
  size_t keep = text->size();
  for (auto it = cps.rbegin(); it != cps.rend() && IsPyWhitespace(*it); ++it) keep -= it->size();
  text->resize(keep);
}

bool AllPyWhitespace(std::string_view text) {
  for (std::string_view cp : SplitCodePoints(text)) {
    if (!IsPyWhitespace(cp)) return false;
  }
  return true;
}

// Length of the whitespace run at s[pos] (the `\s*` after `-%}`).
size_t PyWhitespaceRun(std::string_view s, size_t pos) {
  size_t end = pos;
  while (end < s.size()) {
    if (IsAsciiSpace(s[end])) {
      ++end;
      continue;
    }
    if (static_cast<unsigned char>(s[end]) < 0x80) break;
    auto cps = SplitCodePoints(s.substr(end, 4));
    if (cps.empty() || !IsPyWhitespace(cps[0])) break;
    end += cps[0].size();
  }
  return end - pos;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes the body of a string literal as jinja2 does (Python's "unicode-escape" codec).
absl::StatusOr<std::string> DecodeStringLiteral(std::string_view raw, int line) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 == raw.size()) {
      out.push_back(raw[i]);
      continue;
    }
    const char c = raw[++i];
    switch (c) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 1; k <= n; ++k) {
          const int h = i + k < raw.size() ? HexValue(raw[i + k]) : -1;
          if (h < 0) {
            return absl::InvalidArgumentError(
                absl::StrFormat("line %d: truncated \\%c escape in string literal", line, c));
          }
          cp = cp * 16 + h;
        }
        if (cp > 0x10FFFF) {
          return absl::InvalidArgumentError(
              absl::StrFormat("line %d: invalid \\U escape in string literal", line));
        }
        unicode::AppendUtf8(cp, &out);
        i += n;
        break;
      }
      case 'N':
        return absl::UnimplementedError(
            absl::StrFormat("line %d: \\N{...} escapes are not supported", line));
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = c - '0';
          for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + (raw[++i] - '0');
          }
          unicode::AppendUtf8(cp, &out);
        } else {
          // Python keeps unknown escapes as written.
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}
class Lexer {
 public:
  Lexer(std::string_view source, const ParseOptions& options) : options_(options) {
    // As jinja2: every line ending becomes "\n", and one trailing newline is dropped
    // (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t start = pos;
      while (true) {
        start = src_.find('{', start);
        if (start == std::string::npos || start + 1 >= n) {
          start = std::string::npos;
          break;
        }
        const char k = src_[start + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++start;
      }
      if (start == std::string::npos) {
        Emit(Token::Type::kData, src_.substr(pos));
        break;
      }
      std::string text = src_.substr(pos, start - pos);
      const char kind = src_[start + 1];
      size_t p = start + 2;
      char sign = 0;
      if (p < n && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      if (sign == '-') {
        RStripPy(&text);
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between the start of the line and a block or
        // comment tag.
        const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            AllPyWhitespace(std::string_view(text).substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kData, std::move(text));
      CountLines(pos, p);
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrFormat("line %d: unclosed comment (missing '#}')", line_));
        }
        size_t after = close + 2;
        if (close > p && src_[close - 1] == '-') {
          after += PyWhitespaceRun(src_, after);
        } else if (close > p && src_[close - 1] == '+') {
          // keeps the newline
        } else if (options_.trim_blocks && after < n && src_[after] == '\n') {
          ++after;
        }
        line_starting = after > close + 2 && src_[after - 1] == '\n';
        CountLines(p, after);
        pos = after;
        continue;
      }
      const bool is_block = kind == '%';
      const int tag_line = line_;
      if (is_block) {
        CT_ASSIGN_OR_RETURN(size_t raw_end, LexRaw(p, &line_starting));
        if (raw_end != std::string::npos) {
          pos = raw_end;
          continue;
        }
      }
      Emit(is_block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "");
      CT_ASSIGN_OR_RETURN(pos, LexTag(p, is_block, tag_line, &line_starting));
    }
    Emit(Token::Type::kEof, "");
    return std::move(tokens_);
  }

 private:
  void Emit(Token::Type type, std::string text, Value value = Value()) {
    tokens_.push_back(Token{type, std::move(text), std::move(value), line_});
  }
  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }

  // Matches `\s*NAME\s*` at p; returns the position after it or npos.
  size_t MatchWord(size_t p, std::string_view word) const {
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    if (std::string_view(src_).substr(p, word.size()) != word) return std::string::npos;
    p += word.size();
    if (p < src_.size() && IsNameChar(src_[p])) return std::string::npos;
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    return p;
  }

  // `{% raw %}...{% endraw %}` with `p` after `{%` and its sign: emits the text between as data
  // and returns the position after the end tag, or npos when the tag is not `raw`. As in jinja2,
  // no newline is trimmed after `{% raw %}`.
  absl::StatusOr<size_t> LexRaw(size_t p, bool* line_starting) {
    size_t q = MatchWord(p, "raw");
    if (q == std::string::npos) return std::string::npos;
    if (src_.compare(q, 3, "-%}") == 0) {
      q += 3;
      q += PyWhitespaceRun(src_, q);
    } else if (src_.compare(q, 2, "%}") == 0) {
      q += 2;
    } else {
      return std::string::npos;
    }
    const int raw_line = line_;
    const size_t body_start = q;
    for (size_t at = src_.find("{%", q); at != std::string::npos; at = src_.find("{%", at + 2)) {
      size_t r = at + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r = MatchWord(r, "endraw");
      if (r == std::string::npos) continue;
      size_t after;
      if (src_.compare(r, 3, "+%}") == 0) {
        after = r + 3;
      } else if (src_.compare(r, 3, "-%}") == 0) {
        after = r + 3;
        after += PyWhitespaceRun(src_, after);
      } else if (src_.compare(r, 2, "%}") == 0) {
        after = r + 2;
        if (options_.trim_blocks && after < src_.size() && src_[after] == '\n') ++after;
      } else {
        continue;
      }
      std::string text = src_.substr(body_start, at - body_start);
      if (sign == '-') {
        RStripPy(&text);
      } else if (sign != '+' && options_.lstrip_blocks) {
        const size_t l_pos = text.rfind('\n') + 1;
        if ((l_pos > 0 || src_[body_start - 1] == '\n') && l_pos < text.size() &&
            AllPyWhitespace(std::string_view(text).substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kData, std::move(text));
      CountLines(p, after);
      *line_starting = src_[after - 1] == '\n';
      return after;
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("line %d: missing '{%% endraw %%}' for the raw block", raw_line));
  }

  // Lexes the inside of a `{{ ... }}` or `{% ... %}` starting at `p`; returns the position after
  // the closing marker (and the whitespace it swallows).
  absl::StatusOr<size_t> LexTag(size_t p, bool is_block, int tag_line, bool* line_starting) {
    const size_t n = src_.size();
    int depth = 0;  // open brackets: a closing marker inside them is an operator, as in jinja2
    while (true) {
      while (p < n && IsAsciiSpace(src_[p])) {
        line_ += src_[p] == '\n';
        ++p;
      }
      if (p >= n) {
        return absl::InvalidArgumentError(absl::StrFormat("line %d: unclosed '%s' (missing '%s')",
                                                          tag_line, is_block ? "{%" : "{{",
                                                          is_block ? "%}" : "}}"));
      }
      if (depth == 0) {
        const std::string_view rest = std::string_view(src_).substr(p);
        const std::string_view close = is_block ? "%}" : "}}";
        size_t after = std::string::npos;
        if (rest.size() >= 3 && rest[0] == '-' && rest.substr(1, 2) == close) {
          after = p + 3;
          after += PyWhitespaceRun(src_, after);
        } else if (is_block && rest.size() >= 3 && rest[0] == '+' && rest.substr(1, 2) == close) {
          after = p + 3;
        } else if (rest.substr(0, 2) == close) {
          after = p + 2;
          if (is_block && options_.trim_blocks && after < n && src_[after] == '\n') ++after;
        }
        if (after != std::string::npos) {
          Emit(is_block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "");
          *line_starting = src_[after - 1] == '\n';
          CountLines(p, after);
          return after;
        }
      }
      const char c = src_[p];
      if (IsNameStart(c)) {
        size_t e = p;
        while (e < n && IsNameChar(src_[e])) ++e;
        Emit(Token::Type::kName, src_.substr(p, e - p));
        p = e;
      } else if (c == '\'' || c == '"') {
        size_t e = p + 1;
        while (e < n && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= n) {
          return absl::InvalidArgumentError(
              absl::StrFormat("line %d: unterminated string literal", line_));
        }
        CT_ASSIGN_OR_RETURN(
            std::string decoded,
            DecodeStringLiteral(std::string_view(src_).substr(p + 1, e - p - 1), line_));
        Emit(Token::Type::kString, std::move(decoded));
        CountLines(p, e);
        p = e + 1;
      } else if (IsDigit(c)) {
        CT_ASSIGN_OR_RETURN(p, LexNumber(p));
      } else {
        static constexpr std::string_view kTwoCharOps[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (std::string_view two : kTwoCharOps) {
          if (std::string_view(src_).substr(p, 2) == two) op = std::string(two);
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~()[]{}<>=.:|,;").find(c) == std::string_view::npos) {
            return absl::InvalidArgumentError(
                absl::StrFormat("line %d: unexpected character '%c' in tag", line_, c));
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        Emit(Token::Type::kOp, op);
        p += op.size();
      }
    }
  }

  absl::StatusOr<size_t> LexNumber(size_t p) {
    const size_t n = src_.size();
    auto digits = [&](size_t q) {  // digits with single underscores between them
      while (q < n && (IsDigit(src_[q]) || (src_[q] == '_' && q + 1 < n && IsDigit(src_[q + 1]))))
        ++q;
      return q;
    };
    size_t e = digits(p);
    bool is_float = false;
    // jinja2 does not read "1.2" as a float right after a dot (`x.1.2` is x[1][2]).
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot && e + 1 < n && src_[e] == '.' && IsDigit(src_[e + 1])) {
      is_float = true;
      e = digits(e + 1);
    }
    if (!after_dot && e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && IsDigit(src_[q])) {
        is_float = true;
        e = digits(q);
      }
    }
    std::string text;
    for (size_t i = p; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    if (is_float) {
      Emit(Token::Type::kFloat, text, Value::Float(std::strtod(text.c_str(), nullptr)));
    } else {
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        return absl::InvalidArgumentError(
            absl::StrFormat("line %d: integer literal %s is too large", line_, text));
      }
      Emit(Token::Type::kInt, text, Value::Int(v));
    }
    return e;
  }

  ParseOptions options_;
  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source,
                                               const ParseOptions& options) {
  Lexer lexer(source, options);
  return lexer.Run();
}

bool TokenStream::SkipOp(std::string_view op) {
  if (!IsOp(op)) return false;
  Next();
  return true;
}

bool TokenStream::SkipName(std::string_view name) {
  if (!IsName(name)) return false;
  Next();
  return true;
}

std::string TokenStream::Describe(const Token& t) {
  switch (t.type) {
    case Token::Type::kData:
      return "template text";
    case Token::Type::kVarBegin:
      return "'{{'";
    case Token::Type::kVarEnd:
      return "end of print statement '}}'";
    case Token::Type::kBlockBegin:
      return "'{%'";
    case Token::Type::kBlockEnd:
      return "end of statement block '%}'";
    case Token::Type::kString:
      return "string literal";
    case Token::Type::kEof:
      return "end of template";
    default:
      return absl::StrCat("'", t.text, "'");
  }
}

absl::Status TokenStream::Error(const std::string& message) const {
  return absl::InvalidArgumentError(absl::StrFormat("line %d: %s", Cur().line, message));
}

absl::Status TokenStream::Unexpected(const std::string& expected) const {
  return Error(absl::StrCat("expected ", expected, ", got ", Describe(Cur())));
}

absl::Status TokenStream::ExpectOp(const std::string& op) {
  if (!SkipOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
  return absl::OkStatus();
}

absl::Status TokenStream::ExpectBlockEnd() {
  if (Cur().type != Token::Type::kBlockEnd) return Unexpected("end of statement block '%}'");
  Next();
  return absl::OkStatus();
}

absl::StatusOr<std::string> TokenStream::ExpectName(const std::string& what) {
  if (Cur().type != Token::Type::kName) return Unexpected(what);
  std::string name = Cur().text;
  Next();
  return name;
}

}  // namespace tandem::jinja
