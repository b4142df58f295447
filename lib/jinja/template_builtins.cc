// Python's built-in types and jinja2's simple filters, as templates see them
// (template_render_internal.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/jinja/status_macros.h"
#include "lib/jinja/template_render_internal.h"

namespace tandem::jinja::render {

absl::Status TypeError(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status UndefinedError(const Value& v) {
  return absl::InvalidArgumentError(v.undefined_hint().empty() ? "value is undefined"
                                                               : v.undefined_hint());
}

// Binds call arguments to a Python-style parameter list; missing ones stay empty.
absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    const std::string& function, const CallArgs& args,
    std::initializer_list<std::string_view> params) {
  std::vector<std::optional<Value>> bound(params.size());
  if (args.positional.size() > params.size()) {
    return TypeError(absl::StrFormat("%s() takes at most %d arguments (%d given)", function,
                                     params.size(), args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [name, value] : args.keyword) {
    size_t i = 0;
    for (std::string_view p : params) {
      if (p == name) break;
      ++i;
    }
    if (i == params.size()) {
      return TypeError(
          absl::StrFormat("%s() got an unexpected keyword argument '%s'", function, name));
    }
    if (bound[i].has_value()) {
      return TypeError(
          absl::StrFormat("%s() got multiple values for argument '%s'", function, name));
    }
    bound[i] = value;
  }
  return bound;
}

// Python's index normalization for x[i]; false when out of range.
bool NormalizeIndex(int64_t* i, size_t size) {
  if (*i < 0) *i += static_cast<int64_t>(size);
  return *i >= 0 && *i < static_cast<int64_t>(size);
}

std::string AsciiLower(std::string s) {
  absl::AsciiStrToLower(&s);
  return s;
}
std::string AsciiUpper(std::string s) {
  absl::AsciiStrToUpper(&s);
  return s;
}

// Python's str.strip family. `chars` empty: whitespace.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  auto cps = SplitCodePoints(s);
  std::vector<std::string_view> strip_set;
  if (chars.has_value()) strip_set = SplitCodePoints(*chars);
  auto strip = [&](std::string_view cp) {
    if (!chars.has_value()) return IsPyWhitespace(cp);
    return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out.append(cps[i]);
  return out;
}

// Python's str.split / str.rsplit.
absl::StatusOr<ValueList> PySplit(std::string_view s, const std::optional<Value>& sep_arg,
                                  int64_t maxsplit, bool from_right) {
  ValueList parts;
  if (!sep_arg.has_value() || sep_arg->is_none()) {
    // Runs of whitespace separate; leading and trailing whitespace is ignored.
    auto cps = SplitCodePoints(s);
    std::vector<std::pair<size_t, size_t>> words;  // code point ranges
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPyWhitespace(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !IsPyWhitespace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    auto join = [&](size_t from, size_t to) {
      std::string out;
      for (size_t k = from; k < to; ++k) out.append(cps[k]);
      return out;
    };
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
      for (auto [b, e] : words) parts.push_back(Value::String(join(b, e)));
      return parts;
    }
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) {
        parts.push_back(Value::String(join(words[k].first, words[k].second)));
      }
      // The remainder starts at its first word and keeps everything after it.
      parts.push_back(Value::String(join(words[maxsplit].first, cps.size())));
    } else {
      const size_t first = words.size() - maxsplit;
      parts.push_back(Value::String(join(0, words[first - 1].second)));
      for (size_t k = first; k < words.size(); ++k) {
        parts.push_back(Value::String(join(words[k].first, words[k].second)));
      }
    }
    return parts;
  }
  if (!sep_arg->is_string()) return TypeError("must be str or None, not " + sep_arg->TypeName());
  const std::string& sep = sep_arg->as_string();
  if (sep.empty()) return TypeError("empty separator");
  std::vector<std::string_view> pieces;
  size_t start = 0;
  while (true) {
    const size_t hit = s.find(sep, start);
    if (hit == std::string_view::npos) break;
    pieces.push_back(s.substr(start, hit - start));
    start = hit + sep.size();
  }
  pieces.push_back(s.substr(start));
  if (maxsplit >= 0 && pieces.size() > static_cast<size_t>(maxsplit) + 1) {
    // Rejoin the pieces past the limit (from the left for split, the right for rsplit).
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(Value::String(std::string(pieces[k])));
      const size_t offset = pieces[maxsplit].data() - s.data();
      parts.push_back(Value::String(std::string(s.substr(offset))));
    } else {
      const size_t first = pieces.size() - maxsplit;
      const size_t end = pieces[first - 1].data() + pieces[first - 1].size() - s.data();
      parts.push_back(Value::String(std::string(s.substr(0, end))));
      for (size_t k = first; k < pieces.size(); ++k) {
        parts.push_back(Value::String(std::string(pieces[k])));
      }
    }
    return parts;
  }
  for (std::string_view p : pieces) parts.push_back(Value::String(std::string(p)));
  return parts;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement around every character.
    auto cps = SplitCodePoints(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(repl);
        ++done;
      }
      if (i < cps.size()) out.append(cps[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, start);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(start, hit - start));
    out.append(repl);
    start = hit + old.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

// Items a for loop, `list` or `join` sees: a list's items, a dict's keys, a string's characters.
absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& [key, value] : v.as_dict().entries()) keys.push_back(Value::String(key));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (std::string_view cp : SplitCodePoints(v.as_string())) {
        chars.push_back(Value::String(std::string(cp)));
      }
      return chars;
    }
    case Value::Kind::kUndefined:
      return ValueList{};  // jinja2's default Undefined iterates as empty
    default:
      return TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePointCount(v.as_string()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_dict().size());
    case Value::Kind::kUndefined:
      return 0;
    default:
      return TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        return TypeError(
            absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.as_dict().Find(item.as_string()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      return TypeError(
          absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out.append("&amp;");
        break;
      case '<':
        out.append("&lt;");
        break;
      case '>':
        out.append("&gt;");
        break;
      case '"':
        out.append("&#34;");
        break;
      case '\'':
        out.append("&#39;");
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's round(x, ndigits) for floats: correctly rounded, ties to even, which is what printf
// does with the exact binary value.
double PyRound(double x, int64_t ndigits) {
  if (!std::isfinite(x) || ndigits > 300) return x;
  if (ndigits < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-ndigits));
    return std::nearbyint(x / scale) * scale;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
  return std::strtod(buf, nullptr);
}

// dict.get/keys/values/items.
absl::StatusOr<Value> CallDictMethod(const ValueMap& map, const std::string& name,
                                     const CallArgs& args) {
  if (name == "get") {
    CT_ASSIGN_OR_RETURN(auto a, BindArgs("get", args, {"key", "default"}));
    if (!a[0].has_value()) return TypeError("get() takes at least 1 argument");
    if (a[0]->is_string()) {
      if (const Value* v = map.Find(a[0]->as_string())) return *v;
    }
    return a[1].value_or(Value::None());
  }
  if (!args.positional.empty() || !args.keyword.empty()) {
    return TypeError(absl::StrCat(name, "() takes no arguments"));
  }
  ValueList out;
  for (const auto& [k, v] : map.entries()) {
    if (name == "keys") {
      out.push_back(Value::String(k));
    } else if (name == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::Tuple({Value::String(k), v}));
    }
  }
  return Value::List(std::move(out));
}

// list.count and list.index.
absl::StatusOr<Value> CallListMethod(const ValueList& list, const std::string& name,
                                     const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"value"}));
  if (!a[0].has_value()) return TypeError(name + "() takes exactly one argument");
  int64_t count = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!Equals(list[i], *a[0])) continue;
    if (name == "index") return Value::Int(static_cast<int64_t>(i));
    ++count;
  }
  if (name == "index") return TypeError(ToPyRepr(*a[0]) + " is not in list");
  return Value::Int(count);
}

