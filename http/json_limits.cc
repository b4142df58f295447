#include "http/json_limits.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

// One open object or array on the way to the value being read.
struct Frame {
  bool object;
  bool expect_key = true;  // objects: the next string is a key
  std::string key = "";    // objects: the current key (its first 64 bytes)
  size_t keys = 0;         // objects: keys so far
  size_t index = 0;        // arrays: the current element
};

// Where the first `n` frames lead ("messages[0].content"), for errors.
std::string Path(const std::vector<Frame>& stack, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const Frame& f = stack[i];
    if (f.object) {
      if (!out.empty()) out += ".";
      out += f.key;
    } else {
      absl::StrAppend(&out, "[", f.index, "]");
    }
  }
  return out.empty() ? std::string("the request body") : out;
}

// One past the last byte of the number that starts at body[i].
size_t NumberEnd(std::string_view body, size_t i) {
  while (i < body.size() &&
         std::string_view("+-.eE0123456789").find(body[i]) != std::string::npos) {
    ++i;
  }
  return i;
}

// Whether a double cannot hold `number` (its first 400 bytes).
bool OutOfRange(std::string_view number) {
  // Without an exponent, fewer than 300 digits stay below 1e300: no need to convert.
  if (number.size() < 300 && number.find_first_of("eE") == std::string_view::npos) return false;
  const std::string text(number.substr(0, 400));
  errno = 0;
  const double v = std::strtod(text.c_str(), nullptr);
  return errno == ERANGE && std::isinf(v);
}

}  // namespace

absl::Status CheckJsonLimits(std::string_view body, const JsonLimits& limits) {
  std::vector<Frame> stack;
  size_t values = 0;
  // Counts the value that starts here.
  auto count_value = [&]() -> absl::Status {
    if (++values <= limits.max_values) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: more than %d JSON values in the request body",
                        Path(stack, stack.size()), limits.max_values));
  };
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    switch (c) {
      case '{':
      case '[':
        if (static_cast<int>(stack.size()) >= limits.max_depth) {
          return absl::InvalidArgumentError(absl::StrFormat("%s: JSON nested deeper than %d levels",
                                                            Path(stack, stack.size()),
                                                            limits.max_depth));
        }
        if (absl::Status s = count_value(); !s.ok()) return s;
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
        if (stack.empty() || !stack.back().object || !stack.back().expect_key) {
          if (absl::Status s = count_value(); !s.ok()) return s;
          break;
        }
        Frame& f = stack.back();
        if (++f.keys > limits.max_object_keys) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: a JSON object with more than %d keys",
                              Path(stack, stack.size() - 1), limits.max_object_keys));
        }
        f.key = std::move(text);
        f.expect_key = false;
        break;
      }
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          if (absl::Status s = count_value(); !s.ok()) return s;
          const size_t end = NumberEnd(body, i);
          const std::string_view number = body.substr(i, end - i);
          if (OutOfRange(number)) {
            return absl::InvalidArgumentError(absl::StrFormat("%s: the number %s is out of range",
                                                              Path(stack, stack.size()),
                                                              number.substr(0, 32)));
          }
          i = end - 1;
        } else if (c == 't' || c == 'f' || c == 'n') {  // true, false, null
          if (absl::Status s = count_value(); !s.ok()) return s;
          while (i + 1 < body.size() && body[i + 1] >= 'a' && body[i + 1] <= 'z') ++i;
        }
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
