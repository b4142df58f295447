// The lexer of the Jinja2 subset (template_parser.h) and the token stream the parser reads.
// Part of the Jinja engine, lib/jinja/.
#ifndef TANDEM_LIB_JINJA_TEMPLATE_LEXER_H_
#define TANDEM_LIB_JINJA_TEMPLATE_LEXER_H_

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/jinja/template_parser.h"
#include "lib/jinja/value.h"

namespace tandem::jinja {

struct Token {
  enum class Type {
    kData,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  std::string text;  // data, name, operator, or the decoded string literal
  Value value;       // number literals
  int line = 0;
};

// The template's tokens, ending with kEof. Errors are INVALID_ARGUMENT naming the line.
absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source,
                                               const ParseOptions& options);

// A cursor over a template's tokens (the last one, kEof, is never passed), and the parser's
// ways to test, skip and expect them.
class TokenStream {
 public:
  explicit TokenStream(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const {
    return Cur().type == Token::Type::kOp && Cur().text == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == Token::Type::kName && Cur().text == name;
  }
  bool SkipOp(std::string_view op);
  bool SkipName(std::string_view name);
  // How an error names a token: "'{{'", "string literal", "'name'".
  static std::string Describe(const Token& t);
  // INVALID_ARGUMENT "line N: message" at the current token.
  absl::Status Error(const std::string& message) const;
  absl::Status Unexpected(const std::string& expected) const;
  absl::Status ExpectOp(const std::string& op);
  absl::Status ExpectBlockEnd();
  absl::StatusOr<std::string> ExpectName(const std::string& what);

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace tandem::jinja

#endif  // TANDEM_LIB_JINJA_TEMPLATE_LEXER_H_
