#include "lib/regex/regex.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "lib/regex/regex_internal.h"
#include "lib/unicode/unicode.h"

namespace tandem {

using regex_internal::kDigitMask;
using regex_internal::kUnbounded;
using regex_internal::kWordExtraBit;
using regex_internal::kWordMask;
using regex_internal::MatchProperties;
using unicode::CategoryBit;
using unicode::GeneralCategory;

namespace regex_internal {
namespace {

constexpr std::pair<uint32_t, uint32_t> kOnigWordExtra[] = {
    {0x00B2, 0x00B3},   {0x00B9, 0x00B9},   {0x00BC, 0x00BE},   {0x16EE, 0x16F0},
    {0x2160, 0x2182},   {0x2185, 0x2188},   {0x24B6, 0x24E9},   {0x3007, 0x3007},
    {0x3021, 0x3029},   {0x3038, 0x303A},   {0xA6E6, 0xA6EF},   {0x10140, 0x10174},
    {0x10341, 0x10341}, {0x1034A, 0x1034A}, {0x103D1, 0x103D5}, {0x12400, 0x1246E},
    {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189}};

}  // namespace

// unicode::Properties plus kWordExtraBit. Every extra code point is Nl, No or So, so only those
// are looked up: letters, CJK and punctuation take no range search.
uint32_t MatchProperties(uint32_t cp) {
  constexpr uint32_t kExtraCategories = CategoryBit(GeneralCategory::kNl) |
                                        CategoryBit(GeneralCategory::kNo) |
                                        CategoryBit(GeneralCategory::kSo);
  const uint32_t props = unicode::Properties(cp);
  if ((props & kExtraCategories) == 0) return props;
  for (const auto& [lo, hi] : kOnigWordExtra) {
    if (cp >= lo && cp <= hi) return props | kWordExtraBit;
  }
  return props;
}

}  // namespace regex_internal

Regex::Regex() = default;
Regex::~Regex() = default;

// ---------------------------------------------------------------------------------------------
// Parsing

class RegexParser {
 public:
  RegexParser(std::string_view pattern, Regex* re) : p_(pattern), re_(re) {}

  absl::Status Parse() {
    bool icase = false;
    auto root = ParseAlternatives(&icase);
    if (!root.ok()) return root.status();
    if (pos_ < p_.size()) return Error("unbalanced ')'");
    re_->root_ = {*root};
    for (auto& node : re_->nodes_) {
      if (node.kind != Kind::kGroup) continue;
      for (const auto& alt : node.alts) node.alt_filters.push_back(FirstFilter(alt));
    }
    return absl::OkStatus();
  }

