#include "text/chat_template/template_renderer.h"

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
#include "text/chat_template/status_macros.h"

namespace tandem::chat_template {
namespace {

constexpr std::string_view kFilters[] = {
    "abs",     "capitalize", "count",  "d",      "default",    "dictsort", "e",          "escape",
    "first",   "float",      "indent", "int",    "items",      "join",     "last",       "length",
    "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr", "replace",
    "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",     "sum",
    "title",   "tojson",     "trim",   "unique", "upper"};

constexpr std::string_view kTests[] = {
    "defined", "undefined",   "none",        "boolean",  "true",     "false",    "integer", "float",
    "number",  "string",      "mapping",     "iterable", "sequence", "callable", "sameas",  "eq",
    "equalto", "==",          "ne",          "!=",       "lt",       "lessthan", "<",       "le",
    "<=",      "gt",          "greaterthan", ">",        "ge",       ">=",       "in",      "odd",
    "even",    "divisibleby", "lower",       "upper"};

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

class Renderer {
 public:
  Renderer(const ValueMap& context, const RenderLimits& limits)
      : context_(context), limits_(limits) {
    InstallGlobals();
  }

  absl::StatusOr<std::string> Run(const Body& body) {
    std::string out;
    Scope root{{}, nullptr};
    root_ = &root;
    CT_ASSIGN_OR_RETURN(Flow flow, ExecBody(body, &root, &out));
    (void)flow;
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  struct Scope {
    std::unordered_map<std::string, Value> vars;
    Scope* parent;
  };

  // Adds the line to an error from a node, once.
  static absl::Status AtLine(const absl::Status& s, int line) {
    if (s.ok() || s.message().rfind("line ", 0) == 0 ||
        s.GetPayload(kRaisedByTemplatePayload).has_value()) {
      return s;
    }
    return absl::Status(s.code(), absl::StrFormat("line %d: %s", line, s.message()));
  }

  void InstallGlobals() {
    globals_.Set("range", Value::Function("range", [this](CallArgs& args) -> absl::StatusOr<Value> {
                   return Range(args);
                 }));
    globals_.Set("namespace",
                 Value::Function("namespace", [](CallArgs& args) -> absl::StatusOr<Value> {
                   ValueMap attrs;
                   for (const Value& p : args.positional) {
                     if (!p.is_dict()) return TypeError("namespace() takes a dict or keywords");
                     for (const auto& [k, v] : p.as_dict().entries()) attrs.Set(k, v);
                   }
                   for (auto& [k, v] : args.keyword) attrs.Set(k, v);
                   return Value::MakeNamespace(std::move(attrs));
                 }));
    globals_.Set("dict", Value::Function("dict", [](CallArgs& args) -> absl::StatusOr<Value> {
                   ValueMap map;
                   for (const Value& p : args.positional) {
                     if (!p.is_dict()) return TypeError("dict() takes a dict or keywords");
                     for (const auto& [k, v] : p.as_dict().entries()) map.Set(k, v);
                   }
                   for (auto& [k, v] : args.keyword) map.Set(k, v);
                   return Value::Dict(std::move(map));
                 }));
    globals_.Set("raise_exception",
                 Value::Function("raise_exception", [](CallArgs& args) -> absl::StatusOr<Value> {
                   // The template's own message, verbatim: it is meant for the client
                   // ("Conversation roles must alternate user/assistant/...").
                   std::string message = args.positional.empty() ? "" : ToPyStr(args.positional[0]);
                   absl::Status status = absl::InvalidArgumentError(message);
                   status.SetPayload(kRaisedByTemplatePayload, absl::Cord("1"));
                   return status;
                 }));
    globals_.Set("strftime_now",
                 Value::Function("strftime_now", [](CallArgs& args) -> absl::StatusOr<Value> {
                   // Hugging Face's helper for templates that print today's date (Llama 3.1+).
                   if (args.positional.size() != 1 || !args.positional[0].is_string()) {
                     return TypeError("strftime_now() takes one format string");
                   }
                   const std::time_t now = std::time(nullptr);
                   std::tm tm{};
                   localtime_r(&now, &tm);
                   char buf[256];
                   const size_t n =
                       std::strftime(buf, sizeof(buf), args.positional[0].as_string().c_str(), &tm);
                   return Value::String(std::string(buf, n));
                 }));
  }

  absl::StatusOr<Value> Range(const CallArgs& args) {
    if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
      return TypeError("range() takes 1 to 3 integer arguments");
    }
    for (const Value& v : args.positional) {
      if (!v.is_int() && !v.is_bool()) {
        return TypeError(absl::StrCat("'", v.TypeName(),
                                      "' object cannot be interpreted as an "
                                      "integer"));
      }
    }
    int64_t start = 0, stop, step = 1;
    if (args.positional.size() == 1) {
      stop = args.positional[0].as_int();
    } else {
      start = args.positional[0].as_int();
      stop = args.positional[1].as_int();
      if (args.positional.size() == 3) step = args.positional[2].as_int();
    }
    if (step == 0) return TypeError("range() arg 3 must not be zero");
    ValueList items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(items.size()) >= limits_.max_loop_iterations) {
        return absl::ResourceExhaustedError("range() is larger than the loop iteration limit");
      }
      items.push_back(Value::Int(i));
    }
    return Value::List(std::move(items));
  }

