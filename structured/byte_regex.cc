#include "structured/byte_regex.h"

#include <bitset>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"

namespace tandem::structured {
namespace {

using Bytes = std::bitset<256>;

// The parsed pattern: a tree of byte classes, concatenations, alternations and repetitions.
struct Node {
  enum Type { kClass, kConcat, kAlt, kRepeat } type = kClass;
  Bytes bytes;            // kClass
  std::vector<int> kids;  // kConcat, kAlt; kRepeat: one
  int min = 0, max = -1;  // kRepeat; max -1: no limit
};

Bytes Range(int lo, int hi) {
  Bytes b;
  for (int c = lo; c <= hi; ++c) b.set(c);
  return b;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  absl::StatusOr<int> Parse(std::vector<Node>* nodes) {
    nodes_ = nodes;
    // A whole match: ^ at the start and $ at the end say nothing more.
    if (!p_.empty() && p_.front() == '^') p_.remove_prefix(1);
    if (!p_.empty() && p_.back() == '$' && (p_.size() < 2 || p_[p_.size() - 2] != '\\')) {
      p_.remove_suffix(1);
    }
    auto root = Alternation();
    if (!root.ok()) return root;
    if (i_ < p_.size()) return Error("unbalanced ')'");
    return root;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrFormat("%s at offset %d", what, i_));
  }
  int Add(Node n) {
    nodes_->push_back(std::move(n));
    return static_cast<int>(nodes_->size()) - 1;
  }
  int Class(Bytes b) {
    Node n;
    n.bytes = b;
    return Add(std::move(n));
  }
  int Of(Node::Type t, std::vector<int> kids) {
    Node n;
    n.type = t;
    n.kids = std::move(kids);
    return Add(std::move(n));
  }
  // Any multi-byte UTF-8 character.
  int MultiByte() {
    const Bytes cont = Range(0x80, 0xBF);
    return Of(Node::kAlt, {Of(Node::kConcat, {Class(Range(0xC2, 0xDF)), Class(cont)}),
                           Of(Node::kConcat, {Class(Range(0xE0, 0xEF)), Class(cont), Class(cont)}),
                           Of(Node::kConcat,
                              {Class(Range(0xF0, 0xF4)), Class(cont), Class(cont), Class(cont)})});
  }
  // The ASCII bytes of `ascii`, or (negated) the other ASCII bytes and every multi-byte
  // character.
  int Set(const Bytes& ascii, bool negated) {
    if (!negated) return Class(ascii);
    return Of(Node::kAlt, {Class(Range(0, 0x7F) & ~ascii), MultiByte()});
  }

  absl::StatusOr<int> Alternation() {
    std::vector<int> alts;
    while (true) {
      auto c = Concatenation();
      if (!c.ok()) return c;
      alts.push_back(*c);
      if (i_ < p_.size() && p_[i_] == '|') {
        ++i_;
        continue;
      }
      break;
    }
    return alts.size() == 1 ? alts[0] : Of(Node::kAlt, alts);
  }

  absl::StatusOr<int> Concatenation() {
    std::vector<int> parts;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      auto a = Repetition();
      if (!a.ok()) return a;
      parts.push_back(*a);
    }
    return parts.size() == 1 ? parts[0] : Of(Node::kConcat, parts);  // empty: matches ""
  }

