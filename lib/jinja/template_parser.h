// Lexer and parser of the Jinja2 subset used by Hugging Face chat templates. Whitespace handling
// follows jinja2's lexer exactly (trim_blocks, lstrip_blocks, `-`/`+` markers, one trailing
// newline dropped), since chat templates are whitespace-sensitive byte for byte.
// Part of the Jinja engine, lib/jinja/.
#ifndef TANDEM_LIB_JINJA_TEMPLATE_PARSER_H_
#define TANDEM_LIB_JINJA_TEMPLATE_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "lib/jinja/template_ast.h"

namespace tandem::jinja {

struct ParseOptions {
  // Hugging Face's environment turns both on.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  // Deepest expression or statement nesting accepted, so that hostile templates cannot exhaust
  // the stack.
  int max_nesting = 100;
};

// Parses a template. Errors are INVALID_ARGUMENT (malformed) or UNIMPLEMENTED (valid Jinja2 that
// this engine does not support) and name the construct and the line.
absl::StatusOr<Body> ParseTemplate(std::string_view source, const ParseOptions& options);

}  // namespace tandem::jinja

#endif  // TANDEM_LIB_JINJA_TEMPLATE_PARSER_H_
