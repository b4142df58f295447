#include "structured/json_matcher.h"

#include <algorithm>
#include <bit>

namespace tandem::structured {
namespace {

// Object phases.
constexpr uint8_t kObjOpen = 0;     // after '{': a key or '}'
constexpr uint8_t kObjKey = 1;      // inside a declared key (closed objects)
constexpr uint8_t kObjColon = 2;    // after a key: ':'
constexpr uint8_t kObjAfter = 3;    // after a value: ',' or '}'
constexpr uint8_t kObjNeedKey = 4;  // after ',': a key
// Array phases.
constexpr uint8_t kArrOpen = 0;       // after '[': a value or ']'
constexpr uint8_t kArrAfter = 1;      // after a value: ',' or ']'
constexpr uint8_t kArrNeedValue = 2;  // after ',': a value
// String phases.
constexpr uint8_t kStrChar = 0;
constexpr uint8_t kStrEscape = 1;  // after '\'
constexpr uint8_t kStrHex = 2;     // inside \uXXXX
// Number phases (accepting: kNumZero, kNumInt, kNumFrac, kNumExp).
constexpr uint8_t kNumStart = 0;
constexpr uint8_t kNumMinus = 1;
constexpr uint8_t kNumZero = 2;
constexpr uint8_t kNumInt = 3;
constexpr uint8_t kNumDot = 4;
constexpr uint8_t kNumFrac = 5;
constexpr uint8_t kNumE = 6;
constexpr uint8_t kNumExpSign = 7;
constexpr uint8_t kNumExp = 8;

constexpr int kMaxIntDigits = 15;
constexpr int kMaxFracDigits = 15;
constexpr int kMaxExpDigits = 2;  // 1e99 at most: every number fits a double

bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsHex(unsigned char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool IsSpace(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// A string pattern's automaton in a kString frame's `keys`: bit 0 the start, bits 1..62 the
// positions, bit 63 "a match was found" (an unanchored end: whatever follows is fine).
constexpr uint64_t kPatternMatched = uint64_t{1} << 63;

// The letters of JSON's one-letter escapes, and the byte each stands for (0 for another letter).
constexpr char kEscapeLetters[] = "\"\\/bfnrt";
unsigned char Unescaped(unsigned char c) {
  switch (c) {
    case '"':
    case '\\':
    case '/':
      return c;
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return 0;
  }
}

SchemaNode Make(Kind kind) {
  SchemaNode n;
  n.kind = kind;
  return n;
}

// The concrete nodes a value of kAny becomes.
const SchemaNode* AnyOf(unsigned char c) {
  static const SchemaNode kObject = [] {
    SchemaNode n = Make(Kind::kObject);
    n.values = AnyValueNode();
    return n;
  }();
  static const SchemaNode kArray = [] {
    SchemaNode n = Make(Kind::kArray);
    n.items = AnyValueNode();
    return n;
  }();
  static const SchemaNode kString = Make(Kind::kString);
  static const SchemaNode kNumber = Make(Kind::kNumber);
  static const SchemaNode kLiterals = [] {
    SchemaNode n = Make(Kind::kLiteral);
    n.literals = {"false", "null", "true"};
    return n;
  }();
  if (c == '{') return &kObject;
  if (c == '[') return &kArray;
  if (c == '"') return &kString;
  if (c == '-' || IsDigit(c)) return &kNumber;
  if (c == 't' || c == 'f' || c == 'n') return &kLiterals;
  return nullptr;
}

}  // namespace

JsonMatcher::JsonMatcher(const SchemaNode* root, Whitespace ws) : whitespace_(ws) {
  stack_[0] = NewFrame(root);
  depth_ = 1;
}

// The suffix waits under the value and the prefix sits on top: literal frames, each closed
// once its one literal is matched.
JsonMatcher::JsonMatcher(const JsonSchema& schema, Whitespace ws) : whitespace_(ws) {
  depth_ = 0;
  if (schema.suffix() != nullptr) {
    stack_[depth_++] = LiteralFrame(schema.suffix());
  }
  stack_[depth_++] = NewFrame(schema.root());
  if (schema.prefix() != nullptr) {
    stack_[depth_++] = LiteralFrame(schema.prefix());
  }
}

JsonMatcher::State JsonMatcher::NewFrame(const SchemaNode* node, Frame frame, uint8_t phase) {
  State s{};
  s.node = node;
  s.frame = frame;
  s.phase = phase;
  return s;
}

JsonMatcher::State JsonMatcher::LiteralFrame(const SchemaNode* node) {
  State s = NewFrame(node, Frame::kLiteral);
  s.b = static_cast<int32_t>(node->literals.size());
  return s;
}

JsonMatcher& JsonMatcher::operator=(const JsonMatcher& other) {
  depth_ = other.depth_;
  whitespace_ = other.whitespace_;
  for (int i = 0; i < depth_; ++i) stack_[i] = other.stack_[i];
  return *this;
}

void JsonMatcher::AppendKey(std::string* key) const {
  auto put = [key](const auto& v) { key->append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(depth_);
  put(whitespace_);
  for (int i = 0; i < depth_; ++i) {
    const State& s = stack_[i];  // field by field: the struct's padding is not initialized
    put(s.node);
    put(s.frame);
    put(s.phase);
    put(s.whitespace);
    put(s.pending);
    put(s.count);
    put(s.a);
    put(s.b);
    put(s.keys);
  }
}

bool JsonMatcher::Feed(std::string_view bytes) {
  for (char c : bytes) {
    if (!Feed(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool JsonMatcher::Feed(unsigned char c) {
  while (depth_ > 0) {
    State& s = stack_[depth_ - 1];
    Step r = Step::kRejected;
    switch (s.frame) {
      case Frame::kValue:
        r = FeedValue(s, c);
        break;
      case Frame::kObject:
        r = FeedObject(s, c);
        break;
      case Frame::kArray:
        r = FeedArray(s, c);
        break;
      case Frame::kString:
        r = FeedString(s, c);
        break;
      case Frame::kNumber:
        r = FeedNumber(s, c);
        break;
      case Frame::kLiteral:
        r = FeedLiteral(s, c);
        break;
      case Frame::kRegex:
        r = FeedRegex(s, c);
        break;
    }
    if (r == Step::kTaken) return true;
    if (r == Step::kRejected) return false;
    --depth_;  // complete without c: c belongs to the frame below
  }
  return false;  // the value is closed: nothing may follow
}

bool JsonMatcher::Complete() const {
  if (depth_ == 0) return true;
  if (depth_ > 1) return false;
  const State& s = stack_[0];
  return (s.frame == Frame::kNumber && NumberComplete(s)) ||
         (s.frame == Frame::kLiteral && LiteralComplete(s)) ||
         (s.frame == Frame::kRegex && s.node->regex->Accepting(RegexState(s))) ||
         // A pattern that matches the empty text, before any byte.
         (s.frame == Frame::kValue && s.node->kind == Kind::kRegex &&
          s.node->regex->Accepting(ByteRegex::Start()));
}

ByteRegex::Mask JsonMatcher::RegexState(const State& s) {
  const uint64_t high = (uint64_t{static_cast<uint32_t>(s.a)} << 32) | static_cast<uint32_t>(s.b);
  return (static_cast<ByteRegex::Mask>(high) << 64) | s.keys;
}

void JsonMatcher::SetRegexState(State& s, ByteRegex::Mask m) {
  s.keys = static_cast<uint64_t>(m);
  const uint64_t high = static_cast<uint64_t>(m >> 64);
  s.a = static_cast<int32_t>(static_cast<uint32_t>(high >> 32));
  s.b = static_cast<int32_t>(static_cast<uint32_t>(high));
}

JsonMatcher::Step JsonMatcher::FeedRegex(State& s, unsigned char c) {
  const ByteRegex::Mask next = s.node->regex->Step(RegexState(s), c);
  if (next == 0) return Step::kRejected;  // raw text: nothing follows it
  SetRegexState(s, next);
  return Step::kTaken;
}

bool JsonMatcher::InFreeString() const {
  if (depth_ == 0) return false;
  const State& s = stack_[depth_ - 1];
  return s.frame == Frame::kString && s.phase == kStrChar && s.pending == 0 &&
         (s.node == nullptr || (s.node->max_length < 0 && s.node->pattern == nullptr));
}

bool JsonMatcher::Push(const State& s) {
  if (depth_ == kMaxDepth) return false;
  stack_[depth_++] = s;
  return true;
}

JsonMatcher::Step JsonMatcher::FeedWhitespace(State& s, unsigned char c) {
  if (!IsSpace(c)) {
    s.whitespace = 0;
    return Step::kEnded;  // not whitespace: the caller goes on with c
  }
  // A run is one space, or a newline and an indent of at most four spaces per enclosing
  // container; nothing before the root value. kSpaceRun marks a run begun with a space.
  constexpr uint8_t kSpaceRun = 0x80;
  int enclosing = s.frame == Frame::kObject || s.frame == Frame::kArray ? 1 : 0;
  for (const State* f = stack_; f < &s; ++f) {
    enclosing += f->frame == Frame::kObject || f->frame == Frame::kArray ? 1 : 0;
  }
  if (enclosing == 0 || c == '\t' || c == '\r' || whitespace_ == Whitespace::kCompact) {
    return Step::kRejected;
  }
  if (whitespace_ == Whitespace::kSpaced && (c != ' ' || s.whitespace != 0)) {
    return Step::kRejected;  // one space at most
  }
  if (s.whitespace == 0) {
    s.whitespace = c == ' ' ? (kSpaceRun | 1) : 1;
    return Step::kTaken;
  }
  const int limit = std::min(kMaxWhitespace, 1 + 4 * enclosing);
  if (c != ' ' || (s.whitespace & kSpaceRun) != 0 || s.whitespace >= limit) {
    return Step::kRejected;
  }
  ++s.whitespace;
  return Step::kTaken;
}

JsonMatcher::Step JsonMatcher::FeedValue(State& s, unsigned char c) {
  if (s.node->kind == Kind::kRegex) return Begin(s, s.node, c);  // raw text: its own spaces
  if (Step w = FeedWhitespace(s, c); w != Step::kEnded) return w;
  return Begin(s, s.node, c);
}

JsonMatcher::Step JsonMatcher::Begin(State& s, const SchemaNode* node, unsigned char c) {
  // A value whose smallest form nests deeper than the frames left could never be closed.
  if (!Fits(node, static_cast<int>(&s - stack_))) return Step::kRejected;
  switch (node->kind) {
    case Kind::kAny: {
      const SchemaNode* concrete = AnyOf(c);
      return concrete == nullptr ? Step::kRejected : Begin(s, concrete, c);
    }
    case Kind::kObject:
    case Kind::kTagged:  // an object whose node is chosen once its tag is read (FeedLiteral)
      if (c != '{') return Step::kRejected;
      s = NewFrame(node, Frame::kObject, kObjOpen);
      return Step::kTaken;
    case Kind::kArray:
      if (c != '[') return Step::kRejected;
      s = NewFrame(node, Frame::kArray, kArrOpen);
      return Step::kTaken;
    case Kind::kString:
      if (c != '"') return Step::kRejected;
      s = NewFrame(node, Frame::kString, kStrChar);
      s.keys = static_cast<uint64_t>(ByteRegex::Start());  // a pattern's automaton, if any
      if (node->pattern != nullptr && !node->pattern_end &&
          node->pattern->Accepting(ByteRegex::Start())) {
        s.keys |= kPatternMatched;  // a pattern that matches the empty text: any string
      }
      return Step::kTaken;
    case Kind::kNumber:
    case Kind::kInteger:
      s = NewFrame(node, Frame::kNumber, kNumStart);
      return FeedNumber(s, c);
    case Kind::kLiteral:
      s = LiteralFrame(node);
      return FeedLiteral(s, c);
    case Kind::kRegex:
      s = NewFrame(node, Frame::kRegex);
      SetRegexState(s, ByteRegex::Start());
      return FeedRegex(s, c);
    case Kind::kUnion:
      for (const SchemaNode* alternative : node->alternatives) {
        if (CanStartWith(*alternative, c)) return Begin(s, alternative, c);
      }
      return Step::kRejected;
  }
  return Step::kRejected;
}

JsonMatcher::Step JsonMatcher::FeedObject(State& s, unsigned char c) {
  const SchemaNode& n = *s.node;
  const int declared = static_cast<int>(n.properties.size());
  // Closed objects: s.count is the first property that may still come, s.b the key matched.
  // The keys that may come next: those up to the first required one, whose values fit above
  // this frame (a required one always does: the object fit).
  auto next_keys = [&] {
    uint64_t keys = 0;
    for (int j = s.count; j < declared; ++j) {
      if (Fits(n.properties[j].value, depth_)) keys |= uint64_t{1} << j;
      if (n.properties[j].required) break;
    }
    return keys;
  };
  // Open objects: a key (a string frame) and its value fit above this frame.
  const bool open_fits = !n.closed && Fits(n.values, depth_);
  auto can_close = [&] {
    if (!n.closed) return true;
    for (int j = s.count; j < declared; ++j) {
      if (n.properties[j].required) return false;
    }
    return true;
  };
  auto start_key = [&]() -> Step {
    if (!n.closed) {
      if (!open_fits) return Step::kRejected;
      s.phase = kObjColon;
      ++s.count;
      return Push(NewFrame(nullptr, Frame::kString, kStrChar)) ? Step::kTaken : Step::kRejected;
    }
    const uint64_t keys = next_keys();
    if (keys == 0) return Step::kRejected;
    s.keys = keys;
    s.a = 1;  // every key begins with its quote
    s.phase = kObjKey;
    return Step::kTaken;
  };
  if (s.phase == kObjKey) {
    uint64_t next = 0;
    for (uint64_t k = s.keys; k != 0; k &= k - 1) {
      const int j = std::countr_zero(k);
      const std::string& key = n.properties[j].key;
      if (static_cast<int>(key.size()) > s.a && static_cast<unsigned char>(key[s.a]) == c) {
        next |= uint64_t{1} << j;
      }
    }
    if (next == 0) return Step::kRejected;
    s.keys = next;
    ++s.a;
    for (uint64_t k = next; k != 0; k &= k - 1) {
      const int j = std::countr_zero(k);
      if (static_cast<int>(n.properties[j].key.size()) == s.a) {  // a key's closing quote
        s.b = j;
        s.count = j + 1;
        s.phase = kObjColon;
        break;
      }
    }
    return Step::kTaken;
  }
  if (Step w = FeedWhitespace(s, c); w != Step::kEnded) return w;
  switch (s.phase) {
    case kObjOpen:
      if (c == '}' && can_close()) {
        --depth_;
        return Step::kTaken;
      }
      return c == '"' ? start_key() : Step::kRejected;
    case kObjNeedKey:
      return c == '"' ? start_key() : Step::kRejected;
    case kObjColon: {
      if (c != ':') return Step::kRejected;
      s.phase = kObjAfter;
      const SchemaNode* value = n.closed ? n.properties[s.b].value : n.values;
      return Push(NewFrame(value)) ? Step::kTaken : Step::kRejected;
    }
    case kObjAfter:
      if (c == ',' && (n.closed ? next_keys() != 0 : open_fits)) {
        s.phase = kObjNeedKey;
        return Step::kTaken;
      }
      if (c == '}' && can_close()) {
        --depth_;
        return Step::kTaken;
      }
      return Step::kRejected;
    default:
      return Step::kRejected;
  }
}

JsonMatcher::Step JsonMatcher::FeedArray(State& s, unsigned char c) {
  const SchemaNode& n = *s.node;
  if (Step w = FeedWhitespace(s, c); w != Step::kEnded) return w;
  auto start_item = [&]() -> Step {
    if (n.max_items == 0 || !CanStartWith(*n.items, c) || !Fits(n.items, depth_)) {
      return Step::kRejected;
    }
    ++s.count;
    s.phase = kArrAfter;
    if (!Push(NewFrame(n.items))) return Step::kRejected;
    return FeedValue(stack_[depth_ - 1], c);
  };
  switch (s.phase) {
    case kArrOpen:
      if (c == ']' && n.min_items == 0) {
        --depth_;
        return Step::kTaken;
      }
      return start_item();
    case kArrAfter:
      if (c == ',' && (n.max_items < 0 || s.count < n.max_items)) {
        s.phase = kArrNeedValue;
        return Step::kTaken;
      }
      if (c == ']' && s.count >= n.min_items) {
        --depth_;
        return Step::kTaken;
      }
      return Step::kRejected;
    default:
      return start_item();
  }
}

bool JsonMatcher::PatternFeed(State& s, unsigned char x) {
  const SchemaNode* n = s.node;
  if (n == nullptr || n->pattern == nullptr || (s.keys & kPatternMatched) != 0) return true;
  ByteRegex::Mask next = n->pattern->Step(s.keys, x);
  if (!n->pattern_start) next |= ByteRegex::Start();  // a match may begin at any character
  if (next == 0) return false;
  s.keys = static_cast<uint64_t>(next);
  if (!n->pattern_end && n->pattern->Accepting(next)) s.keys |= kPatternMatched;
  return true;
}

bool JsonMatcher::PatternDone(const State& s) {
  const SchemaNode* n = s.node;
  if (n == nullptr || n->pattern == nullptr || (s.keys & kPatternMatched) != 0) return true;
  return n->pattern->Accepting(s.keys);
}

JsonMatcher::Step JsonMatcher::FeedString(State& s, unsigned char c) {
  const int max = s.node == nullptr ? -1 : s.node->max_length;
  const int min = s.node == nullptr ? 0 : s.node->min_length;
  const bool room = max < 0 || s.count < max;
  switch (s.phase) {
    case kStrEscape:
      if (const unsigned char x = Unescaped(c); x != 0) {
        if (!PatternFeed(s, x)) return Step::kRejected;
        ++s.count;
        s.phase = kStrChar;
        return Step::kTaken;
      }
      // \u escapes are not written under a pattern: which of their last digits keep the
      // pattern possible cannot be known at the 'u' (every character they write has a plain
      // form or a one-letter escape; JsonSchema refuses patterns that need the others).
      if (c == 'u' && (s.node == nullptr || s.node->pattern == nullptr)) {
        s.phase = kStrHex;
        s.a = 0;
        return Step::kTaken;
      }
      return Step::kRejected;
    case kStrHex:
      if (!IsHex(c) || (s.a == 0 && (c == 'd' || c == 'D'))) return Step::kRejected;
      if (++s.a == 4) {
        ++s.count;
        s.phase = kStrChar;
      }
      return Step::kTaken;
    default:
      break;
  }
  if (s.pending > 0) {  // a UTF-8 continuation byte; the first one's range depends on the lead
    unsigned char lo = 0x80, hi = 0xBF;
    if (s.b == 0xE0) lo = 0xA0;
    if (s.b == 0xED) hi = 0x9F;
    if (s.b == 0xF0) lo = 0x90;
    if (s.b == 0xF4) hi = 0x8F;
    if (c < lo || c > hi || !PatternFeed(s, c)) return Step::kRejected;
    s.b = 0;
    if (--s.pending == 0) ++s.count;
    return Step::kTaken;
  }
  if (c == '"') {
    if (s.count < min || !PatternDone(s)) return Step::kRejected;
    --depth_;
    return Step::kTaken;
  }
  if (!room || c < 0x20) return Step::kRejected;
  if (c == '\\') {
    if (s.node != nullptr && s.node->pattern != nullptr) {
      // Only where the pattern takes a character a one-letter escape writes.
      bool any = false;
      for (const char* letter = kEscapeLetters; *letter != '\0' && !any; ++letter) {
        State trial = s;
        any = PatternFeed(trial, Unescaped(static_cast<unsigned char>(*letter)));
      }
      if (!any) return Step::kRejected;
    }
    s.phase = kStrEscape;
    return Step::kTaken;
  }
  if (c < 0x80) {
    if (!PatternFeed(s, c)) return Step::kRejected;
    ++s.count;
    return Step::kTaken;
  }
  if (c >= 0xC2 && c <= 0xDF) {
    s.pending = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    s.pending = 2;
  } else if (c >= 0xF0 && c <= 0xF4) {
    s.pending = 3;
  } else {
    return Step::kRejected;
  }
  if (!PatternFeed(s, c)) {
    s.pending = 0;
    return Step::kRejected;
  }
  s.b = c;
  return Step::kTaken;
}

bool JsonMatcher::NumberComplete(const State& s) const {
  return s.phase == kNumZero || s.phase == kNumInt || s.phase == kNumFrac || s.phase == kNumExp;
}

JsonMatcher::Step JsonMatcher::FeedNumber(State& s, unsigned char c) {
  const bool integer = s.node->kind == Kind::kInteger;
  const bool digit = IsDigit(c);
  switch (s.phase) {
    case kNumStart:
      if (c == '-') {
        s.phase = kNumMinus;
        return Step::kTaken;
      }
      [[fallthrough]];
    case kNumMinus:
      if (!digit) return Step::kRejected;
      s.phase = c == '0' ? kNumZero : kNumInt;
      s.a = 1;
      return Step::kTaken;
    case kNumInt:
      if (digit) {
        if (s.a >= kMaxIntDigits) return Step::kRejected;
        ++s.a;
        return Step::kTaken;
      }
      [[fallthrough]];
    case kNumZero:
      if (!integer && c == '.') {
        s.phase = kNumDot;
        return Step::kTaken;
      }
      if (!integer && (c == 'e' || c == 'E')) {
        s.phase = kNumE;
        return Step::kTaken;
      }
      return digit ? Step::kRejected : Step::kEnded;
    case kNumDot:
      if (!digit) return Step::kRejected;
      s.phase = kNumFrac;
      s.b = 1;
      return Step::kTaken;
    case kNumFrac:
      if (digit) {
        if (s.b >= kMaxFracDigits) return Step::kRejected;
        ++s.b;
        return Step::kTaken;
      }
      if (c == 'e' || c == 'E') {
        s.phase = kNumE;
        return Step::kTaken;
      }
      return Step::kEnded;
    case kNumE:
      if (c == '+' || c == '-') {
        s.phase = kNumExpSign;
        return Step::kTaken;
      }
      [[fallthrough]];
    case kNumExpSign:
      if (!digit) return Step::kRejected;
      s.phase = kNumExp;
      s.count = 1;
      return Step::kTaken;
    case kNumExp:
      if (digit) {
        if (s.count >= kMaxExpDigits) return Step::kRejected;
        ++s.count;
        return Step::kTaken;
      }
      return Step::kEnded;
    default:
      return Step::kRejected;
  }
}

bool JsonMatcher::LiteralComplete(const State& s) const {
  return s.a < s.b && static_cast<int>(s.node->literals[s.a].size()) == s.count;
}

JsonMatcher::Step JsonMatcher::FeedLiteral(State& s, unsigned char c) {
  const std::vector<std::string>& literals = s.node->literals;
  // The candidates [a, b) share their first `count` bytes and are sorted, so those whose next
  // byte is c are contiguous.
  int lo = s.a;
  while (lo < s.b && !(static_cast<int>(literals[lo].size()) > s.count &&
                       static_cast<unsigned char>(literals[lo][s.count]) == c)) {
    ++lo;
  }
  if (lo == s.b) return LiteralComplete(s) ? Step::kEnded : Step::kRejected;
  int hi = lo;
  while (hi<s.b&& static_cast<int>(literals[hi].size())> s.count &&
         static_cast<unsigned char>(literals[hi][s.count]) == c) {
    ++hi;
  }
  s.a = lo;
  s.b = hi;
  ++s.count;
  // One candidate, fully matched: the literal is closed.
  if (hi - lo == 1 && static_cast<int>(literals[lo].size()) == s.count) {
    --depth_;
    // The tag of a tagged union (the only value its object frame holds; its string literals
    // close here, none being a prefix of another): the object is now the one it names, its
    // first property read.
    if (depth_ > 0) {
      State& object = stack_[depth_ - 1];
      if (object.frame == Frame::kObject && object.node->kind == Kind::kTagged) {
        object.node = object.node->alternatives[lo];
      }
    }
  }
  return Step::kTaken;
}

}  // namespace tandem::structured