 private:
  using Node = Regex::Node;
  using Kind = Node::Kind;

  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("regex /%s/: %s at offset %d", p_, what, pos_));
  }
  absl::Status Unsupported(std::string_view what) const {
    return absl::UnimplementedError(
        absl::StrFormat("regex /%s/: %s (offset %d) is not supported", p_, what, pos_));
  }

  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }
  bool Consume(std::string_view s) {
    if (p_.substr(pos_, s.size()) == s) {
      pos_ += s.size();
      return true;
    }
    return false;
  }

  absl::StatusOr<uint32_t> NextCodePoint() {
    if (AtEnd()) return Error("unexpected end of pattern");
    if (unicode::FindInvalidUtf8(p_.substr(pos_, 4).substr(
            0, std::min<size_t>(unicode::Utf8SequenceLength(p_[pos_]), p_.size() - pos_))) !=
        std::string_view::npos) {
      return Error("invalid UTF-8");
    }
    return unicode::DecodeUtf8(p_, &pos_);
  }

  int AddNode(Node n) {
    re_->nodes_.push_back(std::move(n));
    return static_cast<int>(re_->nodes_.size()) - 1;
  }

  // alternatives := seq ('|' seq)*; returns a kGroup node. `icase` may be switched by an
  // inline "(?i)" and stays switched to the end of the enclosing group.
  absl::StatusOr<int> ParseAlternatives(bool* icase) {
    Node group;
    group.kind = Kind::kGroup;
    while (true) {
      auto seq = ParseSeq(icase);
      if (!seq.ok()) return seq.status();
      group.alts.push_back(std::move(*seq));
      if (!AtEnd() && Peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return AddNode(std::move(group));
  }

  absl::StatusOr<Regex::Seq> ParseSeq(bool* icase) {
    Regex::Seq seq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Consume("(?i)")) {
        *icase = true;
        continue;
      }
      if (Consume("(?-i)")) {
        *icase = false;
        continue;
      }
      auto atom = ParseAtom(*icase);
      if (!atom.ok()) return atom.status();
      int node = *atom;
      while (!AtEnd()) {
        auto q = ParseQuantifier(node);
        if (!q.ok()) return q.status();
        if (*q == node) break;
        node = *q;
      }
      seq.push_back(node);
    }
    return seq;
  }

  bool IsSingleChar(int node) const {
    const Kind k = re_->nodes_[node].kind;
    return k == Kind::kLiteral || k == Kind::kClass || k == Kind::kAny;
  }

  // Wraps `node` in a repeat when a quantifier follows; returns `node` itself otherwise.
  absl::StatusOr<int> ParseQuantifier(int node) {
    int min, max;
    bool braces = false;
    if (Consume("*")) {
      min = 0, max = kUnbounded;
    } else if (Consume("+")) {
      min = 1, max = kUnbounded;
    } else if (Consume("?")) {
      min = 0, max = 1;
    } else if (Peek() == '{' && ParseBraces(&min, &max)) {
      braces = true;
    } else {
      return node;
    }
    const Kind k = re_->nodes_[node].kind;
    if (k == Kind::kLineStart || k == Kind::kLineEnd || k == Kind::kTextStart ||
        k == Kind::kTextEnd || k == Kind::kTextEndOrFinalNewline) {
      return Error("quantifier after an anchor");
    }
    if (max != kUnbounded && min > max) return Error("bad repeat range");
    Node rep;
    rep.kind = Kind::kRepeat;
    rep.min = min;
    rep.max = max;
    rep.body = {node};
    rep.single_char = IsSingleChar(node);
    // Oniguruma syntax: "?" after any quantifier makes it lazy; "+" after *, + or ? makes it
    // possessive, but after {n,m} it is another quantifier (handled by the caller's loop).
    if (Consume("?")) {
      rep.greed = Node::Greed::kLazy;
    } else if (!braces && Consume("+")) {
      rep.greed = Node::Greed::kPossessive;
    }
    return AddNode(std::move(rep));
  }

  // {n}, {n,}, {n,m}, {,m}. Leaves pos_ unchanged and returns false when the text is not a
  // valid quantifier (Oniguruma then reads '{' literally).
  bool ParseBraces(int* min, int* max) {
    size_t i = pos_ + 1;
    auto read_int = [&](int* out) {
      const size_t b = i;
      int64_t v = 0;
      while (i < p_.size() && absl::ascii_isdigit(p_[i]) && v < 100000)
        v = v * 10 + (p_[i++] - '0');
      *out = static_cast<int>(v);
      return i > b;
    };
    int lo = 0, hi = 0;
    const bool has_lo = read_int(&lo);
    if (i < p_.size() && p_[i] == '}') {
      if (!has_lo) return false;
      *min = *max = lo;
    } else if (i < p_.size() && p_[i] == ',') {
      ++i;
      const bool has_hi = read_int(&hi);
      if (i >= p_.size() || p_[i] != '}' || (!has_lo && !has_hi)) return false;
      *min = has_lo ? lo : 0;
      *max = has_hi ? hi : kUnbounded;
    } else {
      return false;
    }
    pos_ = i + 1;
    return true;
  }

  absl::StatusOr<int> ParseAtom(bool icase) {
    const char c = Peek();
    if (c == '(') return ParseGroup(icase);
    if (c == '[') {
      ++pos_;
      Regex::CharClass cls;
      auto st = ParseClass(icase, &cls);
      if (!st.ok()) return st;
      return AddClassNode(std::move(cls));
    }
    if (c == '*' || c == '+' || c == '?') return Error("nothing to repeat");
    if (c == '.') {
      ++pos_;
      Node n;
      n.kind = Kind::kAny;
      return AddNode(n);
    }
    if (c == '^' || c == '$') {
      ++pos_;
      Node n;
      n.kind = c == '^' ? Kind::kLineStart : Kind::kLineEnd;
      return AddNode(n);
    }
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Error("trailing backslash");
      const char e = Peek();
      Node n;
      switch (e) {
        case 'A':
          n.kind = Kind::kTextStart;
          break;
        case 'z':
          n.kind = Kind::kTextEnd;
          break;
        case 'Z':
          n.kind = Kind::kTextEndOrFinalNewline;
          break;
        case 'b':
          n.kind = Kind::kWordBoundary;
          break;
        case 'B':
          n.kind = Kind::kNotWordBoundary;
          break;
        default: {
          Regex::CharClass cls;
          cls.icase = icase;
          uint32_t cp;
          auto is_class = ParseEscape(&cls, &cp);
          if (!is_class.ok()) return is_class.status();
          if (*is_class) return AddClassNode(std::move(cls));
          return AddLiteral(cp, icase);
        }
      }
      ++pos_;
      return AddNode(n);
    }
    auto cp = NextCodePoint();
    if (!cp.ok()) return cp.status();
    return AddLiteral(*cp, icase);
  }

  int AddLiteral(uint32_t cp, bool icase) {
    Node n;
    n.kind = Kind::kLiteral;
    n.icase = icase;
    n.cp = icase ? unicode::SimpleFold(cp) : cp;
    return AddNode(n);
  }

  int AddClassNode(Regex::CharClass cls) {
    re_->classes_.push_back(std::move(cls));
    Node n;
    n.kind = Kind::kClass;
    n.class_index = static_cast<int>(re_->classes_.size()) - 1;
    return AddNode(n);
  }

  absl::StatusOr<int> ParseGroup(bool icase) {
    ++pos_;  // '('
    Node wrapper;
    bool wrap = false;
    bool inner_icase = icase;
    if (Consume("?:")) {
    } else if (Consume("?i:")) {
      inner_icase = true;
    } else if (Consume("?-i:")) {
      inner_icase = false;
    } else if (Consume("?=") || Consume("?!")) {
      wrap = true;
      wrapper.kind = Kind::kLookahead;
      wrapper.negate = p_[pos_ - 1] == '!';
    } else if (Consume("?<=") || Consume("?<!")) {
      wrap = true;
      wrapper.kind = Kind::kLookbehind;
      wrapper.negate = p_[pos_ - 1] == '!';
    } else if (Consume("?>")) {
      wrap = true;
      wrapper.kind = Kind::kAtomic;
    } else if (!AtEnd() && Peek() == '?') {
      return Unsupported("this group syntax");
    }
    auto inner = ParseAlternatives(&inner_icase);
    if (!inner.ok()) return inner.status();
    if (!Consume(")")) return Error("missing ')'");
    if (!wrap) return *inner;
    wrapper.body = {*inner};
    if (wrapper.kind == Kind::kLookbehind) {
      Width(*inner, &wrapper.min_width, &wrapper.max_width);
      if (wrapper.max_width == kUnbounded) return Unsupported("lookbehind of unbounded length");
    }
    return AddNode(std::move(wrapper));
  }

  FirstCharFilter FirstFilter(const Regex::Seq& seq) const {
    FirstCharFilter f;
    if (seq.empty()) return f;
    const Node& n = re_->nodes_[seq[0]];
    switch (n.kind) {
      case Kind::kLiteral:
        f.any = false;
        f.literals.emplace_back(n.cp, n.icase);
        return f;
      case Kind::kClass:
        f.any = false;
        f.classes.push_back(n.class_index);
        return f;
      case Kind::kGroup:
        f.any = false;
        for (const auto& alt : n.alts) {
          FirstCharFilter g = FirstFilter(alt);
          if (g.any) return FirstCharFilter();
          f.literals.insert(f.literals.end(), g.literals.begin(), g.literals.end());
          f.classes.insert(f.classes.end(), g.classes.begin(), g.classes.end());
        }
        std::sort(f.literals.begin(), f.literals.end());
        f.literals.erase(std::unique(f.literals.begin(), f.literals.end()), f.literals.end());
        return f;
      case Kind::kRepeat:
        return n.min >= 1 ? FirstFilter(n.body) : f;
      case Kind::kAtomic:
        return FirstFilter(n.body);
      default:
        return f;  // kAny, anchors and lookaround: no cheap test
    }
  }

  // Width range, in code points, of what `node` can match.
  void Width(int node, int* min, int* max) const {
    const Node& n = re_->nodes_[node];
    auto seq_width = [&](const Regex::Seq& seq, int* lo, int* hi) {
      *lo = 0, *hi = 0;
      for (int i : seq) {
        int a, b;
        Width(i, &a, &b);
        *lo += a;
        *hi = (*hi == kUnbounded || b == kUnbounded) ? kUnbounded : *hi + b;
      }
    };
    switch (n.kind) {
      case Kind::kLiteral:
      case Kind::kClass:
      case Kind::kAny:
        *min = *max = 1;
        return;
      case Kind::kGroup: {
        *min = std::numeric_limits<int>::max(), *max = 0;
        for (const auto& alt : n.alts) {
          int a, b;
          seq_width(alt, &a, &b);
          *min = std::min(*min, a);
          *max = (*max == kUnbounded || b == kUnbounded) ? kUnbounded : std::max(*max, b);
        }
        return;
      }
      case Kind::kRepeat:
      case Kind::kAtomic: {
        int a, b;
        seq_width(n.body, &a, &b);
        if (n.kind == Kind::kAtomic) {
          *min = a, *max = b;
          return;
        }
        *min = a * n.min;
        *max = (b == kUnbounded || n.max == kUnbounded) ? (b == 0 ? 0 : kUnbounded) : b * n.max;
        return;
      }
      default:
        *min = *max = 0;  // assertions and lookaround consume nothing
        return;
    }
  }

  // After a backslash (pos_ at the escape letter). Returns true and fills `cls` for a class
  // escape (\s, \p{L}, ...), or false and sets `cp` for a single character.
  absl::StatusOr<bool> ParseEscape(Regex::CharClass* cls, uint32_t* cp) {
    const char e = p_[pos_++];
    switch (e) {
      case 's':
        cls->mask |= unicode::kWhiteSpaceBit;
        return true;
      case 'S':
        cls->neg_masks.push_back(unicode::kWhiteSpaceBit);
        return true;
      case 'd':
        cls->mask |= kDigitMask;
        return true;
      case 'D':
        cls->neg_masks.push_back(kDigitMask);
        return true;
      case 'w':
        cls->mask |= kWordMask;
        return true;
      case 'W':
        cls->neg_masks.push_back(kWordMask);
        return true;
      case 'h':
        cls->ranges.insert(cls->ranges.end(), {{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
        return true;
      case 'H':
        return Unsupported("\\H");
      case 'p':
      case 'P': {
        bool negate = e == 'P';
        std::string name;
        if (Consume("{")) {
          if (Consume("^")) negate = !negate;
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos) return Error("unterminated \\p{");
          name = std::string(p_.substr(pos_, close - pos_));
          pos_ = close + 1;
        } else {
          if (AtEnd()) return Error("incomplete \\p");
          name = std::string(1, p_[pos_++]);
        }
        auto mask = PropertyMask(name);
        if (!mask.ok()) return mask.status();
        if (negate) {
          cls->neg_masks.push_back(*mask);
        } else {
          cls->mask |= *mask;
        }
        return true;
      }
      case 'n':
        *cp = '\n';
        return false;
      case 'r':
        *cp = '\r';
        return false;
      case 't':
        *cp = '\t';
        return false;
      case 'f':
        *cp = '\f';
        return false;
      case 'v':
        *cp = '\v';
        return false;
      case 'a':
        *cp = 0x07;
        return false;
      case 'e':
        *cp = 0x1B;
        return false;
      case '0':
        *cp = 0;
        return false;
      case 'x':
      case 'u': {
        size_t digits;
        if (e == 'x' && Consume("{")) {
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos) return Error("unterminated \\x{");
          digits = close - pos_;
          auto v = ParseHex(p_.substr(pos_, digits));
          if (!v.ok()) return v.status();
          *cp = *v;
          pos_ = close + 1;
          return false;
        }
        digits = e == 'x' ? 2 : 4;
        if (pos_ + digits > p_.size()) return Error("short hex escape");
        auto v = ParseHex(p_.substr(pos_, digits));
        if (!v.ok()) return v.status();
        *cp = *v;
        pos_ += digits;
        return false;
      }
      default:
        if (absl::ascii_isdigit(e) || e == 'k' || e == 'g') {
          return Unsupported("backreferences and subexpression calls");
        }
        if (absl::ascii_isalpha(e)) return Unsupported(absl::StrFormat("escape \\%c", e));
        --pos_;
        auto c = NextCodePoint();  // an escaped punctuation or other character: itself
        if (!c.ok()) return c.status();
        *cp = *c;
        return false;
    }
  }

  absl::StatusOr<uint32_t> ParseHex(std::string_view digits) {
    if (digits.empty() || digits.size() > 8) return Error("bad hex escape");
    uint32_t v = 0;
    for (char d : digits) {
      if (!absl::ascii_isxdigit(d)) return Error("bad hex escape");
      v = v * 16 + (absl::ascii_isdigit(d) ? d - '0' : absl::ascii_tolower(d) - 'a' + 10);
    }
    if (v > unicode::kMaxCodePoint) return Error("code point out of range");
    return v;
  }

  absl::StatusOr<uint32_t> PropertyMask(std::string_view raw) {
    std::string name;
    for (char c : raw) {
      if (c != '_' && c != ' ' && c != '-') name.push_back(absl::ascii_tolower(c));
    }
    static const auto* const kNames = new absl::flat_hash_map<std::string, uint32_t>([] {
      absl::flat_hash_map<std::string, uint32_t> m;
      const char* const kShort[] = {"lu", "ll", "lt", "lm", "lo", "mn", "mc", "me", "nd", "nl",
                                    "no", "pc", "pd", "ps", "pe", "pi", "pf", "po", "sm", "sc",
                                    "sk", "so", "zs", "zl", "zp", "cc", "cf", "cs", "co", "cn"};
      const char* const kLong[] = {
          "uppercaseletter",    "lowercaseletter",  "titlecaseletter",  "modifierletter",
          "otherletter",        "nonspacingmark",   "spacingmark",      "enclosingmark",
          "decimalnumber",      "letternumber",     "othernumber",      "connectorpunctuation",
          "dashpunctuation",    "openpunctuation",  "closepunctuation", "initialpunctuation",
          "finalpunctuation",   "otherpunctuation", "mathsymbol",       "currencysymbol",
          "modifiersymbol",     "othersymbol",      "spaceseparator",   "lineseparator",
          "paragraphseparator", "control",          "format",           "surrogate",
          "privateuse",         "unassigned"};
      for (int i = 0; i < 30; ++i) {
        m[kShort[i]] = 1u << i;
        m[kLong[i]] = 1u << i;
      }
      auto range = [](int lo, int hi) {
        uint32_t r = 0;
        for (int i = lo; i <= hi; ++i) r |= 1u << i;
        return r;
      };
      m["l"] = m["letter"] = range(0, 4);
      m["lc"] = m["l&"] = m["casedletter"] = range(0, 2);
      m["m"] = m["mark"] = m["combiningmark"] = range(5, 7);
      m["n"] = m["number"] = range(8, 10);
      m["p"] = m["punctuation"] = m["punct"] = range(11, 17);
      m["s"] = m["symbol"] = range(18, 21);
      m["z"] = m["separator"] = range(22, 24);
      m["c"] = m["other"] = range(25, 29);
      m["digit"] = 1u << 8;
      m["cntrl"] = 1u << 25;
      m["whitespace"] = m["space"] = unicode::kWhiteSpaceBit;
      m["any"] = range(0, 29);
      return m;
    }());
    auto it = kNames->find(name);
    if (it == kNames->end()) return Unsupported(absl::StrFormat("property \\p{%s}", raw));
    return it->second;
  }

  // After '['. Parses to the closing ']'.
  absl::Status ParseClass(bool icase, Regex::CharClass* cls) {
    cls->icase = icase;
    if (Consume("^")) cls->negated = true;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("missing ']'");
      if (Peek() == ']' && !first) {
        ++pos_;
        return absl::OkStatus();
      }
      first = false;
      if (Consume("&&")) return Unsupported("class intersection");
      if (Consume("[:")) return Unsupported("POSIX bracket");
      if (Peek() == '[') {
        ++pos_;
        Regex::CharClass inner;
        auto st = ParseClass(icase, &inner);
        if (!st.ok()) return st;
        if (inner.negated) return Unsupported("negated nested class");
        cls->mask |= inner.mask;
        cls->neg_masks.insert(cls->neg_masks.end(), inner.neg_masks.begin(), inner.neg_masks.end());
        cls->ranges.insert(cls->ranges.end(), inner.ranges.begin(), inner.ranges.end());
        continue;
      }
      uint32_t lo;
      if (Peek() == '\\') {
        ++pos_;
        if (AtEnd()) return Error("trailing backslash");
        if (Peek() == 'b') {  // backspace inside a class
          ++pos_;
          lo = 0x08;
        } else {
          auto is_class = ParseEscape(cls, &lo);
          if (!is_class.ok()) return is_class.status();
          if (*is_class) continue;
        }
      } else {
        auto c = NextCodePoint();
        if (!c.ok()) return c.status();
        lo = *c;
      }
      uint32_t hi = lo;
      if (pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        if (Peek() == '\\') {
          ++pos_;
          if (AtEnd()) return Error("trailing backslash");
          Regex::CharClass dummy;
          auto is_class = ParseEscape(&dummy, &hi);
          if (!is_class.ok()) return is_class.status();
          if (*is_class) return Error("class escape as range end");
        } else {
          auto c = NextCodePoint();
          if (!c.ok()) return c.status();
          hi = *c;
        }
        if (hi < lo) return Error("reversed class range");
      }
      cls->ranges.emplace_back(lo, hi);
    }
  }

  std::string_view p_;
  size_t pos_ = 0;
  Regex* re_;
};

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  if (unicode::FindInvalidUtf8(pattern) != std::string_view::npos) {
    return absl::InvalidArgumentError("regex pattern is not valid UTF-8");
  }
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  RegexParser parser(re->pattern_, re.get());
  if (auto st = parser.Parse(); !st.ok()) return st;
  return re;
}

}  // namespace tandem