  absl::StatusOr<int> Repetition() {
    auto atom = Atom();
    if (!atom.ok()) return atom;
    if (i_ >= p_.size()) return atom;
    int min = -1, max = -1;
    const char q = p_[i_];
    if (q == '*' || q == '+' || q == '?') {
      min = q == '+' ? 1 : 0;
      max = q == '?' ? 1 : -1;
      ++i_;
    } else if (q == '{') {
      ++i_;
      auto lo = Number();
      if (!lo.ok()) return lo.status();
      min = max = *lo;
      if (i_ < p_.size() && p_[i_] == ',') {
        ++i_;
        max = -1;
        if (i_ < p_.size() && p_[i_] != '}') {
          auto hi = Number();
          if (!hi.ok()) return hi.status();
          max = *hi;
        }
      }
      if (i_ >= p_.size() || p_[i_] != '}') return Error("expected '}' closing a repetition");
      ++i_;
      if (max >= 0 && max < min) return Error("a repetition {n,m} with m < n");
    } else {
      return atom;
    }
    if (i_ < p_.size() && p_[i_] == '?') ++i_;  // lazy: the same whole matches
    if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '{')) {
      return Error("possessive or repeated quantifiers are not supported");
    }
    Node n;
    n.type = Node::kRepeat;
    n.kids = {*atom};
    n.min = min;
    n.max = max;
    return Add(std::move(n));
  }

  absl::StatusOr<int> Number() {
    int v = 0, digits = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_++] - '0');
      if (++digits > 4 || v > ByteRegex::kMaxRepeat) {
        return Error(absl::StrFormat("a repetition count over %d", ByteRegex::kMaxRepeat));
      }
    }
    if (digits == 0) return Error("expected a repetition count");
    return v;
  }

  absl::StatusOr<int> Atom() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    switch (c) {
      case '(': {
        if (++depth_ > kMaxNesting) return Error("groups nested more than 32 deep");
        ++i_;
        if (i_ < p_.size() && p_[i_] == '?') {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
            i_ += 2;
          } else {
            return Error("lookaround and named groups ((?...)) are not supported");
          }
        }
        auto inner = Alternation();
        if (!inner.ok()) return inner;
        if (i_ >= p_.size() || p_[i_] != ')') return Error("missing ')'");
        ++i_;
        --depth_;
        return inner;
      }
      case '[':
        return BracketClass();
      case '.':
        ++i_;
        return Of(Node::kAlt, {Class(Range(0, 0x7F) & ~Range('\n', '\n')), MultiByte()});
      case '\\':
        return Escape(/*in_class=*/false, nullptr);
      case '*':
      case '+':
      case '?':
      case '{':
        return Error("nothing to repeat");
      case '^':
      case '$':
        return Error("anchors are supported only at the start (^) and end ($)");
      default:
        break;
    }
    if (c < 0x80) {
      ++i_;
      Bytes b;
      b.set(c);
      return Class(b);
    }
    // A multi-byte character of the pattern: its bytes in order.
    const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (len == 0 || i_ + len > p_.size()) return Error("invalid UTF-8");
    std::vector<int> bytes;
    for (int k = 0; k < len; ++k) {
      const unsigned char b = static_cast<unsigned char>(p_[i_ + k]);
      if (k > 0 && (b & 0xC0) != 0x80) return Error("invalid UTF-8");
      Bytes one;
      one.set(b);
      bytes.push_back(Class(one));
    }
    i_ += len;
    return Of(Node::kConcat, bytes);
  }

  // After '\\': a class (\d, ...), a control escape, \xHH or escaped punctuation. In a class,
  // its bytes go to `*out` (and a negated shorthand is refused).
  absl::StatusOr<int> Escape(bool in_class, Bytes* out) {
    ++i_;
    if (i_ >= p_.size()) return Error("a trailing backslash");
    const char e = p_[i_++];
    Bytes b;
    bool negated = false;
    switch (e) {
      case 'd':
      case 'D':
        b = Range('0', '9');
        negated = e == 'D';
        break;
      case 'w':
      case 'W':
        b = Range('a', 'z') | Range('A', 'Z') | Range('0', '9');
        b.set('_');
        negated = e == 'W';
        break;
      case 's':
      case 'S':
        for (char s : {' ', '\t', '\n', '\r', '\f', '\v'}) b.set(static_cast<unsigned char>(s));
        negated = e == 'S';
        break;
      case 'n':
        b.set('\n');
        break;
      case 't':
        b.set('\t');
        break;
      case 'r':
        b.set('\r');
        break;
      case 'f':
        b.set('\f');
        break;
      case 'v':
        b.set('\v');
        break;
      case 'x': {
        if (i_ + 2 > p_.size()) return Error("\\x needs two hex digits");
        int v = 0;
        for (int k = 0; k < 2; ++k) {
          const char h = p_[i_++];
          const int d = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (d < 0) return Error("\\x needs two hex digits");
          v = v * 16 + d;
        }
        if (v >= 0x80) return Error("\\x above 7F (write the character itself)");
        b.set(v);
        break;
      }
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9') ||
            static_cast<unsigned char>(e) >= 0x80) {
          return Error(
              absl::StrFormat("\\%c (backreferences, \\b and other escapes) is not supported", e));
        }
        b.set(static_cast<unsigned char>(e));  // escaped punctuation
    }
    if (in_class) {
      if (negated) return Error("\\D, \\W and \\S inside a class are not supported");
      *out |= b;
      return -1;
    }
    return Set(b, negated);
  }

  absl::StatusOr<int> BracketClass() {
    ++i_;  // '['
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    Bytes set;
    bool first = true;
    while (i_ < p_.size() && (p_[i_] != ']' || first)) {
      first = false;
      int lo;
      if (p_[i_] == '\\') {
        Bytes one;
        if (absl::Status s = Escape(true, &one).status(); !s.ok()) return s;
        if (one.count() != 1) {  // a shorthand: no range from or to it
          set |= one;
          continue;
        }
        lo = static_cast<int>(one._Find_first());
      } else {
        lo = static_cast<unsigned char>(p_[i_++]);
      }
      if (lo >= 0x80) return Error("non-ASCII characters in a class are not supported");
      int hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          Bytes one;
          if (absl::Status s = Escape(true, &one).status(); !s.ok()) return s;
          if (one.count() != 1) return Error("a class range ending in a shorthand");
          hi = static_cast<int>(one._Find_first());
        } else {
          hi = static_cast<unsigned char>(p_[i_++]);
        }
        if (hi >= 0x80) return Error("non-ASCII characters in a class are not supported");
        if (hi < lo) return Error("a class range out of order");
      }
      set |= Range(lo, hi);
    }
    if (i_ >= p_.size()) return Error("missing ']'");
    ++i_;
    return Set(set, negated);
  }

  static constexpr int kMaxNesting = 32;
  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
  std::vector<Node>* nodes_ = nullptr;
};

}  // namespace

