// The Renderer's filters, tests and methods of values (template_render_internal.h).
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

namespace tandem::jinja {
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

}  // namespace

bool IsKnownFilter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

namespace render {

bool Renderer::IsStringMethod(std::string_view name) {
  static constexpr std::string_view kMethods[] = {
      "startswith", "endswith", "split",   "rsplit",     "strip",      "lstrip", "rstrip",
      "upper",      "lower",    "title",   "capitalize", "replace",    "find",   "count",
      "join",       "isdigit",  "isalpha", "isspace",    "splitlines", "format"};
  return std::find(std::begin(kMethods), std::end(kMethods), name) != std::end(kMethods);
}

bool Renderer::IsDictMethod(std::string_view name) {
  return name == "get" || name == "items" || name == "keys" || name == "values";
}

Value Renderer::BoundMethod(const Value& obj, const std::string& name) {
  return Value::Function(name,
                         [this, obj, name](CallArgs& args) { return CallMethod(obj, name, args); });
}

absl::StatusOr<Value> Renderer::CallMethod(const Value& obj, const std::string& name,
                                           CallArgs& args) {
  if (obj.is_dict()) return CallDictMethod(obj.as_dict(), name, args);
  if (obj.is_list() && (name == "count" || name == "index")) {
    return CallListMethod(obj.as_list(), name, args);
  }
  if (!obj.is_string()) {
    return TypeError(absl::StrCat("'", obj.TypeName(), "' object has no method '", name, "'"));
  }
  return CallStringMethod(obj, name, args);
}

absl::StatusOr<Value> Renderer::CallStringMethod(const Value& obj, const std::string& name,
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
  return absl::UnimplementedError(absl::StrCat("the string method '", name, "' is not supported"));
}

absl::StatusOr<Value> Renderer::GetPath(const Value& item, const Value& path) {
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

absl::StatusOr<Value> Renderer::SelectFilter(const std::string& name, const Value& seq,
                                             CallArgs& args) {
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

absl::StatusOr<Value> Renderer::ApplyFilter(const std::string& name, const Value& v,
                                            CallArgs& args) {
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
  if ((name == "int" || name == "float" || name == "abs" || name == "round") && v.is_undefined()) {
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

absl::StatusOr<Value> Renderer::JoinFilter(const Value& v, const CallArgs& args) {
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

absl::StatusOr<Value> Renderer::DictSortFilter(const Value& v, const CallArgs& args) {
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

absl::StatusOr<Value> Renderer::ReplaceFilter(const Value& v, const CallArgs& args) {
  CT_ASSIGN_OR_RETURN(auto a, BindArgs("replace", args, {"old", "new", "count"}));
  if (!a[0].has_value() || !a[1].has_value()) return TypeError("replace() needs old and new");
  const int64_t count = a[2].has_value() && a[2]->is_int() ? a[2]->as_int() : -1;
  std::string out = PyReplace(ToPyStr(v), ToPyStr(*a[0]), ToPyStr(*a[1]), count);
  if (out.size() > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError("replace: result exceeds the output limit");
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Renderer::IndentFilter(const Value& v, const CallArgs& args) {
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

absl::StatusOr<Value> Renderer::MapFilter(const Value& v, const CallArgs& args) {
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

absl::StatusOr<Value> Renderer::SortFilter(const std::string& name, const Value& v,
                                           const CallArgs& args) {
  const bool is_sort = name == "sort";
  CT_ASSIGN_OR_RETURN(auto a, is_sort
                                  ? BindArgs(name, args, {"reverse", "case_sensitive", "attribute"})
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

absl::StatusOr<Value> Renderer::SumFilter(const Value& v, const CallArgs& args) {
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
absl::Status Renderer::SortValues(ValueList* items, bool reverse, KeyFn key_fn) {
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

absl::StatusOr<bool> Renderer::ApplyTest(const std::string& name, const Value& v,
                                         const CallArgs& args) {
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

}  // namespace render
}  // namespace tandem::jinja