// str.startswith and str.endswith, with one prefix or a tuple of them.
absl::StatusOr<Value> StrStartsOrEndsWith(const std::string& s, const std::string& name,
                                          const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"prefix"}));
  if (!a[0].has_value()) return TypeError(name + "() takes exactly one argument");
  ValueList options;
  if (a[0]->is_list()) {
    options = a[0]->as_list();
  } else {
    options.push_back(*a[0]);
  }
  for (const Value& o : options) {
    if (!o.is_string()) {
      return TypeError(
          absl::StrCat(name, " first arg must be str or a tuple of str, not ", o.TypeName()));
    }
    const std::string& p = o.as_string();
    if (p.size() > s.size()) continue;
    if (name == "startswith" ? s.compare(0, p.size(), p) == 0
                             : s.compare(s.size() - p.size(), p.size(), p) == 0) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

// str.find and str.count, in code points.
absl::StatusOr<Value> StrFindOrCount(const std::string& s, const std::string& name,
                                     const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"sub"}));
  if (!a[0].has_value() || !a[0]->is_string()) return TypeError(name + "() takes a string");
  const std::string& sub = a[0]->as_string();
  if (name == "find") {
    const size_t hit = s.find(sub);
    if (hit == std::string::npos) return Value::Int(-1);
    return Value::Int(static_cast<int64_t>(CodePointCount(std::string_view(s).substr(0, hit))));
  }
  if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s)) + 1);
  int64_t count = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) {
    ++count;
  }
  return Value::Int(count);
}

