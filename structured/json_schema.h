// JSON Schema compiled for constrained decoding (OpenAI's response_format json_schema and
// json_object; also a choice of raw texts, vLLM's guided_choice, or raw text matching a regular
// expression, guided_regex): a graph of value nodes that
// JsonMatcher (structured/json_matcher.h) walks one byte at a time, so that every text it accepts
// is one JSON value valid against the schema.
//
// What is supported, and how each keyword is generated:
//   type              object, array, string, number, integer, boolean, null, or a list of them
//   properties        keys in the schema's order; a property not in `required` may be left out
//   required          names declared in `properties`
//   additionalProperties  false or true; a schema for the values of an object without
//                     `properties` (an object with `properties` only ever gets those)
//   items, minItems, maxItems, minLength, maxLength, enum, const
//   pattern           a regular expression (structured/byte_regex.h) the string contains a
//                     match of, as JSON Schema's ECMA-262 search (^ and $ anchor it); at most
//                     kMaxPatternPositions positions, and not beside minLength or maxLength
//   anyOf, oneOf      alternatives that begin differently (an object and a string, say), which
//                     the first byte of the value tells apart; and several objects among them
//                     when each has the same required first property whose value is a string
//                     const (or enum) of its own, the tag that tells them apart (a tagged union,
//                     such as one of several tools' calls: {"name": "a", "arguments": {...}})
//   $ref              to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion that can end)
//   annotations       title, description, default, examples, format, $schema, $id, $comment,
//                     deprecated, readOnly, writeOnly: accepted and not enforced (JSON Schema
//                     treats `format` as an annotation by default)
// Anything else (minimum, maximum, multipleOf, allOf, not, if, patternProperties, ...)
// is an INVALID_ARGUMENT naming the keyword and where it is, never silently ignored.
#ifndef TANDEM_STRUCTURED_JSON_SCHEMA_H_
#define TANDEM_STRUCTURED_JSON_SCHEMA_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "structured/byte_regex.h"

namespace tandem::structured {

enum class Kind {
  kAny,  // any JSON value
  kObject,
  kArray,
  kString,
  kNumber,
  kInteger,
  kLiteral,  // one of `literals` (enum, const, true/false/null)
  kUnion,    // one of `alternatives`, told apart by their first byte
  // Objects told apart by their first property (`properties[0]`, required, the same key in
  // each): its value is one of `properties[0].value`'s literals (strings, sorted), and literal
  // i chooses `alternatives[i]`, a closed object whose first property is that one.
  kTagged,
  kRegex,  // raw text (not JSON) matching `regex` as a whole (vLLM's guided_regex)
};

struct SchemaNode {
  Kind kind = Kind::kAny;
  // The nesting levels (JsonMatcher frames) the smallest value of this node needs: 1 for a
  // scalar, an empty container or a string; one more than its deepest required part for an
  // object with required properties or an array with minItems >= 1; the least of the
  // alternatives for a union; the most of them for a tagged union (its tag is chosen after the
  // object has begun). JsonMatcher enters a value only where it fits within kMaxDepth, so
  // a value it begins can always be closed.
  int min_depth = 1;

  // kObject. With `closed`, exactly the declared properties may appear, in their order; without,
  // any keys, each value matching `values`.
  struct Property {
    std::string key;  // the key as JSON text, quotes included: "\"name\""
    const SchemaNode* value = nullptr;
    bool required = false;
  };
  bool closed = false;
  std::vector<Property> properties;
  const SchemaNode* values = nullptr;

  // kArray.
  const SchemaNode* items = nullptr;
  int min_items = 0;
  int max_items = -1;  // -1: no limit

  // kString: lengths in characters (code points).
  int min_length = 0;
  int max_length = -1;
  // kString: `pattern`, which the string's characters (escapes decoded) must contain a match of:
  // anywhere, or from its start with ^ (pattern_start) and to its end with $ (pattern_end).
  std::shared_ptr<const ByteRegex> pattern;
  bool pattern_start = false;
  bool pattern_end = false;

  // kLiteral: the values as compact JSON texts, sorted and distinct.
  std::vector<std::string> literals;

  // kUnion; kTagged (one per tag literal, in the literals' order).
  std::vector<const SchemaNode*> alternatives;

  // kRegex.
  std::shared_ptr<const ByteRegex> regex;
};

// Whether `byte` can begin a value of `node` (a kUnion: of any alternative).
bool CanStartWith(const SchemaNode& node, unsigned char byte);

class JsonSchema {
 public:
  // A JSON Schema as JSON text. INVALID_ARGUMENT naming the keyword and its JSON pointer for
  // anything not supported (see above), for malformed JSON, and for limits: at most kMaxNodes
  // schema nodes, 64 properties per object, 256 enum values. Also refused, naming the $ref:
  // a schema no finite value satisfies (a $ref cycle through required structure, such as
  // `"items": {"$ref": "#"}, "minItems": 1`, anywhere in the schema), a $ref cycle that never
  // reaches a schema (a -> b -> a), and a schema whose smallest value nests deeper than
  // kMaxDepth. A cycle that can end (an optional property, an array that may be empty) is fine.
  // With `prefix` or `suffix`, the text is prefix, the value, suffix (a tool call's tags around
  // its JSON, say).
  static absl::StatusOr<std::shared_ptr<const JsonSchema>> Compile(std::string_view schema_json,
                                                                   std::string_view prefix = {},
                                                                   std::string_view suffix = {});
  // OpenAI's json_object: any JSON object.
  static std::shared_ptr<const JsonSchema> AnyObject();
  // Not JSON: exactly one of `choices`, as raw text (vLLM's guided_choice). INVALID_ARGUMENT for
  // none, an empty one, more than kMaxChoices, or more than kMaxChoiceBytes in all.
  static absl::StatusOr<std::shared_ptr<const JsonSchema>> Choice(
      const std::vector<std::string>& choices);
  // Not JSON: raw text matching `pattern` as a whole (vLLM's guided_regex; structured/
  // byte_regex.h says what is supported). INVALID_ARGUMENT naming what is not.
  static absl::StatusOr<std::shared_ptr<const JsonSchema>> Regex(std::string_view pattern);

  const SchemaNode* root() const { return root_; }
  // kLiteral nodes of one literal each, or null.
  const SchemaNode* prefix() const { return prefix_; }
  const SchemaNode* suffix() const { return suffix_; }

  static constexpr int kMaxNodes = 4096;
  // A string frame keeps a pattern's automaton in 64 bits: the start, the positions and a
  // "matched" bit.
  static constexpr int kMaxPatternPositions = 62;
  static constexpr int kMaxChoices = 256;
  static constexpr size_t kMaxChoiceBytes = 65536;
  // Nesting levels a value may have (JsonMatcher's stack, the suffix's frame included).
  static constexpr int kMaxDepth = 32;

 private:
  friend class SchemaCompiler;
  std::vector<std::unique_ptr<SchemaNode>> nodes_;
  const SchemaNode* root_ = nullptr;
  const SchemaNode* prefix_ = nullptr;
  const SchemaNode* suffix_ = nullptr;
};

// The shared nodes for any JSON value and for true/false/null.
const SchemaNode* AnyValueNode();

}  // namespace tandem::structured

#endif  // TANDEM_STRUCTURED_JSON_SCHEMA_H_
