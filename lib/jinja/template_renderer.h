// Evaluation of a parsed template, with the filters, tests, methods and globals of Hugging
// Face's chat-template environment. Part of the Jinja engine, lib/jinja/.
#ifndef TANDEM_LIB_JINJA_TEMPLATE_RENDERER_H_
#define TANDEM_LIB_JINJA_TEMPLATE_RENDERER_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "lib/jinja/template_ast.h"
#include "lib/jinja/value.h"

namespace tandem::jinja {

struct RenderLimits {
  size_t max_output_bytes = 16 << 20;
  int64_t max_loop_iterations = 1'000'000;  // over the whole render, all loops together
  int max_call_depth = 64;                  // macro calls nested in each other
};

// Whether the parser should accept `| name` and `is name`: unknown ones fail at parse time, as in
// jinja2, rather than halfway through a render.
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

// The payload that marks a status as coming from the template's raise_exception(): its message is
// the template's own, meant for the client.
inline constexpr char kRaisedByTemplatePayload[] = "tandem.chat_template.raise_exception";

// Renders `body` with the variables of `context` (a dict).
absl::StatusOr<std::string> RenderTemplate(const Body& body, const ValueMap& context,
                                           const RenderLimits& limits);

}  // namespace tandem::jinja

#endif  // TANDEM_LIB_JINJA_TEMPLATE_RENDERER_H_
