// Values of the chat-template interpreter: the data model of Python as Jinja2 templates see it
// (None, bool, int, float, str, list, dict, jinja2's Namespace and Undefined, callables).
// Part of the Jinja engine, lib/jinja/.
#ifndef TANDEM_LIB_JINJA_VALUE_H_
#define TANDEM_LIB_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

class Value;
using ValueList = std::vector<Value>;

// A str-keyed dict that keeps insertion order, as Python dicts do: `tools | tojson` must print
// keys in the order the client sent them. Lookups are linear; template dicts are small.
class ValueMap {
 public:
  const Value* Find(std::string_view key) const;
  Value* Find(std::string_view key);
  void Set(std::string key, Value value);
  // Adds `key`, which the caller knows is not in the map (a JSON object's keys are unique),
  // without Set's search: building a dict of n keys stays linear.
  void AddNew(std::string key, Value value);
  size_t size() const;
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
};

// Arguments of a call: positional ones, then keyword ones in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFunction = std::function<absl::StatusOr<Value>(CallArgs& args)>;

struct Callable {
  std::string name;
  NativeFunction fn;
};

// jinja2's Undefined; `hint` names what was missing, for error messages.
struct Undefined {
  std::string hint;
};

// jinja2's namespace(): the one mutable object templates can create (`{% set ns.x = 1 %}`).
struct Namespace {
  ValueMap attrs;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() : data_(Undefined{}) {}
  static Value MakeUndefined(std::string hint) {
    return Value(std::in_place, Undefined{std::move(hint)});
  }
  static Value None() { return Value(std::in_place, nullptr); }
  static Value Bool(bool b) { return Value(std::in_place, b); }
  static Value Int(int64_t i) { return Value(std::in_place, i); }
  static Value Float(double d) { return Value(std::in_place, d); }
  static Value String(std::string s) { return Value(std::in_place, std::move(s)); }
  static Value List(ValueList items) {
    return Value(std::in_place, std::make_shared<const ValueList>(std::move(items)));
  }
  // A list that prints as a Python tuple: (1, 2). Otherwise it behaves as a list.
  static Value Tuple(ValueList items) {
    Value v = List(std::move(items));
    v.tuple_ = true;
    return v;
  }
  static Value Dict(ValueMap map) {
    return Value(std::in_place, std::make_shared<const ValueMap>(std::move(map)));
  }
  static Value MakeNamespace(ValueMap attrs) {
    return Value(std::in_place, std::make_shared<Namespace>(Namespace{std::move(attrs)}));
  }
  static Value Function(std::string name, NativeFunction fn) {
    return Value(std::in_place,
                 std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)}));
  }
  static Value FromJson(const nlohmann::json& j);
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // Python's numbers include bool.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_tuple() const { return tuple_; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  // bool and int as an integer (Python's True + 1 == 2).
  int64_t as_int() const {
    return is_bool() ? static_cast<int64_t>(as_bool()) : std::get<int64_t>(data_);
  }
  // Any number as a double.
  double as_double() const { return is_float() ? std::get<double>(data_) : as_int(); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const ValueList& as_list() const { return *std::get<std::shared_ptr<const ValueList>>(data_); }
  const ValueMap& as_dict() const { return *std::get<std::shared_ptr<const ValueMap>>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(data_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }

  // Python's bool(x); Undefined is falsy.
  bool Truthy() const;
  // Python's type name, for error messages ("str", "list", "NoneType", ...).
  std::string TypeName() const;

 private:
  using Data = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
                            std::shared_ptr<const ValueList>, std::shared_ptr<const ValueMap>,
                            std::shared_ptr<Namespace>, std::shared_ptr<const Callable>>;
  // Tagged so that it never competes with the copy and move constructors.
  template <typename T>
  Value(std::in_place_t, T&& v) : data_(std::in_place_type<std::decay_t<T>>, std::forward<T>(v)) {}

  Data data_;
  bool tuple_ = false;
};

// Python's str(x), which is what `{{ x }}` prints (Undefined prints as "").
std::string ToPyStr(const Value& v);
// Python's repr(x).
std::string ToPyRepr(const Value& v);
// Python's repr() of a float: shortest round-trip digits, "1.0", "1e-05", "1e+16".
std::string FormatPyFloat(double d);

struct JsonOptions {
  int indent = -1;            // < 0: single line
  std::string indent_string;  // used when set (tojson(indent='\t'))
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_separator;  // defaults as json.dumps: ", " or "," with indent
  std::string key_separator = ": ";
  bool custom_item_separator = false;
};
// Python's json.dumps(x, ...) with the given options; fails on values JSON cannot hold.
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// Python's ==.
bool Equals(const Value& a, const Value& b);
// Python's ordering (<): -1, 0 or 1, or an error for types that do not order.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// UTF-8 helpers: Python strings index by code point.
std::vector<std::string_view> SplitCodePoints(std::string_view s);
size_t CodePointCount(std::string_view s);
// Python's str.isspace() for one code point given as UTF-8.
bool IsPyWhitespace(std::string_view code_point);

}  // namespace tandem::jinja

#endif  // TANDEM_LIB_JINJA_VALUE_H_
