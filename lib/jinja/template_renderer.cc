#include "lib/jinja/template_renderer.h"

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
namespace render {

absl::StatusOr<std::string> Renderer::Run(const Body& body) {
  std::string out;
  Scope root{{}, nullptr};
  root_ = &root;
  CT_ASSIGN_OR_RETURN(Flow flow, ExecBody(body, &root, &out));
  (void)flow;
  return out;
}

absl::Status Renderer::AtLine(const absl::Status& s, int line) {
  if (s.ok() || s.message().rfind("line ", 0) == 0 ||
      s.GetPayload(kRaisedByTemplatePayload).has_value()) {
    return s;
  }
  return absl::Status(s.code(), absl::StrFormat("line %d: %s", line, s.message()));
}

void Renderer::InstallGlobals() {
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

absl::StatusOr<Value> Renderer::Range(const CallArgs& args) {
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

absl::Status Renderer::Append(std::string* out, std::string_view text) {
  if (out->size() + text.size() > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "chat template output exceeds the limit of %d bytes", limits_.max_output_bytes));
  }
  out->append(text);
  return absl::OkStatus();
}

std::optional<Value> Renderer::Lookup(const std::string& name, const Scope* scope) const {
  for (const Scope* s = scope; s != nullptr; s = s->parent) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (const Value* v = context_.Find(name)) return *v;
  if (const Value* v = globals_.Find(name)) return *v;
  return std::nullopt;
}

absl::StatusOr<Renderer::Flow> Renderer::ExecBody(const Body& body, Scope* scope,
                                                  std::string* out) {
  for (const NodePtr& node : body) {
    absl::StatusOr<Flow> flow = Exec(*node, scope, out);
    if (!flow.ok()) return AtLine(flow.status(), node->line);
    if (*flow != Flow::kNormal) return *flow;
  }
  return Flow::kNormal;
}

absl::Status Renderer::Assign(const std::vector<std::string>& targets, Value value, Scope* scope) {
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

absl::StatusOr<Renderer::Flow> Renderer::Exec(const Node& node, Scope* scope, std::string* out) {
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

absl::StatusOr<Renderer::Flow> Renderer::ExecFor(const Node& node, Scope* scope, std::string* out) {
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
    loop.Set("previtem", i > 0 ? items[i - 1] : Value::MakeUndefined("there is no previous item"));
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

Value Renderer::MakeMacro(const Node& node) {
  const Node* macro = &node;
  return Value::Function(node.name, [this, macro](CallArgs& args) -> absl::StatusOr<Value> {
    if (call_depth_ >= limits_.max_call_depth) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "chat template exceeds the limit of %d nested macro calls", limits_.max_call_depth));
    }
    if (args.positional.size() > macro->params.size()) {
      return TypeError(absl::StrFormat("macro '%s' takes not more than %d argument(s)", macro->name,
                                       macro->params.size()));
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

absl::StatusOr<CallArgs> Renderer::EvalArgs(const std::vector<Arg>& args, Scope* scope) {
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

bool Renderer::IsListMethod(std::string_view name) { return name == "count" || name == "index"; }

absl::StatusOr<Value> Renderer::GetAttr(const Value& obj, const std::string& name) {
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

absl::StatusOr<Value> Renderer::GetItem(const Value& obj, const Value& key) {
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

absl::StatusOr<Value> Renderer::Slice(const Value& obj, const Value& start_v, const Value& stop_v,
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

absl::StatusOr<Value> Renderer::SortKey(const Value& item, const std::optional<Value>& attribute,
                                        bool case_sensitive) {
  Value key = item;
  if (attribute.has_value() && !attribute->is_none()) {
    CT_ASSIGN_OR_RETURN(key, GetPath(item, *attribute));
  }
  if (!case_sensitive && key.is_string()) key = Value::String(AsciiLower(key.as_string()));
  return key;
}

absl::StatusOr<Value> Renderer::Repeat(const Value& seq, int64_t times) {
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

absl::StatusOr<Value> Renderer::Arithmetic(const std::string& op, const Value& a, const Value& b) {
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

absl::StatusOr<Value> Renderer::Eval(const Expr& e, Scope* scope) {
  absl::StatusOr<Value> v = EvalInner(e, scope);
  if (!v.ok()) return AtLine(v.status(), e.line);
  return v;
}

absl::StatusOr<Value> Renderer::EvalInner(const Expr& e, Scope* scope) {
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

absl::StatusOr<Value> Renderer::CallValue(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_callable()) {
    return TypeError(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
  }
  return callee.as_callable().fn(args);
}

}  // namespace render

absl::StatusOr<std::string> RenderTemplate(const Body& body, const ValueMap& context,
                                           const RenderLimits& limits) {
  render::Renderer renderer(context, limits);
  return renderer.Run(body);
}

}  // namespace tandem::jinja