  absl::Status Append(std::string* out, std::string_view text) {
    if (out->size() + text.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "chat template output exceeds the limit of %d bytes", limits_.max_output_bytes));
    }
    out->append(text);
    return absl::OkStatus();
  }

  std::optional<Value> Lookup(const std::string& name, const Scope* scope) const {
    for (const Scope* s = scope; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    if (const Value* v = context_.Find(name)) return *v;
    if (const Value* v = globals_.Find(name)) return *v;
    return std::nullopt;
  }

  absl::StatusOr<Flow> ExecBody(const Body& body, Scope* scope, std::string* out) {
    for (const NodePtr& node : body) {
      absl::StatusOr<Flow> flow = Exec(*node, scope, out);
      if (!flow.ok()) return AtLine(flow.status(), node->line);
      if (*flow != Flow::kNormal) return *flow;
    }
    return Flow::kNormal;
  }

  absl::Status Assign(const std::vector<std::string>& targets, Value value, Scope* scope) {
    if (targets.size() == 1) {
      scope->vars[targets[0]] = std::move(value);
      return absl::OkStatus();
    }
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
    if (items.size() != targets.size()) {
      return TypeError(
          absl::StrFormat("cannot unpack %d values into %d names", items.size(), targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = std::move(items[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> Exec(const Node& node, Scope* scope, std::string* out) {
    switch (node.kind) {
      case Node::Kind::kText:
        CT_RETURN_IF_ERROR(Append(out, node.text));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        CT_ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
        CT_RETURN_IF_ERROR(Append(out, ToPyStr(v)));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const IfBranch& branch : node.branches) {
          CT_ASSIGN_OR_RETURN(Value cond, Eval(*branch.condition, scope));
          if (cond.Truthy()) return ExecBody(branch.body, scope, out);
        }
        return ExecBody(node.else_body, scope, out);
      case Node::Kind::kFor:
        return ExecFor(node, scope, out);
      case Node::Kind::kSet: {
        CT_ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
        if (!node.attr_target.empty()) {
          std::optional<Value> target = Lookup(node.attr_target, scope);
          if (!target.has_value() || !target->is_namespace()) {
            return TypeError(absl::StrCat("cannot assign attribute on non-namespace object '",
                                          node.attr_target, "'"));
          }
          target->as_namespace().attrs.Set(node.targets[0], std::move(v));
          return Flow::kNormal;
        }
        CT_RETURN_IF_ERROR(Assign(node.targets, std::move(v), scope));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        CT_ASSIGN_OR_RETURN(Flow flow, ExecBody(node.body, scope, &captured));
        (void)flow;
        scope->vars[node.targets[0]] = Value::String(std::move(captured));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kMacro:
        scope->vars[node.name] = MakeMacro(node);
        return Flow::kNormal;
      case Node::Kind::kScope: {
        Scope inner{{}, scope};
        for (const auto& [name, expr] : node.assignments) {
          CT_ASSIGN_OR_RETURN(Value v, Eval(*expr, scope));
          inner.vars[name] = std::move(v);
        }
        return ExecBody(node.body, &inner, out);
      }
    }
    return absl::InternalError("unknown statement");
  }

  absl::StatusOr<Flow> ExecFor(const Node& node, Scope* scope, std::string* out) {
    CT_ASSIGN_OR_RETURN(Value seq, Eval(*node.expr, scope));
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(seq));
    if (node.condition != nullptr) {
      // `for x in xs if cond`: the loop variables count the kept items only.
      ValueList kept;
      for (Value& item : items) {
        Scope probe{{}, scope};
        CT_RETURN_IF_ERROR(Assign(node.targets, item, &probe));
        CT_ASSIGN_OR_RETURN(Value keep, Eval(*node.condition, &probe));
        if (keep.Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      if (++iterations_ > limits_.max_loop_iterations) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "chat template exceeds the limit of %d loop iterations", limits_.max_loop_iterations));
      }
      Scope iteration{{}, scope};
      ValueMap loop;
      loop.Set("index", Value::Int(i + 1));
      loop.Set("index0", Value::Int(i));
      loop.Set("revindex", Value::Int(length - i));
      loop.Set("revindex0", Value::Int(length - i - 1));
      loop.Set("first", Value::Bool(i == 0));
      loop.Set("last", Value::Bool(i == length - 1));
      loop.Set("length", Value::Int(length));
      loop.Set("depth", Value::Int(1));
      loop.Set("depth0", Value::Int(0));
      loop.Set("previtem",
               i > 0 ? items[i - 1] : Value::MakeUndefined("there is no previous item"));
      loop.Set("nextitem",
               i + 1 < length ? items[i + 1] : Value::MakeUndefined("there is no next item"));
      loop.Set("cycle", Value::Function("cycle", [i](CallArgs& args) -> absl::StatusOr<Value> {
                 if (args.positional.empty()) return TypeError("no items for cycling given");
                 return args.positional[i % args.positional.size()];
               }));
      iteration.vars["loop"] = Value::Dict(std::move(loop));
      CT_RETURN_IF_ERROR(Assign(node.targets, items[i], &iteration));
      CT_ASSIGN_OR_RETURN(Flow flow, ExecBody(node.body, &iteration, out));
      if (flow == Flow::kBreak) break;
    }
    if (length == 0) return ExecBody(node.else_body, scope, out);
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& node) {
    const Node* macro = &node;
    return Value::Function(node.name, [this, macro](CallArgs& args) -> absl::StatusOr<Value> {
      if (call_depth_ >= limits_.max_call_depth) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "chat template exceeds the limit of %d nested macro calls", limits_.max_call_depth));
      }
      if (args.positional.size() > macro->params.size()) {
        return TypeError(absl::StrFormat("macro '%s' takes not more than %d argument(s)",
                                         macro->name, macro->params.size()));
      }
      // Macros see the template's top-level names, not the caller's locals.
      Scope scope{{}, root_};
      std::vector<bool> given(macro->params.size(), false);
      for (size_t i = 0; i < args.positional.size(); ++i) {
        scope.vars[macro->params[i].name] = args.positional[i];
        given[i] = true;
      }
      for (auto& [name, value] : args.keyword) {
        size_t i = 0;
        while (i < macro->params.size() && macro->params[i].name != name) ++i;
        if (i == macro->params.size()) {
          return TypeError(absl::StrFormat("macro '%s' has no argument '%s'", macro->name, name));
        }
        scope.vars[name] = value;
        given[i] = true;
      }
      for (size_t i = 0; i < macro->params.size(); ++i) {
        if (given[i]) continue;
        const MacroParam& p = macro->params[i];
        if (p.default_value != nullptr) {
          CT_ASSIGN_OR_RETURN(scope.vars[p.name], Eval(*p.default_value, &scope));
        } else {
          scope.vars[p.name] =
              Value::MakeUndefined(absl::StrFormat("parameter '%s' was not provided", p.name));
        }
      }
      ++call_depth_;
      std::string out;
      absl::StatusOr<Flow> flow = ExecBody(macro->body, &scope, &out);
      --call_depth_;
      if (!flow.ok()) return flow.status();
      return Value::String(std::move(out));
    });
  }

  absl::StatusOr<CallArgs> EvalArgs(const std::vector<Arg>& args, Scope* scope) {
    CallArgs out;
    for (const Arg& arg : args) {
      CT_ASSIGN_OR_RETURN(Value v, Eval(*arg.value, scope));
      if (arg.name.empty()) {
        out.positional.push_back(std::move(v));
      } else {
        out.keyword.emplace_back(arg.name, std::move(v));
      }
    }
    return out;
  }

  static bool IsStringMethod(std::string_view name) {
    static constexpr std::string_view kMethods[] = {
        "startswith", "endswith", "split",   "rsplit",     "strip",      "lstrip", "rstrip",
        "upper",      "lower",    "title",   "capitalize", "replace",    "find",   "count",
        "join",       "isdigit",  "isalpha", "isspace",    "splitlines", "format"};
    return std::find(std::begin(kMethods), std::end(kMethods), name) != std::end(kMethods);
  }
  static bool IsListMethod(std::string_view name) { return name == "count" || name == "index"; }
  static bool IsDictMethod(std::string_view name) {
    return name == "get" || name == "items" || name == "keys" || name == "values";
  }

  Value BoundMethod(const Value& obj, const std::string& name) {
    return Value::Function(
        name, [this, obj, name](CallArgs& args) { return CallMethod(obj, name, args); });
  }

  // x.name: Python attribute first (methods), then the item, as jinja2's sandbox does.
  absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        return UndefinedError(obj);
      case Value::Kind::kDict:
        if (IsDictMethod(name)) return BoundMethod(obj, name);
        if (const Value* v = obj.as_dict().Find(name)) return *v;
        return Value::MakeUndefined(absl::StrCat("'dict object' has no attribute '", name, "'"));
      case Value::Kind::kNamespace:
        if (const Value* v = obj.as_namespace().attrs.Find(name)) return *v;
        break;
      case Value::Kind::kString:
        if (IsStringMethod(name)) return BoundMethod(obj, name);
        break;
      case Value::Kind::kList:
        if (IsListMethod(name)) return BoundMethod(obj, name);
        break;
      default:
        break;
    }
    return Value::MakeUndefined(
        absl::StrCat("'", obj.TypeName(), " object' has no attribute '", name, "'"));
  }

  // x[key]: the item first, then the attribute.
  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        return UndefinedError(obj);
      case Value::Kind::kDict:
        if (key.is_string()) {
          if (const Value* v = obj.as_dict().Find(key.as_string())) return *v;
          if (IsDictMethod(key.as_string())) return BoundMethod(obj, key.as_string());
        }
        return Value::MakeUndefined(absl::StrCat("'dict object' has no attribute ", ToPyRepr(key)));
      case Value::Kind::kList:
        if (key.is_int() || key.is_bool()) {
          int64_t i = key.as_int();
          if (NormalizeIndex(&i, obj.as_list().size())) return obj.as_list()[i];
          return Value::MakeUndefined(
              absl::StrFormat("'list object' has no element %d", key.as_int()));
        }
        break;
      case Value::Kind::kString:
        if (key.is_int() || key.is_bool()) {
          auto cps = SplitCodePoints(obj.as_string());
          int64_t i = key.as_int();
          if (NormalizeIndex(&i, cps.size())) return Value::String(std::string(cps[i]));
          return Value::MakeUndefined(
              absl::StrFormat("'str object' has no element %d", key.as_int()));
        }
        break;
      default:
        break;
    }
    if (key.is_string()) return GetAttr(obj, key.as_string());
    return Value::MakeUndefined(
        absl::StrCat("'", obj.TypeName(), " object' has no element ", ToPyRepr(key)));
  }

  absl::StatusOr<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v,
                              const Value& step_v) {
    if (obj.is_undefined()) return UndefinedError(obj);
    auto as_index = [](const Value& v, std::optional<int64_t>* out) -> absl::Status {
      if (v.is_undefined() || v.is_none()) return absl::OkStatus();
      if (!v.is_int() && !v.is_bool()) {
        return TypeError("slice indices must be integers or None");
      }
      *out = v.as_int();
      return absl::OkStatus();
    };
    std::optional<int64_t> start, stop, step;
    CT_RETURN_IF_ERROR(as_index(start_v, &start));
    CT_RETURN_IF_ERROR(as_index(stop_v, &stop));
    CT_RETURN_IF_ERROR(as_index(step_v, &step));
    const int64_t st = step.value_or(1);
    if (st == 0) return TypeError("slice step cannot be zero");
    std::vector<std::string_view> cps;
    int64_t n;
    if (obj.is_string()) {
      cps = SplitCodePoints(obj.as_string());
      n = static_cast<int64_t>(cps.size());
    } else if (obj.is_list()) {
      n = static_cast<int64_t>(obj.as_list().size());
    } else {
      return TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
    }
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v.has_value()) return dflt;
      int64_t x = *v;
      if (x < 0) {
        x += n;
        if (x < 0) x = st < 0 ? -1 : 0;
      } else if (x >= n) {
        x = st < 0 ? n - 1 : n;
      }
      return x;
    };
    const int64_t b = clamp(start, st < 0 ? n - 1 : 0);
    const int64_t e = clamp(stop, st < 0 ? -1 : n);
    std::vector<int64_t> picks;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(i);
    if (obj.is_string()) {
      std::string out;
      for (int64_t i : picks) out.append(cps[i]);
      return Value::String(std::move(out));
    }
    ValueList out;
    for (int64_t i : picks) out.push_back(obj.as_list()[i]);
    return Value::List(std::move(out));
  }

  absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, CallArgs& args) {
    if (obj.is_dict()) return CallDictMethod(obj.as_dict(), name, args);
    if (obj.is_list() && (name == "count" || name == "index")) {
      return CallListMethod(obj.as_list(), name, args);
    }
    if (!obj.is_string()) {
      return TypeError(absl::StrCat("'", obj.TypeName(), "' object has no method '", name, "'"));
    }
    return CallStringMethod(obj, name, args);
  }

  // The str methods templates use; `obj` is a string.
  absl::StatusOr<Value> CallStringMethod(const Value& obj, const std::string& name,
                                         CallArgs& args) {
    const std::string& s = obj.as_string();
    if (name == "startswith" || name == "endswith") return StrStartsOrEndsWith(s, name, args);
    if (name == "split" || name == "rsplit") {
      CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"sep", "maxsplit"}));
      int64_t maxsplit = -1;
      if (a[1].has_value()) {
        if (!a[1]->is_int()) return TypeError("maxsplit must be an integer");
        maxsplit = a[1]->as_int();
      }
      CT_ASSIGN_OR_RETURN(ValueList parts, PySplit(s, a[0], maxsplit, name == "rsplit"));
      return Value::List(std::move(parts));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"chars"}));
      std::optional<std::string> chars;
      if (a[0].has_value() && !a[0]->is_none()) {
        if (!a[0]->is_string()) return TypeError(name + " arg must be None or str");
        chars = a[0]->as_string();
      }
      return Value::String(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      CallArgs with_value = args;
      return ApplyFilter(name, obj, with_value);
    }
    if (name == "replace") {
      CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"old", "new", "count"}));
      if (!a[0].has_value() || !a[1].has_value() || !a[0]->is_string() || !a[1]->is_string()) {
        return TypeError("replace() takes two strings");
      }
      const int64_t count = a[2].has_value() && a[2]->is_int() ? a[2]->as_int() : -1;
      return Value::String(PyReplace(s, a[0]->as_string(), a[1]->as_string(), count));
    }
    if (name == "find" || name == "count") return StrFindOrCount(s, name, args);
    if (name == "join") return StrJoin(s, name, args);
    if (name == "isdigit" || name == "isalpha" || name == "isspace") return StrIsClass(s, name);
    if (name == "splitlines") return StrSplitLines(s);
    return absl::UnimplementedError(
        absl::StrCat("the string method '", name, "' is not supported"));
  }

  // The attribute (or dotted path, or integer index) a filter like `map(attribute=...)` reads.
  absl::StatusOr<Value> GetPath(const Value& item, const Value& path) {
    if (path.is_int()) return GetItem(item, path);
    if (!path.is_string()) return TypeError("attribute must be a string or an integer");
    Value v = item;
    std::string_view rest = path.as_string();
    while (true) {
      const size_t dot = rest.find('.');
      const std::string part(rest.substr(0, dot));
      const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return absl::ascii_isdigit(c);
      });
      CT_ASSIGN_OR_RETURN(v,
                          GetItem(v, numeric ? Value::Int(std::stoll(part)) : Value::String(part)));
      if (dot == std::string_view::npos) return v;
      rest.remove_prefix(dot + 1);
    }
  }

  // select/reject/selectattr/rejectattr.
  absl::StatusOr<Value> SelectFilter(const std::string& name, const Value& seq, CallArgs& args) {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    size_t next = 0;
    Value attr;
    if (by_attr) {
      if (args.positional.empty()) return TypeError(name + "() needs an attribute name");
      attr = args.positional[next++];
    }
    std::optional<std::string> test;
    if (next < args.positional.size()) {
      if (!args.positional[next].is_string()) return TypeError("test name must be a string");
      test = args.positional[next++].as_string();
      if (!IsKnownTest(*test)) {
        return absl::UnimplementedError(absl::StrFormat("unknown or unsupported test '%s'", *test));
      }
    }
    CallArgs test_args;
    test_args.positional.assign(args.positional.begin() + next, args.positional.end());
    test_args.keyword = args.keyword;
    if (!seq.Truthy()) return Value::List({});  // jinja2 skips iterating falsy values
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(seq));
    ValueList out;
    for (const Value& item : items) {
      Value probe = item;
      if (by_attr) {
        CT_ASSIGN_OR_RETURN(probe, GetPath(item, attr));
      }
      bool pass;
      if (test.has_value()) {
        CT_ASSIGN_OR_RETURN(pass, ApplyTest(*test, probe, test_args));
      } else {
        pass = probe.Truthy();
      }
      if (pass == keep_if) out.push_back(item);
    }
    return Value::List(std::move(out));
  }

  absl::StatusOr<Value> SortKey(const Value& item, const std::optional<Value>& attribute,
                                bool case_sensitive) {
    Value key = item;
    if (attribute.has_value() && !attribute->is_none()) {
      CT_ASSIGN_OR_RETURN(key, GetPath(item, *attribute));
    }
    if (!case_sensitive && key.is_string()) key = Value::String(AsciiLower(key.as_string()));
    return key;
  }

  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs& args) {
    if (name == "safe") return v;
    if (name == "length" || name == "count") {
      CT_ASSIGN_OR_RETURN(int64_t n, Length(v));
      return Value::Int(n);
    }
    if (name == "string") return Value::String(ToPyStr(v));
    if (name == "upper") return Value::String(AsciiUpper(ToPyStr(v)));
    if (name == "lower") return Value::String(AsciiLower(ToPyStr(v)));
    if (name == "capitalize") {
      std::string s = AsciiLower(ToPyStr(v));
      if (!s.empty()) s[0] = absl::ascii_toupper(s[0]);
      return Value::String(std::move(s));
    }
    if (name == "title") return TitleFilter(v);
    if (name == "trim") {
      CT_ASSIGN_OR_RETURN(auto a, BindArgs("trim", args, {"chars"}));
      std::optional<std::string> chars;
      if (a[0].has_value() && !a[0]->is_none()) chars = ToPyStr(*a[0]);
      return Value::String(PyStrip(ToPyStr(v), chars, true, true));
    }
    if (name == "default" || name == "d") {
      CT_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"default_value", "boolean"}));
      const bool boolean = a[1].has_value() && a[1]->Truthy();
      if (v.is_undefined() || (boolean && !v.Truthy())) {
        return a[0].value_or(Value::String(""));
      }
      return v;
    }
    if (name == "e" || name == "escape") return Value::String(HtmlEscape(ToPyStr(v)));
    if (name == "tojson") return ToJsonFilter(v, args);
    if (name == "join") return JoinFilter(v, args);
    if (name == "list") {
      CT_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
      return Value::List(std::move(items));
    }
    if (name == "first" || name == "last") return FirstOrLastFilter(name, v);
    if (name == "reverse") return ReverseFilter(v);
    if (name == "items") {
      if (v.is_undefined()) return Value::List({});
      if (!v.is_dict()) return TypeError("Can only get item pairs from a mapping.");
      CallArgs none;
      return CallMethod(v, "items", none);
    }
    if (name == "dictsort") return DictSortFilter(v, args);
    if (name == "replace") return ReplaceFilter(v, args);
    if ((name == "int" || name == "float" || name == "abs" || name == "round") &&
        v.is_undefined()) {
      return UndefinedError(v);
    }
    if (name == "int") return IntFilter(v, args);
    if (name == "float") return FloatFilter(v, args);
    if (name == "abs") return AbsFilter(v);
    if (name == "round") return RoundFilter(v, args);
    if (name == "indent") return IndentFilter(v, args);
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      return SelectFilter(name, v, args);
    }
    if (name == "map") return MapFilter(v, args);
    if (name == "sort" || name == "unique" || name == "min" || name == "max") {
      return SortFilter(name, v, args);
    }
    if (name == "sum") return SumFilter(v, args);
    return absl::UnimplementedError(absl::StrFormat("unknown or unsupported filter '%s'", name));
  }

  // The `join` filter, optionally of one attribute of each item.
  absl::StatusOr<Value> JoinFilter(const Value& v, const CallArgs& args) {
    CT_ASSIGN_OR_RETURN(auto a, BindArgs("join", args, {"d", "attribute"}));
    const std::string sep = a[0].has_value() ? ToPyStr(*a[0]) : "";
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out.append(sep);
      if (a[1].has_value() && !a[1]->is_none()) {
        CT_ASSIGN_OR_RETURN(Value item, GetPath(items[i], *a[1]));
        out.append(ToPyStr(item));
      } else {
        out.append(ToPyStr(items[i]));
      }
      if (out.size() > limits_.max_output_bytes) {
        return absl::ResourceExhaustedError("join: result exceeds the output limit");
      }
    }
    return Value::String(std::move(out));
  }

  // The `dictsort` filter: a mapping's (key, value) pairs sorted by key or by value.
  absl::StatusOr<Value> DictSortFilter(const Value& v, const CallArgs& args) {
    CT_ASSIGN_OR_RETURN(auto a, BindArgs("dictsort", args, {"case_sensitive", "by", "reverse"}));
    if (!v.is_dict()) return TypeError("dictsort: can only sort a mapping");
    const bool case_sensitive = a[0].has_value() && a[0]->Truthy();
    const bool by_value = a[1].has_value() && a[1]->is_string() && a[1]->as_string() == "value";
    const bool reverse = a[2].has_value() && a[2]->Truthy();
    CallArgs none;
    CT_ASSIGN_OR_RETURN(Value pairs, CallMethod(v, "items", none));
    ValueList items = pairs.as_list();
    CT_RETURN_IF_ERROR(SortValues(&items, reverse, [&](const Value& pair) -> absl::StatusOr<Value> {
      Value key = pair.as_list()[by_value ? 1 : 0];
      if (!case_sensitive && key.is_string()) key = Value::String(AsciiLower(key.as_string()));
      return key;
    }));
    return Value::List(std::move(items));
  }

  // The `replace` filter.
  absl::StatusOr<Value> ReplaceFilter(const Value& v, const CallArgs& args) {
    CT_ASSIGN_OR_RETURN(auto a, BindArgs("replace", args, {"old", "new", "count"}));
    if (!a[0].has_value() || !a[1].has_value()) return TypeError("replace() needs old and new");
    const int64_t count = a[2].has_value() && a[2]->is_int() ? a[2]->as_int() : -1;
    std::string out = PyReplace(ToPyStr(v), ToPyStr(*a[0]), ToPyStr(*a[1]), count);
    if (out.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError("replace: result exceeds the output limit");
    }
    return Value::String(std::move(out));
  }

  // The `indent` filter: pads every line but the first (and, with first=true, that one too).
  absl::StatusOr<Value> IndentFilter(const Value& v, const CallArgs& args) {
    CT_ASSIGN_OR_RETURN(auto a, BindArgs("indent", args, {"width", "first", "blank"}));
    std::string pad = "    ";
    if (a[0].has_value()) {
      pad = a[0]->is_string() ? a[0]->as_string()
                              : std::string(std::clamp<int64_t>(a[0]->as_int(), 0, 256), ' ');
    }
    const bool first = a[1].has_value() && a[1]->Truthy();
    const bool blank = a[2].has_value() && a[2]->Truthy();
    CallArgs none;
    CT_ASSIGN_OR_RETURN(Value lines_v,
                        CallMethod(Value::String(ToPyStr(v) + "\n"), "splitlines", none));
    const ValueList& lines = lines_v.as_list();
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i].as_string();
      if (i > 0) {
        out.push_back('\n');
        if (blank || !line.empty()) out.append(pad);
      }
      out.append(line);
    }
    if (first) out = pad + out;
    return Value::String(std::move(out));
  }

  // The `map` filter: another filter, or an attribute, applied to every item.
  absl::StatusOr<Value> MapFilter(const Value& v, const CallArgs& args) {
    if (!v.Truthy()) return Value::List({});  // jinja2 skips iterating falsy values
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    ValueList out;
    std::optional<Value> attribute, dflt;
    CallArgs filter_args;
    for (auto& [k, val] : args.keyword) {
      if (k == "attribute") {
        attribute = val;
      } else if (k == "default") {
        dflt = val;
      } else {
        filter_args.keyword.emplace_back(k, val);
      }
    }
    std::string filter;
    if (!attribute.has_value()) {
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return TypeError("map() needs a filter name or attribute=");
      }
      filter = args.positional[0].as_string();
      if (!IsKnownFilter(filter)) {
        return absl::UnimplementedError(
            absl::StrFormat("unknown or unsupported filter '%s'", filter));
      }
      filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
    }
    for (const Value& item : items) {
      if (attribute.has_value()) {
        CT_ASSIGN_OR_RETURN(Value got, GetPath(item, *attribute));
        out.push_back(got.is_undefined() && dflt.has_value() ? *dflt : got);
      } else {
        CallArgs call = filter_args;
        CT_ASSIGN_OR_RETURN(Value mapped, ApplyFilter(filter, item, call));
        out.push_back(std::move(mapped));
      }
    }
    return Value::List(std::move(out));
  }

  // The `sort`, `unique`, `min` and `max` filters.
  absl::StatusOr<Value> SortFilter(const std::string& name, const Value& v, const CallArgs& args) {
    const bool is_sort = name == "sort";
    CT_ASSIGN_OR_RETURN(auto a,
                        is_sort ? BindArgs(name, args, {"reverse", "case_sensitive", "attribute"})
                                : BindArgs(name, args, {"case_sensitive", "attribute"}));
    const bool reverse = is_sort && a[0].has_value() && a[0]->Truthy();
    const std::optional<Value>& cs = a[is_sort ? 1 : 0];
    const std::optional<Value>& attribute = a[is_sort ? 2 : 1];
    const bool case_sensitive = cs.has_value() && cs->Truthy();
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    auto key = [&](const Value& item) { return SortKey(item, attribute, case_sensitive); };
    if (name == "unique") {
      ValueList out, seen;
      for (const Value& item : items) {
        CT_ASSIGN_OR_RETURN(Value k, key(item));
        if (k.is_list() || k.is_dict() || k.is_namespace()) {
          return TypeError(absl::StrCat("unhashable type: '", k.TypeName(), "'"));
        }
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return Value::List(std::move(out));
    }
    CT_RETURN_IF_ERROR(SortValues(&items, reverse, key));
    if (is_sort) return Value::List(std::move(items));
    if (items.empty()) return Value::MakeUndefined(absl::StrCat("No ", name, " item"));
    return name == "min" ? items.front() : items.back();
  }

  // The `sum` filter, optionally of one attribute of each item.
  absl::StatusOr<Value> SumFilter(const Value& v, const CallArgs& args) {
    CT_ASSIGN_OR_RETURN(auto a, BindArgs("sum", args, {"attribute", "start"}));
    CT_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    Value total = a[1].value_or(Value::Int(0));
    for (const Value& item : items) {
      Value x = item;
      if (a[0].has_value() && !a[0]->is_none()) {
        CT_ASSIGN_OR_RETURN(x, GetPath(item, *a[0]));
      }
      CT_ASSIGN_OR_RETURN(total, Arithmetic("+", total, x));
    }
    return total;
  }

  template <typename KeyFn>
  absl::Status SortValues(ValueList* items, bool reverse, KeyFn key_fn) {
    std::vector<std::pair<Value, size_t>> keyed;
    for (size_t i = 0; i < items->size(); ++i) {
      CT_ASSIGN_OR_RETURN(Value k, key_fn((*items)[i]));
      keyed.emplace_back(std::move(k), i);
    }
    absl::Status error;
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      absl::StatusOr<int> c = Compare(x.first, y.first);
      if (!c.ok()) {
        if (error.ok()) error = c.status();
        return false;
      }
      return reverse ? *c > 0 : *c < 0;
    });
    if (!error.ok()) return error;
    ValueList sorted;
    for (auto& [k, i] : keyed) sorted.push_back(std::move((*items)[i]));
    *items = std::move(sorted);
    return absl::OkStatus();
  }

  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const CallArgs& args) {
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    if (name == "callable") return v.is_callable();
    if (name == "lower" || name == "upper") {
      const std::string s = ToPyStr(v);
      bool cased = false;
      for (char c : s) {
        if (absl::ascii_isalpha(c)) {
          cased = true;
          if (name == "lower" ? absl::ascii_isupper(c) : absl::ascii_islower(c)) return false;
        }
      }
      return cased;
    }
    if (name == "odd" || name == "even") {
      // jinja2: value % 2 == 1 (odd) or == 0 (even), with Python's modulo.
      CT_ASSIGN_OR_RETURN(Value m, Arithmetic("%", v, Value::Int(2)));
      return Equals(m, Value::Int(name == "odd" ? 1 : 0));
    }
    // The rest take one argument.
    if (args.positional.size() != 1 || !args.keyword.empty()) {
      return TypeError(absl::StrCat("test '", name, "' takes exactly one argument"));
    }
    const Value& other = args.positional[0];
    if (name == "divisibleby") {
      CT_ASSIGN_OR_RETURN(Value m, Arithmetic("%", v, other));
      return Equals(m, Value::Int(0));
    }
    if (name == "sameas") {
      if (v.kind() != other.kind()) return false;
      if (v.is_none() || v.is_bool() || v.is_undefined()) return Equals(v, other);
      return Equals(v, other) && (v.is_int() || v.is_string());  // small ints/interned strings
    }
    if (name == "eq" || name == "equalto" || name == "==") return Equals(v, other);
    if (name == "ne" || name == "!=") return !Equals(v, other);
    if (name == "in") return Contains(other, v);
    CT_ASSIGN_OR_RETURN(int c, Compare(v, other));
    if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
    if (name == "le" || name == "<=") return c <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
    if (name == "ge" || name == ">=") return c >= 0;
    return absl::UnimplementedError(absl::StrFormat("unknown or unsupported test '%s'", name));
  }

  absl::StatusOr<Value> Repeat(const Value& seq, int64_t times) {
    if (times <= 0) return seq.is_string() ? Value::String("") : Value::List({});
    const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
    if (unit != 0 && static_cast<uint64_t>(times) > limits_.max_output_bytes / unit) {
      return absl::ResourceExhaustedError("repetition exceeds the output limit");
    }
    if (seq.is_string()) {
      std::string out;
      for (int64_t i = 0; i < times; ++i) out.append(seq.as_string());
      return Value::String(std::move(out));
    }
    ValueList out;
    for (int64_t i = 0; i < times; ++i) {
      out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
    }
    return Value::List(std::move(out));
  }

  absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
    if (a.is_undefined()) return UndefinedError(a);
    if (b.is_undefined()) return UndefinedError(b);
    auto unsupported = [&]() {
      return TypeError(absl::StrFormat("unsupported operand type(s) for %s: '%s' and '%s'", op,
                                       a.TypeName(), b.TypeName()));
    };
    if (a.is_number() && b.is_number()) {
      const bool floating = a.is_float() || b.is_float();
      if (op == "/" || (floating && op != "**")) {
        const double x = a.as_double(), y = b.as_double();
        if (op == "+") return Value::Float(x + y);
        if (op == "-") return Value::Float(x - y);
        if (op == "*") return Value::Float(x * y);
        if (y == 0.0) return TypeError("division by zero");
        if (op == "/") return Value::Float(x / y);
        if (op == "//") return Value::Float(std::floor(x / y));
        if (op == "%") {
          double m = std::fmod(x, y);
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::Float(m);
        }
      }
      if (op == "**") {
        if (floating || b.as_int() < 0) {
          return Value::Float(std::pow(a.as_double(), b.as_double()));
        }
      }
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else if (op == "//" || op == "%") {
        if (y == 0) return TypeError("integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          overflow = true;
        } else {
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            --q;
            m += y;
          }
          r = op == "//" ? q : m;
        }
      } else if (op == "**") {
        r = 1;
        for (int64_t i = 0; i < y && !overflow; ++i) overflow = __builtin_mul_overflow(r, x, &r);
        if (x == 0 || x == 1) overflow = false, r = (y == 0 || x == 1) ? 1 : 0;
      }
      if (overflow) return TypeError(absl::StrCat("integer overflow in '", op, "'"));
      return Value::Int(r);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (a.as_string().size() + b.as_string().size() > limits_.max_output_bytes) {
          return absl::ResourceExhaustedError("string exceeds the output limit");
        }
        return Value::String(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list()) {
        ValueList out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return Value::List(std::move(out));
      }
    }
    if (op == "*") {
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
        return Repeat(a, b.as_int());
      }
      if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
        return Repeat(b, a.as_int());
      }
    }
    if (op == "%" && a.is_string()) {
      return absl::UnimplementedError("printf-style string formatting ('%') is not supported");
    }
    return unsupported();
  }

  absl::StatusOr<Value> Eval(const Expr& e, Scope* scope) {
    absl::StatusOr<Value> v = EvalInner(e, scope);
    if (!v.ok()) return AtLine(v.status(), e.line);
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e, Scope* scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        std::optional<Value> v = Lookup(e.name, scope);
        if (v.has_value()) return *v;
        return Value::MakeUndefined(absl::StrCat("'", e.name, "' is undefined"));
      }
      case Expr::Kind::kList: {
        ValueList items;
        for (const ExprPtr& item : e.items) {
          CT_ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
          items.push_back(std::move(v));
        }
        return e.negated ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueMap map;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          CT_ASSIGN_OR_RETURN(Value key, Eval(*e.items[i], scope));
          if (!key.is_string()) {
            return absl::UnimplementedError("dict literal keys must be strings");
          }
          CT_ASSIGN_OR_RETURN(Value value, Eval(*e.items[i + 1], scope));
          map.Set(key.as_string(), std::move(value));
        }
        return Value::Dict(std::move(map));
      }
      case Expr::Kind::kGetAttr: {
        CT_ASSIGN_OR_RETURN(Value obj, Eval(*e.operand, scope));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        CT_ASSIGN_OR_RETURN(Value obj, Eval(*e.operand, scope));
        CT_ASSIGN_OR_RETURN(Value key, Eval(*e.items[0], scope));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        CT_ASSIGN_OR_RETURN(Value obj, Eval(*e.operand, scope));
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.items[i] != nullptr) {
            CT_ASSIGN_OR_RETURN(parts[i], Eval(*e.items[i], scope));
          }
        }
        return Slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::kCall: {
        CT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
        if (e.operand->kind == Expr::Kind::kGetAttr) {
          // obj.method(...) without building a bound method.
          CT_ASSIGN_OR_RETURN(Value obj, Eval(*e.operand->operand, scope));
          const std::string& name = e.operand->name;
          if ((obj.is_string() && IsStringMethod(name)) || (obj.is_dict() && IsDictMethod(name)) ||
              (obj.is_list() && IsListMethod(name))) {
            return CallMethod(obj, name, args);
          }
          CT_ASSIGN_OR_RETURN(Value callee, GetAttr(obj, name));
          return CallValue(callee, args);
        }
        CT_ASSIGN_OR_RETURN(Value callee, Eval(*e.operand, scope));
        return CallValue(callee, args);
      }
      case Expr::Kind::kFilter: {
        CT_ASSIGN_OR_RETURN(Value v, Eval(*e.operand, scope));
        CT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
        return ApplyFilter(e.name, v, args);
      }
      case Expr::Kind::kTest: {
        CT_ASSIGN_OR_RETURN(Value v, Eval(*e.operand, scope));
        CT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
        CT_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, v, args));
        return Value::Bool(r != e.negated);
      }
      case Expr::Kind::kNot: {
        CT_ASSIGN_OR_RETURN(Value v, Eval(*e.operand, scope));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        CT_ASSIGN_OR_RETURN(Value v, Eval(*e.operand, scope));
        if (v.is_undefined()) return UndefinedError(v);
        if (!v.is_number()) {
          return TypeError(absl::StrCat("bad operand type for unary ",
                                        e.kind == Expr::Kind::kNeg ? "-" : "+", ": '", v.TypeName(),
                                        "'"));
        }
        if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value::Int(v.as_int()) : v;
        if (v.is_float()) return Value::Float(-v.as_double());
        if (v.as_int() == std::numeric_limits<int64_t>::min()) return TypeError("integer overflow");
        return Value::Int(-v.as_int());
      }
      case Expr::Kind::kBinary: {
        CT_ASSIGN_OR_RETURN(Value a, Eval(*e.items[0], scope));
        if (e.name == "and") {
          if (!a.Truthy()) return a;
          return Eval(*e.items[1], scope);
        }
        if (e.name == "or") {
          if (a.Truthy()) return a;
          return Eval(*e.items[1], scope);
        }
        CT_ASSIGN_OR_RETURN(Value b, Eval(*e.items[1], scope));
        if (e.name == "~") {
          std::string s = ToPyStr(a);
          s += ToPyStr(b);
          if (s.size() > limits_.max_output_bytes) {
            return absl::ResourceExhaustedError("string exceeds the output limit");
          }
          return Value::String(std::move(s));
        }
        return Arithmetic(e.name, a, b);
      }
      case Expr::Kind::kCompare: {
        CT_ASSIGN_OR_RETURN(Value left, Eval(*e.items[0], scope));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          CT_ASSIGN_OR_RETURN(Value right, Eval(*e.items[i + 1], scope));
          const std::string& op = e.ops[i];
          bool r;
          if (op == "==") {
            r = Equals(left, right);
          } else if (op == "!=") {
            r = !Equals(left, right);
          } else if (op == "in" || op == "notin") {
            CT_ASSIGN_OR_RETURN(r, Contains(right, left));
            if (op == "notin") r = !r;
          } else {
            CT_ASSIGN_OR_RETURN(int c, Compare(left, right));
            r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCondExpr: {
        CT_ASSIGN_OR_RETURN(Value cond, Eval(*e.items[1], scope));
        if (cond.Truthy()) return Eval(*e.items[0], scope);
        if (e.items[2] == nullptr) {
          return Value::MakeUndefined(
              "the inline if-expression evaluated to false and no else "
              "section was defined");
        }
        return Eval(*e.items[2], scope);
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> CallValue(const Value& callee, CallArgs& args) {
    if (callee.is_undefined()) return UndefinedError(callee);
    if (!callee.is_callable()) {
      return TypeError(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
    }
    return callee.as_callable().fn(args);
  }

  const ValueMap& context_;
  RenderLimits limits_;
  ValueMap globals_;
  Scope* root_ = nullptr;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace

bool IsKnownFilter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

absl::StatusOr<std::string> RenderTemplate(const Body& body, const ValueMap& context,
                                           const RenderLimits& limits) {
  Renderer renderer(context, limits);
  return renderer.Run(body);
}

}  // namespace tandem::chat_template