// str.join: `s` between the items of an iterable of strings.
absl::StatusOr<Value> StrJoin(const std::string& s, const std::string& name, const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"iterable"}));
  if (!a[0].has_value()) return TypeError("join() takes exactly one argument");
  CT_ASSIGN_OR_RETURN(ValueList items, Iterate(*a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return TypeError(absl::StrFormat("sequence item %d: expected str instance, %s found", i,
                                       items[i].TypeName()));
    }
    if (i > 0) out.append(s);
    out.append(items[i].as_string());
  }
  return Value::String(std::move(out));
}

// str.isdigit, str.isalpha and str.isspace.
Value StrIsClass(const std::string& s, const std::string& name) {
  if (s.empty()) return Value::Bool(false);
  for (std::string_view cp : SplitCodePoints(s)) {
    const char c = cp[0];
    const bool ok = name == "isspace"   ? IsPyWhitespace(cp)
                    : cp.size() != 1    ? false
                    : name == "isdigit" ? absl::ascii_isdigit(c)
                                        : absl::ascii_isalpha(c);
    if (!ok) return Value::Bool(false);
  }
  return Value::Bool(true);
}

// str.splitlines, splitting at "\n", "\r" and "\r\n".
Value StrSplitLines(const std::string& s) {
  ValueList lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(Value::String(s.substr(start, i - start)));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < s.size()) lines.push_back(Value::String(s.substr(start)));
  return Value::List(std::move(lines));
}

// The `title` filter.
Value TitleFilter(const Value& v) {
  // jinja2: every run not containing "-", whitespace, "(", "{", "[" or "<" is capitalized.
  std::string s = ToPyStr(v);
  bool word_start = true;
  for (char& c : s) {
    const bool delimiter =
        absl::ascii_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (delimiter) {
      word_start = true;
    } else {
      c = word_start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
      word_start = false;
    }
  }
  return Value::String(std::move(s));
}

