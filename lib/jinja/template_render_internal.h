// The template renderer's parts (template_renderer.h), shared by the files that define them:
// Python's built-in types and jinja2's simple filters (template_builtins.cc), and the Renderer,
// whose statements and expressions are in template_renderer.cc and whose filters, tests and
// methods are in template_filters.cc. Internal to lib/jinja/.
#ifndef TANDEM_LIB_JINJA_TEMPLATE_RENDER_INTERNAL_H_
#define TANDEM_LIB_JINJA_TEMPLATE_RENDER_INTERNAL_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/jinja/template_ast.h"
#include "lib/jinja/template_renderer.h"
#include "lib/jinja/value.h"

namespace tandem::jinja::render {

absl::Status TypeError(const std::string& message);

absl::Status UndefinedError(const Value& v);

// Binds call arguments to a Python-style parameter list; missing ones stay empty.
absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    const std::string& function, const CallArgs& args,
    std::initializer_list<std::string_view> params);

// Python's index normalization for x[i]; false when out of range.
bool NormalizeIndex(int64_t* i, size_t size);

std::string AsciiLower(std::string s);

std::string AsciiUpper(std::string s);

// Python's str.strip family. `chars` empty: whitespace.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);

// Python's str.split / str.rsplit.
absl::StatusOr<ValueList> PySplit(std::string_view s, const std::optional<Value>& sep_arg,
                                  int64_t maxsplit, bool from_right);

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count);

// Items a for loop, `list` or `join` sees: a list's items, a dict's keys, a string's characters.
absl::StatusOr<ValueList> Iterate(const Value& v);

absl::StatusOr<int64_t> Length(const Value& v);

absl::StatusOr<bool> Contains(const Value& container, const Value& item);

std::string HtmlEscape(std::string_view s);

// Python's round(x, ndigits) for floats: correctly rounded, ties to even, which is what printf
// does with the exact binary value.
double PyRound(double x, int64_t ndigits);

// dict.get/keys/values/items.
absl::StatusOr<Value> CallDictMethod(const ValueMap& map, const std::string& name,
                                     const CallArgs& args);

// list.count and list.index.
absl::StatusOr<Value> CallListMethod(const ValueList& list, const std::string& name,
                                     const CallArgs& args);

// str.startswith and str.endswith, with one prefix or a tuple of them.
absl::StatusOr<Value> StrStartsOrEndsWith(const std::string& s, const std::string& name,
                                          const CallArgs& args);

// str.find and str.count, in code points.
absl::StatusOr<Value> StrFindOrCount(const std::string& s, const std::string& name,
                                     const CallArgs& args);

// str.join: `s` between the items of an iterable of strings.
absl::StatusOr<Value> StrJoin(const std::string& s, const std::string& name, const CallArgs& args);

// str.isdigit, str.isalpha and str.isspace.
Value StrIsClass(const std::string& s, const std::string& name);

// str.splitlines, splitting at "\n", "\r" and "\r\n".
Value StrSplitLines(const std::string& s);

// The `title` filter.
Value TitleFilter(const Value& v);

// The `tojson` filter.
absl::StatusOr<Value> ToJsonFilter(const Value& v, const CallArgs& args);

// The `first` and `last` filters.
absl::StatusOr<Value> FirstOrLastFilter(const std::string& name, const Value& v);

// The `reverse` filter: a string's code points or an iterable's items, reversed.
absl::StatusOr<Value> ReverseFilter(const Value& v);

// The `int` filter; `v` is not undefined.
absl::StatusOr<Value> IntFilter(const Value& v, const CallArgs& args);

// The `float` filter; `v` is not undefined.
absl::StatusOr<Value> FloatFilter(const Value& v, const CallArgs& args);

// The `abs` filter; `v` is not undefined.
absl::StatusOr<Value> AbsFilter(const Value& v);

// The `round` filter (methods common, ceil and floor); `v` is not undefined.
absl::StatusOr<Value> RoundFilter(const Value& v, const CallArgs& args);