// Glushkov's construction: every class leaf visited becomes a position; a fragment is what the
// positions of a subtree contribute (can it match "", where it can begin and end).
class RegexBuilder {
 public:
  using Mask = ByteRegex::Mask;
  struct Fragment {
    bool nullable;
    Mask first, last;
  };

  RegexBuilder(const std::vector<Node>& nodes, ByteRegex* re) : nodes_(nodes), re_(re) {}

  absl::StatusOr<Fragment> Build(int id) {
    // Repetitions of nothing ((x{0}){64}...) take no positions but would still take time.
    if (++visits_ > kMaxVisits) {
      return absl::InvalidArgumentError("the pattern's repetitions nest too deeply");
    }
    const Node& n = nodes_[id];
    switch (n.type) {
      case Node::kClass: {
        if (next_ > ByteRegex::kMaxPositions) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "the pattern needs more than %d character positions (repetitions count each "
              "copy; `.` counts 10)",
              ByteRegex::kMaxPositions));
        }
        const int p = next_++;
        const Mask bit = Mask{1} << p;
        for (int c = 0; c < 256; ++c) {
          if (n.bytes.test(c)) re_->accepts_[c] |= bit;
        }
        return Fragment{false, bit, bit};
      }
      case Node::kConcat: {
        Fragment f{true, 0, 0};
        for (int kid : n.kids) {
          auto k = Build(kid);
          if (!k.ok()) return k;
          f = Then(f, *k);
        }
        return f;
      }
      case Node::kAlt: {
        Fragment f{false, 0, 0};
        for (int kid : n.kids) {
          auto k = Build(kid);
          if (!k.ok()) return k;
          f = {f.nullable || k->nullable, f.first | k->first, f.last | k->last};
        }
        return f;
      }
      case Node::kRepeat: {
        Fragment f{true, 0, 0};
        for (int r = 0; r < n.min; ++r) {
          auto k = Build(n.kids[0]);
          if (!k.ok()) return k;
          f = Then(f, *k);
        }
        if (n.max < 0) {  // a starred copy
          auto k = Build(n.kids[0]);
          if (!k.ok()) return k;
          Link(k->last, k->first);
          f = Then(f, {true, k->first, k->last});
        } else {
          for (int r = n.min; r < n.max; ++r) {  // optional copies
            auto k = Build(n.kids[0]);
            if (!k.ok()) return k;
            f = Then(f, {true, k->first, k->last});
          }
        }
        return f;
      }
    }
    return absl::InternalError("regex: unknown node");
  }

  // `a` then `b`.
  Fragment Then(const Fragment& a, const Fragment& b) {
    Link(a.last, b.first);
    return {a.nullable && b.nullable, a.first | (a.nullable ? b.first : 0),
            b.last | (b.nullable ? a.last : 0)};
  }
  int positions() const { return next_ - 1; }
  void Link(Mask from, Mask to) {
    for (Mask s = from; s != 0; s &= s - 1) re_->follow_[ByteRegex::Lowest(s)] |= to;
  }

 private:
  const std::vector<Node>& nodes_;
  ByteRegex* re_;
  static constexpr int kMaxVisits = 100000;
  int next_ = 1;  // position 0 is the start
  int visits_ = 0;
};

absl::StatusOr<std::shared_ptr<const ByteRegex>> ByteRegex::Compile(std::string_view pattern) {
  if (pattern.size() > kMaxPatternBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the pattern is longer than %d bytes", kMaxPatternBytes));
  }
  std::vector<Node> nodes;
  auto root = Parser(pattern).Parse(&nodes);
  if (!root.ok()) return root.status();
  auto re = std::make_shared<ByteRegex>();
  RegexBuilder builder(nodes, re.get());
  auto f = builder.Build(*root);
  if (!f.ok()) return f.status();
  re->follow_[0] = f->first;
  re->positions_ = builder.positions();
  re->last_ = f->last | (f->nullable ? Start() : 0);
  return re;
}

}  // namespace tandem::structured
