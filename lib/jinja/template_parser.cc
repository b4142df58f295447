#include "lib/jinja/template_parser.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/jinja/status_macros.h"
#include "lib/jinja/template_lexer.h"
#include "lib/jinja/template_renderer.h"

namespace tandem::jinja {
namespace {

class Parser : public TokenStream {
 public:
  Parser(std::vector<Token> tokens, const ParseOptions& options)
      : TokenStream(std::move(tokens)), options_(options) {}

  absl::StatusOr<Body> ParseAll() {
    std::string end;
    CT_ASSIGN_OR_RETURN(Body body, Subparse({}, &end));
    return body;
  }

 private:
  // Guards recursion depth for nested expressions and statements.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* p) : p_(p) { ++p_->depth_; }
    ~DepthGuard() { --p_->depth_; }
    bool exceeded() const { return p_->depth_ > p_->options_.max_nesting; }

   private:
    Parser* p_;
  };

  // Counts the links of a left-nested chain (a + b + c, x.a[0](), x | f | g): each link makes
  // the tree one level deeper, as a nested expression does, until the chain's function returns.
  // Without it a long chain built a tree whose recursive rendering and destruction overflowed
  // the stack (found by chat_template_fuzzer).
  class ChainGuard {
   public:
    explicit ChainGuard(Parser* p) : p_(p) {}
    ~ChainGuard() { p_->depth_ -= links_; }
    bool Link() {
      ++links_;
      ++p_->depth_;
      return p_->depth_ <= p_->options_.max_nesting;
    }

   private:
    Parser* p_;
    int links_ = 0;
  };