// The `tojson` filter.
absl::StatusOr<Value> ToJsonFilter(const Value& v, const CallArgs& args) {
  // Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=None,
  // separators=None, sort_keys=False), in that positional order.
  CT_ASSIGN_OR_RETURN(
      auto a, BindArgs("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonOptions options;
  options.ensure_ascii = a[0].has_value() && a[0]->Truthy();
  if (a[1].has_value() && !a[1]->is_none()) {
    if (a[1]->is_string()) {
      options.indent_string = a[1]->as_string();
      options.indent = 0;
    } else if (a[1]->is_int()) {
      options.indent = static_cast<int>(std::clamp<int64_t>(a[1]->as_int(), 0, 64));
    } else {
      return TypeError("tojson: indent must be an integer or a string");
    }
  }
  if (a[2].has_value() && !a[2]->is_none()) {
    if (!a[2]->is_list() || a[2]->as_list().size() != 2 || !a[2]->as_list()[0].is_string() ||
        !a[2]->as_list()[1].is_string()) {
      return TypeError("tojson: separators must be a pair of strings");
    }
    options.custom_item_separator = true;
    options.item_separator = a[2]->as_list()[0].as_string();
    options.key_separator = a[2]->as_list()[1].as_string();
  }
  options.sort_keys = a[3].has_value() && a[3]->Truthy();
  CT_ASSIGN_OR_RETURN(std::string json, ToJson(v, options));
  return Value::String(std::move(json));
}

// The `first` and `last` filters.
absl::StatusOr<Value> FirstOrLastFilter(const std::string& name, const Value& v) {
  if (v.is_dict() || v.is_list() || v.is_string() || v.is_undefined()) {
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    if (items.empty()) return Value::MakeUndefined(absl::StrCat("No ", name, " item"));
    return name == "first" ? items.front() : items.back();
  }
  return TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

// The `reverse` filter: a string's code points or an iterable's items, reversed.
absl::StatusOr<Value> ReverseFilter(const Value& v) {
  if (v.is_string()) {
    auto cps = SplitCodePoints(v.as_string());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out.append(*it);
    return Value::String(std::move(out));
  }
  CT_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::List(std::move(items));
}

// The `int` filter; `v` is not undefined.
absl::StatusOr<Value> IntFilter(const Value& v, const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs("int", args, {"default", "base"}));
  const Value dflt = a[0].value_or(Value::Int(0));
  if (v.is_int() || v.is_bool()) return Value::Int(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value::Int(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    std::string s = PyStrip(v.as_string(), std::nullopt, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (s.empty()) return dflt;
    const int base = a[1].has_value() && a[1]->is_int() ? static_cast<int>(a[1]->as_int()) : 10;
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, base);
    if (errno == 0 && end == s.c_str() + s.size()) return Value::Int(i);
    const double d = std::strtod(s.c_str(), &end);
    if (end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::Int(static_cast<int64_t>(d));
    }
  }
  return dflt;
}

// The `float` filter; `v` is not undefined.
absl::StatusOr<Value> FloatFilter(const Value& v, const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs("float", args, {"default"}));
  const Value dflt = a[0].value_or(Value::Float(0.0));
  if (v.is_number()) return Value::Float(v.as_double());
  if (v.is_string()) {
    const std::string s = PyStrip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(d);
  }
  return dflt;
}

// The `abs` filter; `v` is not undefined.
absl::StatusOr<Value> AbsFilter(const Value& v) {
  if (v.is_float()) return Value::Float(std::fabs(v.as_double()));
  if (v.is_number()) return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
  return TypeError(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
}

// The `round` filter (methods common, ceil and floor); `v` is not undefined.
absl::StatusOr<Value> RoundFilter(const Value& v, const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs("round", args, {"precision", "method"}));
  const int64_t precision = a[0].has_value() && a[0]->is_int() ? a[0]->as_int() : 0;
  const std::string method = a[1].has_value() ? ToPyStr(*a[1]) : "common";
  if (!v.is_number()) return TypeError("round: value must be a number");
  const double x = v.as_double();
  if (method == "common") {
    if (!v.is_float()) return Value::Int(v.as_int());
    return Value::Float(PyRound(x, precision));
  }
  if (method != "ceil" && method != "floor") {
    return TypeError("method must be 'common', 'ceil' or 'floor'");
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double r = (method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale;
  return Value::Float(r);
}

}  // namespace tandem::jinja::render
