#include "http/json_limits.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {

absl::Status CheckJsonLimits(std::string_view body, int max_depth) {
  // The path to the value being read, for errors: one frame per open object or array.
  struct Frame {
    bool object;
    bool expect_key = true;  // objects: the next string is a key
    std::string key;         // objects: the current key
    size_t index = 0;        // arrays: the current element
  };
  std::vector<Frame> stack;
  auto path = [&] {
    std::string out;
    for (const Frame& f : stack) {
      if (f.object) {
        if (!out.empty()) out += ".";
        out += f.key;
      } else {
        absl::StrAppend(&out, "[", f.index, "]");
      }
    }
    return out.empty() ? std::string("the request body") : out;
  };
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    switch (c) {
      case '{':
      case '[':
        if (static_cast<int>(stack.size()) >= max_depth) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: JSON nested deeper than %d levels", path(), max_depth));
        }
        stack.push_back(Frame{.object = c == '{'});
        break;
      case '}':
      case ']':
        if (!stack.empty()) stack.pop_back();
        break;
      case ',':
        if (!stack.empty()) {
          stack.back().expect_key = true;
          ++stack.back().index;
        }
        break;
      case '"': {
        std::string text;
        ++i;
        for (; i < body.size() && body[i] != '"'; ++i) {
          if (body[i] == '\\' && i + 1 < body.size()) ++i;
          if (text.size() < 64) text.push_back(body[i]);
        }
        if (!stack.empty() && stack.back().object && stack.back().expect_key) {
          stack.back().key = text;
          stack.back().expect_key = false;
        }
        break;
      }
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          size_t end = i;
          while (end < body.size() &&
                 std::string_view("+-.eE0123456789").find(body[end]) != std::string_view::npos) {
            ++end;
          }
          const std::string number(body.substr(i, std::min<size_t>(end - i, 400)));
          errno = 0;
          const double v = std::strtod(number.c_str(), nullptr);
          if (errno == ERANGE && std::isinf(v)) {
            return absl::InvalidArgumentError(
                absl::StrFormat("%s: the number %s is out of range", path(), number.substr(0, 32)));
          }
          i = end - 1;
        }
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