  // Parses statements until a block tag whose name is in `end_tags` (left unconsumed after the
  // `{%`; its name is stored in *end) or, with no end tags, the end of the template.
  absl::StatusOr<Body> Subparse(const std::vector<std::string_view>& end_tags, std::string* end) {
    DepthGuard guard(this);
    if (guard.exceeded()) return Error("statements nested too deeply");
    Body body;
    const int start_line = Cur().line;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case Token::Type::kData: {
          auto node = std::make_unique<Node>();
          node->kind = Node::Kind::kText;
          node->line = t.line;
          node->text = t.text;
          body.push_back(std::move(node));
          Next();
          break;
        }
        case Token::Type::kVarBegin: {
          Next();
          auto node = std::make_unique<Node>();
          node->kind = Node::Kind::kOutput;
          node->line = Cur().line;
          CT_ASSIGN_OR_RETURN(node->expr, ParseTuple(/*with_condexpr=*/true));
          if (Cur().type != Token::Type::kVarEnd) return Unexpected("end of print statement '}}'");
          Next();
          body.push_back(std::move(node));
          break;
        }
        case Token::Type::kBlockBegin: {
          Next();
          if (Cur().type == Token::Type::kName) {
            for (std::string_view tag : end_tags) {
              if (Cur().text == tag) {
                *end = Cur().text;
                return body;
              }
            }
          }
          CT_ASSIGN_OR_RETURN(NodePtr node, ParseStatement());
          if (node != nullptr) body.push_back(std::move(node));
          break;
        }
        case Token::Type::kEof:
          if (!end_tags.empty()) {
            std::string_view closer = end_tags.back();
            for (std::string_view tag : end_tags) {
              if (tag.substr(0, 3) == "end") closer = tag;
            }
            return absl::InvalidArgumentError(absl::StrFormat(
                "line %d: unexpected end of template: the block opened at line %d needs "
                "'{%% %s %%}'",
                t.line, start_line, std::string(closer)));
          }
          return body;
        default:
          return Unexpected("template text or a tag");
      }
    }
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    if (Cur().type != Token::Type::kName) return Unexpected("a statement name");
    const std::string tag = Cur().text;
    const int line = Cur().line;
    auto node = std::make_unique<Node>();
    node->line = line;
    Next();
    if (tag == "if") return ParseIf(std::move(node));
    if (tag == "for") return ParseFor(std::move(node), line);
    if (tag == "set") return ParseSet(std::move(node), line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("line %d: '%s' outside a loop", line, tag));
      }
      node->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      CT_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (tag == "macro") return ParseMacro(std::move(node));
    if (tag == "with") return ParseWith(std::move(node));
    if (tag == "generation") {
      // Hugging Face's AssistantTracker extension marks assistant text for training masks; for
      // rendering it is transparent.
      node->kind = Node::Kind::kScope;
      CT_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      CT_ASSIGN_OR_RETURN(node->body, Subparse({"endgeneration"}, &end));
      Next();
      CT_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    static constexpr std::string_view kUnsupported[] = {"call", "filter",  "include",  "import",
                                                        "from", "extends", "block",    "autoescape",
                                                        "do",   "trans",   "pluralize"};
    for (std::string_view name : kUnsupported) {
      if (tag == name) {
        return absl::UnimplementedError(
            absl::StrFormat("line %d: the '{%% %s %%}' tag is not supported", line, tag));
      }
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("line %d: unknown or unexpected tag '%s'", line, tag));
  }

  // The rest of `{% if %}` ... `{% endif %}`, with its elif and else branches, after the tag name.
  absl::StatusOr<NodePtr> ParseIf(NodePtr node) {
    node->kind = Node::Kind::kIf;
    std::string end;
    while (true) {
      IfBranch branch;
      CT_ASSIGN_OR_RETURN(branch.condition, ParseTuple(/*with_condexpr=*/false));
      CT_RETURN_IF_ERROR(ExpectBlockEnd());
      CT_ASSIGN_OR_RETURN(branch.body, Subparse({"elif", "else", "endif"}, &end));
      node->branches.push_back(std::move(branch));
      Next();  // the end tag's name
      if (end != "elif") break;
    }
    if (end == "else") {
      CT_RETURN_IF_ERROR(ExpectBlockEnd());
      CT_ASSIGN_OR_RETURN(node->else_body, Subparse({"endif"}, &end));
      Next();
    }
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }

  // The rest of `{% for %}` ... `{% endfor %}`, with its filter and else body, after the tag name.
  // `line` is the tag's line.
  absl::StatusOr<NodePtr> ParseFor(NodePtr node, int line) {
    node->kind = Node::Kind::kFor;
    CT_ASSIGN_OR_RETURN(node->targets, ParseTargets());
    if (!SkipName("in")) return Unexpected("'in'");
    CT_ASSIGN_OR_RETURN(node->expr, ParseTuple(/*with_condexpr=*/false));
    if (SkipName("if")) {
      CT_ASSIGN_OR_RETURN(node->condition, ParseExpression(/*with_condexpr=*/true));
    }
    if (IsName("recursive")) {
      return absl::UnimplementedError(
          absl::StrFormat("line %d: recursive for loops are not supported", line));
    }
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ++loop_depth_;
    CT_ASSIGN_OR_RETURN(node->body, Subparse({"endfor", "else"}, &end));
    --loop_depth_;
    Next();
    if (end == "else") {
      CT_RETURN_IF_ERROR(ExpectBlockEnd());
      CT_ASSIGN_OR_RETURN(node->else_body, Subparse({"endfor"}, &end));
      Next();
    }
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }

  // The rest of `{% set x = ... %}`, `{% set ns.attr = ... %}` or a `{% set x %}` ... `{% endset
  // %}` block, after the tag name. `line` is the tag's line.
  absl::StatusOr<NodePtr> ParseSet(NodePtr node, int line) {
    if (Cur().type == Token::Type::kName && Peek().type == Token::Type::kOp && Peek().text == ".") {
      node->attr_target = Cur().text;
      Next();
      Next();
      CT_ASSIGN_OR_RETURN(std::string attr, ExpectName("an attribute name"));
      node->targets.push_back(std::move(attr));
    } else {
      CT_ASSIGN_OR_RETURN(node->targets, ParseTargets());
    }
    if (SkipOp("=")) {
      node->kind = Node::Kind::kSet;
      CT_ASSIGN_OR_RETURN(node->expr, ParseTuple(/*with_condexpr=*/true));
      CT_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (!node->attr_target.empty() || node->targets.size() != 1) {
      return Unexpected("'='");
    }
    if (IsOp("|")) {
      return absl::UnimplementedError(
          absl::StrFormat("line %d: filtered set blocks are not supported", line));
    }
    node->kind = Node::Kind::kSetBlock;
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    CT_ASSIGN_OR_RETURN(node->body, Subparse({"endset"}, &end));
    Next();
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }

  // The rest of `{% macro name(params) %}` ... `{% endmacro %}`, after the tag name.
  absl::StatusOr<NodePtr> ParseMacro(NodePtr node) {
    node->kind = Node::Kind::kMacro;
    CT_ASSIGN_OR_RETURN(node->name, ExpectName("a macro name"));
    CT_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!node->params.empty()) CT_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      MacroParam param;
      CT_ASSIGN_OR_RETURN(param.name, ExpectName("a parameter name"));
      if (SkipOp("=")) {
        CT_ASSIGN_OR_RETURN(param.default_value, ParseExpression(/*with_condexpr=*/true));
      } else if (!node->params.empty() && node->params.back().default_value != nullptr) {
        return Error("a macro parameter without a default follows one with a default");
      }
      node->params.push_back(std::move(param));
    }
    Next();
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // break/continue cannot cross a macro
    CT_ASSIGN_OR_RETURN(node->body, Subparse({"endmacro"}, &end));
    loop_depth_ = saved_loop_depth;
    Next();
    if (Cur().type == Token::Type::kName) Next();  // {% endmacro name %}
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }

  // The rest of `{% with a = x, b = y %}` ... `{% endwith %}`, after the tag name.
  absl::StatusOr<NodePtr> ParseWith(NodePtr node) {
    node->kind = Node::Kind::kScope;
    while (Cur().type != Token::Type::kBlockEnd) {
      if (!node->assignments.empty()) CT_RETURN_IF_ERROR(ExpectOp(","));
      CT_ASSIGN_OR_RETURN(std::string name, ExpectName("a variable name"));
      CT_RETURN_IF_ERROR(ExpectOp("="));
      CT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(/*with_condexpr=*/true));
      node->assignments.emplace_back(std::move(name), std::move(value));
    }
    Next();
    std::string end;
    CT_ASSIGN_OR_RETURN(node->body, Subparse({"endwith"}, &end));
    Next();
    CT_RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }

  // `a` or `a, b` (optionally parenthesized) as loop or set targets.
  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = SkipOp("(");
    do {
      if (paren && IsOp(")")) break;
      CT_ASSIGN_OR_RETURN(std::string name, ExpectName("a variable name"));
      names.push_back(std::move(name));
    } while (SkipOp(","));
    if (paren) CT_RETURN_IF_ERROR(ExpectOp(")"));
    return names;
  }

  // An expression, or several separated by commas (a tuple, which this engine holds as a list).
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr) {
    const int line = Cur().line;
    CT_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(with_condexpr));
    if (!IsOp(",")) return first;
    auto tuple = MakeExpr(Expr::Kind::kList, line);
    tuple->negated = true;  // a tuple
    tuple->items.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().type == Token::Type::kVarEnd || Cur().type == Token::Type::kBlockEnd) break;
      CT_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
      tuple->items.push_back(std::move(item));
    }
    return tuple;
  }

  static ExprPtr MakeExpr(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    if (guard.exceeded()) return Error("expression nested too deeply");
    if (!with_condexpr) return ParseOr();
    CT_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    ChainGuard chain(this);
    while (IsName("if")) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      Next();
      auto cond = MakeExpr(Expr::Kind::kCondExpr, line);
      CT_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        CT_ASSIGN_OR_RETURN(otherwise, ParseExpression(/*with_condexpr=*/true));
      }
      cond->items.push_back(std::move(expr));
      cond->items.push_back(std::move(test));
      cond->items.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> MakeBinary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = MakeExpr(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    CT_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    ChainGuard chain(this);
    while (IsName("or")) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      Next();
      CT_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      CT_ASSIGN_OR_RETURN(left, MakeBinary("or", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    CT_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    ChainGuard chain(this);
    while (IsName("and")) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      Next();
      CT_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      CT_ASSIGN_OR_RETURN(left, MakeBinary("and", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      if (guard.exceeded()) return Error("expression nested too deeply");
      auto e = MakeExpr(Expr::Kind::kNot, Cur().line);
      Next();
      CT_ASSIGN_OR_RETURN(e->operand, ParseNot());
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    CT_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == Token::Type::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == ">" ||
           Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == Token::Type::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (cmp == nullptr) {
        cmp = MakeExpr(Expr::Kind::kCompare, line);
        cmp->items.push_back(std::move(first));
      }
      CT_ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      cmp->ops.push_back(std::move(op));
      cmp->items.push_back(std::move(right));
    }
    return cmp != nullptr ? std::move(cmp) : std::move(first);
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    CT_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    ChainGuard chain(this);
    while (IsOp("+") || IsOp("-")) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      std::string op = Cur().text;
      Next();
      CT_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      CT_ASSIGN_OR_RETURN(left, MakeBinary(op, std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    CT_ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    ChainGuard chain(this);
    while (IsOp("~")) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      Next();
      CT_ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      CT_ASSIGN_OR_RETURN(left, MakeBinary("~", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    CT_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    ChainGuard chain(this);
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      std::string op = Cur().text;
      Next();
      CT_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      CT_ASSIGN_OR_RETURN(left, MakeBinary(op, std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    CT_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(/*with_filter=*/true));
    ChainGuard chain(this);
    while (IsOp("**")) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      Next();
      CT_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(/*with_filter=*/true));
      CT_ASSIGN_OR_RETURN(left, MakeBinary("**", std::move(left), std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    if (guard.exceeded()) return Error("expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = MakeExpr(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur().line);
      Next();
      CT_ASSIGN_OR_RETURN(node->operand, ParseUnary(/*with_filter=*/false));
    } else {
      CT_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    CT_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      CT_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    switch (t.type) {
      case Token::Type::kName: {
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        Next();
        return e;
      }
      case Token::Type::kString: {
        std::string s;
        while (Cur().type == Token::Type::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Next();
        }
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case Token::Type::kInt:
      case Token::Type::kFloat: {
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        e->literal = t.value;
        Next();
        return e;
      }
      case Token::Type::kOp:
        if (t.text == "(") {
          Next();
          if (SkipOp(")")) {
            auto empty = MakeExpr(Expr::Kind::kList, line);
            empty->negated = true;  // a tuple
            return empty;
          }
          CT_ASSIGN_OR_RETURN(ExprPtr inner, ParseExpression(/*with_condexpr=*/true));
          if (IsOp(",")) {
            auto tuple = MakeExpr(Expr::Kind::kList, line);
            tuple->negated = true;  // a tuple
            tuple->items.push_back(std::move(inner));
            while (SkipOp(",")) {
              if (IsOp(")")) break;
              CT_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(/*with_condexpr=*/true));
              tuple->items.push_back(std::move(item));
            }
            inner = std::move(tuple);
          }
          CT_RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (t.text == "[") {
          Next();
          auto list = MakeExpr(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            if (!list->items.empty()) CT_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            CT_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(/*with_condexpr=*/true));
            list->items.push_back(std::move(item));
          }
          Next();
          return list;
        }
        if (t.text == "{") {
          Next();
          auto dict = MakeExpr(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            if (!dict->items.empty()) CT_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            CT_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(/*with_condexpr=*/true));
            CT_RETURN_IF_ERROR(ExpectOp(":"));
            CT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(/*with_condexpr=*/true));
            dict->items.push_back(std::move(key));
            dict->items.push_back(std::move(value));
          }
          Next();
          return dict;
        }
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    ChainGuard chain(this);
    while (true) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      if (IsOp(".")) {
        Next();
        if (Cur().type == Token::Type::kName) {
          auto e = MakeExpr(Expr::Kind::kGetAttr, line);
          e->name = Cur().text;
          e->operand = std::move(node);
          node = std::move(e);
        } else if (Cur().type == Token::Type::kInt) {
          auto e = MakeExpr(Expr::Kind::kGetItem, line);
          auto index = MakeExpr(Expr::Kind::kLiteral, line);
          index->literal = Cur().value;
          e->operand = std::move(node);
          e->items.push_back(std::move(index));
          node = std::move(e);
        } else {
          return Unexpected("an attribute name");
        }
        Next();
      } else if (IsOp("[")) {
        Next();
        CT_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), line));
      } else if (IsOp("(")) {
        CT_ASSIGN_OR_RETURN(node, ParseCall(std::move(node), line));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr operand, int line) {
    // Each of start, stop, step may be absent: x[1:], x[:-1], x[::-1].
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (true) {
      if (IsOp(":")) {
        is_slice = true;
        if (++part > 2) return Error("too many ':' in a slice");
        Next();
        continue;
      }
      if (IsOp("]")) break;
      if (parts[part] != nullptr) return Unexpected("']'");
      CT_ASSIGN_OR_RETURN(parts[part], ParseExpression(/*with_condexpr=*/true));
      if (IsOp(",")) {
        return absl::UnimplementedError(
            absl::StrFormat("line %d: tuple subscripts are not supported", line));
      }
    }
    Next();
    if (!is_slice && parts[0] == nullptr) return Error("empty subscript");
    auto e = MakeExpr(is_slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, line);
    e->operand = std::move(operand);
    e->items.push_back(std::move(parts[0]));
    if (is_slice) {
      e->items.push_back(std::move(parts[1]));
      e->items.push_back(std::move(parts[2]));
    }
    return e;
  }

  absl::Status ParseArgs(std::vector<Arg>* args) {
    CT_RETURN_IF_ERROR(ExpectOp("("));
    bool seen_keyword = false;
    while (!IsOp(")")) {
      if (!args->empty()) CT_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) {
        return absl::UnimplementedError(
            absl::StrFormat("line %d: *args and **kwargs in calls are not supported", Cur().line));
      }
      Arg arg;
      if (Cur().type == Token::Type::kName && Peek().type == Token::Type::kOp &&
          Peek().text == "=") {
        arg.name = Cur().text;
        Next();
        Next();
        seen_keyword = true;
      } else if (seen_keyword) {
        return Error("positional argument follows keyword argument");
      }
      CT_ASSIGN_OR_RETURN(arg.value, ParseExpression(/*with_condexpr=*/true));
      args->push_back(std::move(arg));
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee, int line) {
    auto e = MakeExpr(Expr::Kind::kCall, line);
    e->operand = std::move(callee);
    CT_RETURN_IF_ERROR(ParseArgs(&e->args));
    return e;
  }

  absl::StatusOr<std::string> ParseDottedName(const std::string& what) {
    CT_ASSIGN_OR_RETURN(std::string name, ExpectName(what));
    while (IsOp(".") && Peek().type == Token::Type::kName) {
      Next();
      absl::StrAppend(&name, ".", Cur().text);
      Next();
    }
    return name;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    ChainGuard chain(this);
    while (true) {
      if (!chain.Link()) return Error("expression nested too deeply");
      const int line = Cur().line;
      if (IsOp("|")) {
        Next();
        auto e = MakeExpr(Expr::Kind::kFilter, line);
        CT_ASSIGN_OR_RETURN(e->name, ParseDottedName("a filter name"));
        if (!IsKnownFilter(e->name)) {
          return absl::UnimplementedError(
              absl::StrFormat("line %d: unknown or unsupported filter '%s'", line, e->name));
        }
        if (IsOp("(")) CT_RETURN_IF_ERROR(ParseArgs(&e->args));
        e->operand = std::move(node);
        node = std::move(e);
      } else if (IsName("is")) {
        Next();
        auto e = MakeExpr(Expr::Kind::kTest, line);
        e->negated = SkipName("not");
        CT_ASSIGN_OR_RETURN(e->name, ParseDottedName("a test name"));
        if (!IsKnownTest(e->name)) {
          return absl::UnimplementedError(
              absl::StrFormat("line %d: unknown or unsupported test '%s'", line, e->name));
        }
        if (IsOp("(")) {
          CT_RETURN_IF_ERROR(ParseArgs(&e->args));
        } else if ((Cur().type == Token::Type::kName || Cur().type == Token::Type::kString ||
                    Cur().type == Token::Type::kInt || Cur().type == Token::Type::kFloat ||
                    IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if")) {
          // `x is divisibleby 3`, `x is sameas false`: one argument without parentheses.
          if (IsName("is")) return Error("tests cannot be chained with 'is'");
          Arg arg;
          CT_ASSIGN_OR_RETURN(arg.value, ParsePrimary());
          CT_ASSIGN_OR_RETURN(arg.value, ParsePostfix(std::move(arg.value)));
          e->args.push_back(std::move(arg));
        }
        e->operand = std::move(node);
        node = std::move(e);
      } else if (IsOp("(")) {
        CT_ASSIGN_OR_RETURN(node, ParseCall(std::move(node), line));
      } else {
        return node;
      }
    }
  }

  ParseOptions options_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(std::string_view source, const ParseOptions& options) {
  CT_ASSIGN_OR_RETURN(std::vector<Token> tokens, LexTemplate(source, options));
  Parser parser(std::move(tokens), options);
  return parser.ParseAll();
}

}  // namespace tandem::jinja
