// The parsed form of a template: expressions and statements. Part of the Jinja engine, lib/jinja/.
#ifndef TANDEM_LIB_JINJA_TEMPLATE_AST_H_
#define TANDEM_LIB_JINJA_TEMPLATE_AST_H_

#include <memory>
#include <string>
#include <vector>

#include "lib/jinja/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// A call argument; `name` is empty for positional ones.
struct Arg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // items; a tuple when `negated` (only printing differs)
    kDict,      // items: key, value, key, value, ...
    kGetAttr,   // operand.name
    kGetItem,   // operand[items[0]]
    kSlice,     // operand[items[0]:items[1]:items[2]], null parts omitted
    kCall,      // operand(args)
    kFilter,    // operand | name(args)
    kTest,      // operand is [not] name(args); `negated`
    kNot,       // not operand
    kNeg,       // -operand
    kPos,       // +operand
    kBinary,    // items[0] op items[1]: + - * / // % ** ~ and or
    kCompare,   // items[0] ops[0] items[1] ops[1] items[2] ...: == != < > <= >= in notin
    kCondExpr,  // items[0] if items[1] else items[2] (items[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;  // name, attribute, filter, test or operator
  std::vector<std::string> ops;
  bool negated = false;
  ExprPtr operand;
  std::vector<ExprPtr> items;
  std::vector<Arg> args;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct IfBranch {
  ExprPtr condition;
  Body body;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: none
};

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches, else_body
    kFor,       // targets in expr [if condition]: body, else_body
    kSet,       // targets = expr, or attr_target.attribute = expr
    kSetBlock,  // {% set targets[0] %}body{% endset %}
    kBreak,
    kContinue,
    kMacro,  // name(params): body
    kScope,  // body in a new scope: {% with %}, {% generation %}
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attr_target;  // {% set ns.attr = ... %}: "ns"; attribute in `targets[0]`
  std::vector<IfBranch> branches;
  Body body;
  Body else_body;
  std::string name;
  std::vector<MacroParam> params;
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // {% with a = 1 %}
};

}  // namespace tandem::jinja

#endif  // TANDEM_LIB_JINJA_TEMPLATE_AST_H_