// One render of a template: its scopes, globals, limits and output.
class Renderer {
 public:
  Renderer(const ValueMap& context, const RenderLimits& limits)
      : context_(context), limits_(limits) {
    InstallGlobals();
  }

  absl::StatusOr<std::string> Run(const Body& body);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  struct Scope {
    std::unordered_map<std::string, Value> vars;
    Scope* parent;
  };

  // Adds the line to an error from a node, once.
  static absl::Status AtLine(const absl::Status& s, int line);

  void InstallGlobals();

  absl::StatusOr<Value> Range(const CallArgs& args);

  absl::Status Append(std::string* out, std::string_view text);

  std::optional<Value> Lookup(const std::string& name, const Scope* scope) const;

  absl::StatusOr<Flow> ExecBody(const Body& body, Scope* scope, std::string* out);

  absl::Status Assign(const std::vector<std::string>& targets, Value value, Scope* scope);

  absl::StatusOr<Flow> Exec(const Node& node, Scope* scope, std::string* out);

  absl::StatusOr<Flow> ExecFor(const Node& node, Scope* scope, std::string* out);

  Value MakeMacro(const Node& node);

  absl::StatusOr<CallArgs> EvalArgs(const std::vector<Arg>& args, Scope* scope);

  static bool IsStringMethod(std::string_view name);
  static bool IsListMethod(std::string_view name);
  static bool IsDictMethod(std::string_view name);

  Value BoundMethod(const Value& obj, const std::string& name);

  // x.name: Python attribute first (methods), then the item, as jinja2's sandbox does.
  absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);

  // x[key]: the item first, then the attribute.
  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);

  absl::StatusOr<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v,
                              const Value& step_v);

  absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, CallArgs& args);

  // The str methods templates use; `obj` is a string.
  absl::StatusOr<Value> CallStringMethod(const Value& obj, const std::string& name, CallArgs& args);

  // The attribute (or dotted path, or integer index) a filter like `map(attribute=...)` reads.
  absl::StatusOr<Value> GetPath(const Value& item, const Value& path);

  // select/reject/selectattr/rejectattr.
  absl::StatusOr<Value> SelectFilter(const std::string& name, const Value& seq, CallArgs& args);

  absl::StatusOr<Value> SortKey(const Value& item, const std::optional<Value>& attribute,
                                bool case_sensitive);

  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs& args);

  // The `join` filter, optionally of one attribute of each item.
  absl::StatusOr<Value> JoinFilter(const Value& v, const CallArgs& args);

  // The `dictsort` filter: a mapping's (key, value) pairs sorted by key or by value.
  absl::StatusOr<Value> DictSortFilter(const Value& v, const CallArgs& args);

  // The `replace` filter.
  absl::StatusOr<Value> ReplaceFilter(const Value& v, const CallArgs& args);

  // The `indent` filter: pads every line but the first (and, with first=true, that one too).
  absl::StatusOr<Value> IndentFilter(const Value& v, const CallArgs& args);

  // The `map` filter: another filter, or an attribute, applied to every item.
  absl::StatusOr<Value> MapFilter(const Value& v, const CallArgs& args);

  // The `sort`, `unique`, `min` and `max` filters.
  absl::StatusOr<Value> SortFilter(const std::string& name, const Value& v, const CallArgs& args);

  // The `sum` filter, optionally of one attribute of each item.
  absl::StatusOr<Value> SumFilter(const Value& v, const CallArgs& args);

  template <typename KeyFn>
  absl::Status SortValues(ValueList* items, bool reverse, KeyFn key_fn);

  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const CallArgs& args);

  absl::StatusOr<Value> Repeat(const Value& seq, int64_t times);

  absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b);

  absl::StatusOr<Value> Eval(const Expr& e, Scope* scope);

  absl::StatusOr<Value> EvalInner(const Expr& e, Scope* scope);

  absl::StatusOr<Value> CallValue(const Value& callee, CallArgs& args);

  const ValueMap& context_;
  RenderLimits limits_;
  ValueMap globals_;
  Scope* root_ = nullptr;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace tandem::jinja::render

#endif  // TANDEM_LIB_JINJA_TEMPLATE_RENDER_INTERNAL_H_
