// A byte-at-a-time recognizer of the JSON texts a schema (structured/json_schema.h) accepts: a
// pushdown automaton whose stack holds one frame per open value. Feed() says whether a byte can
// come next; Complete() whether the text so far is one whole valid value. Every text it accepts
// and calls complete parses as JSON and validates against the schema.
//
// What it generates within the schema: no whitespace before or after the value, and none between
// tokens (compact JSON, the default: every space, newline and indent a model would write costs a
// token, and agent code often allows only 40-60); with Whitespace::kSpaced at most one space
// between tokens; with Whitespace::kIndent either one space or a newline and an indent of at most
// four spaces per enclosing container (kMaxWhitespace bytes at most), so that a model can indent
// but cannot stall in whitespace; object keys in the
// schema's order, numbers of at most 15 integer digits, 15 fraction digits and 2 exponent digits,
// strings of valid UTF-8 with no raw control characters and no \u escapes of surrogates, and values
// nested at most kMaxDepth deep. A value is begun only where its smallest form fits within
// kMaxDepth (SchemaNode::min_depth): every text it accepts can still be completed.
//
// A matcher is a plain value (a fixed array of frames): copying one is cheap, which the token
// mask (structured/token_mask.h) relies on.
#ifndef TANDEM_STRUCTURED_JSON_MATCHER_H_
#define TANDEM_STRUCTURED_JSON_MATCHER_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "structured/json_schema.h"

namespace tandem::structured {

class JsonMatcher {
 public:
  static constexpr int kMaxDepth = JsonSchema::kMaxDepth;
  static constexpr int kMaxWhitespace = 24;
  enum class Whitespace : uint8_t { kCompact, kSpaced, kIndent };

  // Expecting one value of `root` (which must outlive the matcher).
  explicit JsonMatcher(const SchemaNode* root, Whitespace ws = Whitespace::kCompact);
  // Expecting the schema's prefix, one value of its root, then its suffix.
  explicit JsonMatcher(const JsonSchema& schema, Whitespace ws = Whitespace::kCompact);

  // Consumes `byte` if it can come next and returns true; returns false (and the matcher is then
  // in an unspecified state: copy it first to try a byte) if it cannot.
  bool Feed(unsigned char byte);
  bool Feed(std::string_view bytes);

  // The text so far is a whole value: the text may end here.
  bool Complete() const;
  // Nothing more may follow: the value is closed and cannot be extended.
  bool Done() const { return depth_ == 0; }
  // Inside a string with no length limit, between characters: every byte that is plain string
  // content (no quote, backslash or control byte; UTF-8 whole characters) is accepted, whatever
  // the position. The token mask's fast path.
  bool InFreeString() const;
  // Appends bytes that are equal for two matchers of one schema exactly when their states are:
  // a matcher's continuations depend on its state alone, so what is computed for one state
  // (the token mask) holds for every matcher with the same key.
  void AppendKey(std::string* key) const;

  JsonMatcher(const JsonMatcher& other) { *this = other; }
  JsonMatcher& operator=(const JsonMatcher& other);

 private:
  enum class Frame : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral, kRegex };
  enum class Step { kTaken, kRejected, kEnded };  // kEnded: the frame is complete; pass the byte up

  // No default member initializers, so that the stack of a copied matcher is not zeroed first:
  // frames come from NewFrame and LiteralFrame.
  struct State {
    const SchemaNode* node;
    Frame frame;
    uint8_t phase;
    uint8_t whitespace;  // bytes in the current whitespace run
    uint8_t pending;     // UTF-8 continuation bytes still expected (strings)
    int32_t count;       // members, items, characters, bytes, or matched literal bytes
    int32_t a, b;        // per frame: candidate range, last lead byte, key bookkeeping
    uint64_t keys;       // kObject: the candidate properties of a key being matched
  };
  // A frame of `node` with every counter at zero; a kLiteral frame over all of node's literals.
  static State NewFrame(const SchemaNode* node, Frame frame = Frame::kValue, uint8_t phase = 0);
  static State LiteralFrame(const SchemaNode* node);

  Step FeedValue(State& s, unsigned char c);
  Step FeedObject(State& s, unsigned char c);
  Step FeedArray(State& s, unsigned char c);
  Step FeedString(State& s, unsigned char c);
  Step FeedNumber(State& s, unsigned char c);
  Step FeedLiteral(State& s, unsigned char c);
  // kRegex frames keep the automaton's state in keys (low half) and a, b (high half).
  Step FeedRegex(State& s, unsigned char c);
  // A string schema's pattern over the string's characters (escapes decoded), one byte at a
  // time; false when `x` cannot come next. PatternDone: whether the string may close here.
  static bool PatternFeed(State& s, unsigned char x);
  static bool PatternDone(const State& s);
  static ByteRegex::Mask RegexState(const State& s);
  static void SetRegexState(State& s, ByteRegex::Mask m);
  Step FeedWhitespace(State& s, unsigned char c);
  // Replaces frame `s` (a kValue) by the value `node` begun with byte c.
  Step Begin(State& s, const SchemaNode* node, unsigned char c);
  bool Push(const State& s);
  // Whether a value of `node` fits in frame `index` and the frames above it.
  static bool Fits(const SchemaNode* node, int index) {
    return index + node->min_depth <= kMaxDepth;
  }
  bool LiteralComplete(const State& s) const;
  bool NumberComplete(const State& s) const;

  State stack_[kMaxDepth];
  int depth_ = 0;
  Whitespace whitespace_ = Whitespace::kCompact;
};

}  // namespace tandem::structured

#endif  // TANDEM_STRUCTURED_JSON_MATCHER_H_
