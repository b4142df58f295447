#include "lib/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::jinja {

const Value* ValueMap::Find(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* ValueMap::Find(std::string_view key) {
  for (auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueMap::Set(std::string key, Value value) {
  if (Value* existing = Find(key)) {
    *existing = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

void ValueMap::AddNew(std::string key, Value value) {
  entries_.emplace_back(std::move(key), std::move(value));
}

size_t ValueMap::size() const { return entries_.size(); }

namespace {

template <typename Json>
Value FromJsonImpl(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      // Python ints are unbounded; past int64 the nearest double is the best this model holds.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::String(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(FromJsonImpl(item));
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      ValueMap map;
      for (auto it = j.begin(); it != j.end(); ++it) {
        map.AddNew(it.key(), FromJsonImpl(it.value()));  // JSON keys are unique
      }
      return Value::Dict(std::move(map));
    }
    default:  // binary, discarded
      return Value::None();
  }
}

// Decodes one UTF-8 sequence at s[i]; invalid bytes decode as themselves so that nothing is lost.
uint32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) n = 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
  }
  *len = n;
  if (n == 1) return c < 0x80 ? c : 0xFFFD;  // a stray byte is never whitespace
  uint32_t cp = c & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void AppendPyStringRepr(std::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out->push_back(quote);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out->push_back('\\');
      out->push_back(ch);
    } else if (ch == '\n') {
      out->append("\\n");
    } else if (ch == '\r') {
      out->append("\\r");
    } else if (ch == '\t') {
      out->append("\\t");
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppendFormat(out, "\\x%02x", c);
    } else {
      out->push_back(ch);
    }
  }
  out->push_back(quote);
}

void AppendRepr(const Value& v, std::string* out);

void AppendStr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return;
    case Value::Kind::kString:
      out->append(v.as_string());
      return;
    default:
      AppendRepr(v, out);
  }
}

void AppendRepr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      out->append("Undefined");
      return;
    case Value::Kind::kNone:
      out->append("None");
      return;
    case Value::Kind::kBool:
      out->append(v.as_bool() ? "True" : "False");
      return;
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return;
    case Value::Kind::kFloat:
      out->append(FormatPyFloat(v.as_double()));
      return;
    case Value::Kind::kString:
      AppendPyStringRepr(v.as_string(), out);
      return;
    case Value::Kind::kList: {
      out->push_back(v.is_tuple() ? '(' : '[');
      bool first = true;
      for (const Value& item : v.as_list()) {
        if (!first) out->append(", ");
        first = false;
        AppendRepr(item, out);
      }
      if (v.is_tuple() && v.as_list().size() == 1) out->push_back(',');
      out->push_back(v.is_tuple() ? ')' : ']');
      return;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      const ValueMap& map = v.is_dict() ? v.as_dict() : v.as_namespace().attrs;
      if (v.is_namespace()) out->append("<Namespace ");
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : map.entries()) {
        if (!first) out->append(", ");
        first = false;
        AppendPyStringRepr(key, out);
        out->append(": ");
        AppendRepr(item, out);
      }
      out->push_back('}');
      if (v.is_namespace()) out->push_back('>');
      return;
    }
    case Value::Kind::kCallable:
      absl::StrAppend(out, "<function ", v.as_callable().name, ">");
      return;
  }
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else if (c >= 0x80 && ensure_ascii) {
          size_t len = 0;
          uint32_t cp = DecodeAt(s, i, &len);
          if (cp >= 0x10000) {
            cp -= 0x10000;
            absl::StrAppendFormat(out, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                                  0xDC00 + (cp & 0x3FF));
          } else {
            absl::StrAppendFormat(out, "\\u%04x", cp);
          }
          i += len;
          continue;
        } else {
          out->push_back(ch);
        }
    }
    ++i;
  }
  out->push_back('"');
}

absl::Status AppendJson(const Value& v, const JsonOptions& options, int depth, std::string* out) {
  if (depth > 512) return absl::InvalidArgumentError("tojson: value nested too deeply");
  const bool pretty = options.indent >= 0 || !options.indent_string.empty();
  std::string item_sep = options.custom_item_separator ? options.item_separator
                         : pretty                      ? ","
                                                       : ", ";
  auto newline = [&](int level) {
    if (!pretty) return;
    out->push_back('\n');
    for (int i = 0; i < level; ++i) {
      if (!options.indent_string.empty()) {
        out->append(options.indent_string);
      } else {
        out->append(static_cast<size_t>(options.indent), ' ');
      }
    }
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out->append("NaN");
      } else if (std::isinf(d)) {
        out->append(d > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(FormatPyFloat(d));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), options.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const ValueList& items = v.as_list();
      if (items.empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(item_sep);
        newline(depth + 1);
        absl::Status s = AppendJson(items[i], options, depth + 1, out);
        if (!s.ok()) return s;
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.as_dict().entries()) entries.push_back(&entry);
      if (entries.empty()) {
        out->append("{}");
        return absl::OkStatus();
      }
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out->append(item_sep);
        newline(depth + 1);
        AppendJsonString(entries[i]->first, options.ensure_ascii, out);
        out->append(options.key_separator);
        absl::Status s = AppendJson(entries[i]->second, options, depth + 1, out);
        if (!s.ok()) return s;
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError(
          v.undefined_hint().empty()
              ? "tojson: Object of type Undefined is not JSON serializable"
              : absl::StrCat("tojson: ", v.undefined_hint(), " is undefined"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

Value Value::FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }
Value Value::FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_double() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().empty();
    case Kind::kDict:
      return as_dict().size() != 0;
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string ToPyStr(const Value& v) {
  if (v.is_string()) return v.as_string();
  std::string out;
  AppendStr(v, &out);
  return out;
}

std::string ToPyRepr(const Value& v) {
  std::string out;
  AppendRepr(v, &out);
  return out;
}

std::string FormatPyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, as Python's repr(); formatted below with Python's rules.
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, end - buf);
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exponent + 1;  // digits are 0.DIGITS * 10^decpt
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    absl::StrAppendFormat(&out, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (decpt <= 0) {
    absl::StrAppend(&out, "0.", std::string(-decpt, '0'), digits);
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    absl::StrAppend(&out, digits, std::string(decpt - digits.size(), '0'), ".0");
  } else {
    absl::StrAppend(&out, digits.substr(0, decpt), ".", digits.substr(decpt));
  }
  return out;
}

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  absl::Status s = AppendJson(v, options, 0, &out);
  if (!s.ok()) return s;
  return out;
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind() || a.is_tuple() != b.is_tuple()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const ValueList& x = a.as_list();
      const ValueList& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const ValueMap& x = a.as_dict();
      const ValueMap& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.as_namespace() == &b.as_namespace();
    case Value::Kind::kCallable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // Byte order of UTF-8 is code point order, which is Python's.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const ValueList& x = a.as_list();
    const ValueList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    return absl::InvalidArgumentError(
        absl::StrCat(u.undefined_hint().empty() ? "value" : u.undefined_hint(), " is undefined"));
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

std::vector<std::string_view> SplitCodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    DecodeAt(s, i, &len);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    DecodeAt(s, i, &len);
    i += len;
    ++n;
  }
  return n;
}

bool IsPyWhitespace(std::string_view code_point) {
  if (code_point.empty()) return false;
  size_t len = 0;
  const uint32_t cp = DecodeAt(code_point, 0, &len);
  switch (cp) {
    case ' ':
    case '\t':
    case '\n':
    case '\v':
    case '\f':
    case '\r':
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace tandem::jinja
