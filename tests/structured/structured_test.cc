// The JSON Schema compiler, the byte-level matcher and the token mask (structured/). The oracle
// for validity is the `jsonschema` Python package (tests/structured/validate_json.py): texts the
// matcher generates by random walks, for many schemas, must parse and validate there.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/step_progress.h"
#include "nlohmann/json.hpp"
#include "structured/json_matcher.h"
#include "structured/json_parse.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace tandem::structured {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const JsonSchema> MustCompile(const std::string& s) {
  auto c = JsonSchema::Compile(s);
  EXPECT_TRUE(c.ok()) << s << ": " << c.status();
  return c.ok() ? *c : nullptr;
}

// The texts below are written with a space after ':' and ','; the default (no whitespace) is
// checked by JsonMatcherTest.CompactByDefault.
bool Accepts(const JsonSchema& schema, const std::string& text,
             JsonMatcher::Whitespace ws = JsonMatcher::Whitespace::kSpaced) {
  JsonMatcher m(schema.root(), ws);
  return m.Feed(text) && m.Complete();
}
bool AcceptsIndented(const JsonSchema& schema, const std::string& text) {
  return Accepts(schema, text, JsonMatcher::Whitespace::kIndent);
}

// Several tools' call shapes (what a forced call over several tools compiles to): a union of
// objects told apart by their name, each with its own arguments.
constexpr char kToolCalls[] = R"({"anyOf": [
    {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments":
     {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
      "required": ["city"], "additionalProperties": false}},
     "required": ["name", "arguments"], "additionalProperties": false},
    {"type": "object", "properties": {"name": {"enum": ["get", "now"]}, "arguments":
     {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
     "required": ["name", "arguments"]},
    {"type": "null"}]})";

const std::vector<std::string>& Schemas() {
  static const auto* const kSchemas = new std::vector<std::string>{
      R"({"type": "object"})",
      R"(true)",
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
          "age": {"type": "integer"}}, "required": ["name", "age"],
          "additionalProperties": false})",
      R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
          "c": {"type": "number"}}, "required": ["b"]})",
      R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4})",
      R"({"type": "array", "items": {"enum": ["red", "green", 3, null, true]}})",
      R"({"type": "string", "minLength": 2, "maxLength": 5})",
      R"({"type": ["string", "null"]})",
      R"({"anyOf": [{"type": "object", "properties": {"x": {"type": "integer"}},
          "required": ["x"]}, {"type": "array", "maxItems": 2}, {"const": "none"}]})",
      R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
          "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
          "required": ["value"]}}, "$ref": "#/$defs/node"})",
      R"({"type": "object", "additionalProperties": {"type": "number"}})",
      R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string",
          "maxLength": 4}}, "meta": {"type": "object"}}, "required": ["tags", "meta"]})",
      R"({"enum": [1, 12, 123]})",
      R"({"type": "number"})",
      R"({"type": "object", "properties": {"q": {"type": "string", "format": "date",
          "description": "a date"}}, "required": ["q"], "title": "t"})",
      R"({"type": "object", "additionalProperties": false})",
      R"({"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]})",
      R"({"type": "object", "properties": {"w\"eird/key~": {"const": {"k": [1, 2]}}},
          "required": ["w\"eird/key~"]})",
      R"({"type": "array", "items": {"type": "array", "items": {"type": "boolean"},
          "minItems": 1}, "minItems": 1, "maxItems": 3})",
      R"({"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"},
          "ok": {"type": "boolean"}}, "required": ["id", "ok"]})",
      // Tagged unions: objects told apart by the string const (or enum) of their first property.
      kToolCalls,
      // Patterns: anchored at both ends, at the start only, and anywhere (JSON Schema's search;
      // with brackets among its characters, so that the walk's closing bytes can satisfy it).
      R"({"type": "object", "properties": {
          "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
          "code": {"type": "string", "pattern": "^[0-9]{3}-\\d$"},
          "tag": {"type": "string", "pattern": "^x"},
          "note": {"type": "string", "pattern": "[aeiou}\\]]"}},
          "required": ["email", "code", "tag", "note"]})",
      R"({"type": "array", "maxItems": 3, "items": {"oneOf": [
          {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
           "required": ["kind", "r"]},
          {"type": "object", "properties": {"kind": {"const": "square"},
           "side": {"type": "integer"}, "label": {"type": "string", "maxLength": 3}},
           "required": ["kind"]},
          {"type": "string", "maxLength": 2}]}})",
  };
  return *kSchemas;
}

// By default the matcher admits no whitespace at all between JSON tokens (each space is a token
// a model would spend); kSpaced admits one space, kIndent newlines and indents.
TEST(JsonMatcherTest, CompactByDefault) {
  const auto person = MustCompile(
      R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]})");
  ASSERT_NE(person, nullptr);
  JsonMatcher compact(person->root());
  EXPECT_TRUE(compact.Feed(R"({"name":"Bo","age":7})") && compact.Complete());
  for (const char* spaced : {R"({ "name":"Bo","age":7})", R"({"name": "Bo","age":7})",
                             R"({"name":"Bo", "age":7})", R"({"name":"Bo","age":7 })"}) {
    JsonMatcher m(person->root());
    EXPECT_FALSE(m.Feed(spaced) && m.Complete()) << spaced;
  }
  EXPECT_TRUE(Accepts(*person, R"({"name": "Bo", "age": 7})", JsonMatcher::Whitespace::kSpaced));
  EXPECT_FALSE(Accepts(*person, R"({"name":  "Bo", "age": 7})", JsonMatcher::Whitespace::kSpaced));
}

// A forced stretch of text is written in the fewest tokens the vocabulary has for it: only the
// longest token inside it is allowed (and tokens covering all of it), not the model's choice of
// short pieces; where the text branches, every valid token is allowed again.
TEST(TokenMaskTest, ForcedTextIsWrittenInTheLongestTokens) {
  const auto schema = structured::JsonSchema::Compile(R"({"const": "get_weather"})",
                                                      "<tool_call>\n", "\n</tool_call>");
  ASSERT_TRUE(schema.ok()) << schema.status();
  const std::vector<std::string> vocab = {"<",  "t",   "tool",    "_",        "call", ">", "\n",
                                          "\"", "get", "weather", "_weather", "</",   ""};
  const TokenMask mask(vocab);
  const std::vector<int> eos = {12};
  JsonMatcher m(**schema);
  EXPECT_EQ(TokenMask::ForcedText(m, '<'), "<tool_call>\n\"get_weather\"\n</tool_call>");
  std::string written;
  std::vector<int> ids;
  for (int step = 0; step < 20 && !m.Done(); ++step) {
    std::vector<uint8_t> allowed;
    mask.Allowed(m, eos, &allowed);
    std::vector<int> choices;
    for (int id = 0; id < static_cast<int>(vocab.size()); ++id) {
      if (allowed[id]) choices.push_back(id);
    }
    ASSERT_EQ(choices.size(), 1u) << "after " << written;  // everything here is forced
    if (choices[0] == 12) break;
    ASSERT_TRUE(mask.Advance(&m, choices[0]));
    written += vocab[choices[0]];
    ids.push_back(choices[0]);
  }
  EXPECT_EQ(written, "<tool_call>\n\"get_weather\"\n</tool_call>");
  EXPECT_EQ(ids, (std::vector<int>{0, 2, 3, 4, 5, 6, 7, 8, 10, 7, 6, 11, 2, 3, 4, 5}));
}

// A text the matcher accepts, grown one random allowed byte at a time (printable ASCII,
// whitespace and the bytes of two multi-byte characters); past a quarter of max_bytes it closes
// strings, objects and arrays whenever it may. nullopt if it does not end within max_bytes.
std::optional<std::string> RandomWalk(const JsonSchema& schema, std::mt19937* rng,
                                      size_t max_bytes) {
  static const std::string kAlphabet = [] {
    std::string a;
    for (int c = 0x20; c < 0x7f; ++c) a += static_cast<char>(c);
    return a + "\n\t\xc3\xa9\xf0\x9f\x98\x80";
  }();
  JsonMatcher m(schema.root());
  std::string out;
  while (out.size() < max_bytes) {
    if (m.Complete() && (m.Done() || (*rng)() % 4 == 0)) return out;
    std::vector<unsigned char> ok, closing;
    for (char ch : kAlphabet) {
      const auto c = static_cast<unsigned char>(ch);
      JsonMatcher trial = m;
      if (!trial.Feed(c)) continue;
      ok.push_back(c);
      if (c == '"' || c == '}' || c == ']') closing.push_back(c);
    }
    if (ok.empty()) {
      if (m.Complete()) return out;  // a number or literal that nothing may extend
      ADD_FAILURE() << "dead end after " << out;
      return std::nullopt;
    }
    const std::vector<unsigned char>& from =
        out.size() > max_bytes / 4 && !closing.empty() ? closing : ok;
    const unsigned char pick = from[(*rng)() % from.size()];
    EXPECT_TRUE(m.Feed(pick));
    out += static_cast<char>(pick);
  }
  return std::nullopt;
}

TEST(JsonSchemaTest, UnsupportedKeywordsAndBadSchemasNameWhatAndWhere) {
  struct Case {
    const char* schema;
    std::vector<std::string> words;
  };
  const Case cases[] = {
      {R"({"type": "string", "pattern": "(a)\\1"})", {"at /pattern", "backreferences"}},
      {R"({"type": "string", "pattern": "a", "maxLength": 3})", {"at /pattern", "maxLength"}},
      {R"({"type": "string", "pattern": ".{7}"})", {"at /pattern", "positions"}},
      {R"({"type": "string", "pattern": 5})", {"at /pattern", "string"}},
      {R"({"type": "string", "pattern": "a\\x01"})", {"at /pattern", "control character"}},
      {R"({"type": "string", "minimum": 1})", {"at /", "\"minimum\""}},
      {R"({"properties": {"a": {"minimum": 1}}})", {"/properties/a", "\"minimum\""}},
      {R"({"$ref": "#/$defs/missing"})", {"/$ref", "#/$defs/missing"}},
      {R"({"properties": {}, "required": ["x"]})", {"/required", "\"x\""}},
      {R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})", {"/anyOf", "differently"}},
      {R"({"type": "strin"})", {"/type", "unknown type"}},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", {"/maxItems"}},
      {R"({"type": "string", "maxLength": -1})", {"/maxLength", "non-negative"}},
      {R"({"items": [{"type": "integer"}]})", {"/items", "tuple"}},
      {R"(false)", {"accepts no value"}},
      {R"([1, 2])", {"object or a boolean"}},
      {"not json", {"not valid JSON"}},
  };
  for (const Case& c : cases) {
    auto s = JsonSchema::Compile(c.schema);
    ASSERT_FALSE(s.ok()) << c.schema;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    for (const std::string& w : c.words) {
      EXPECT_NE(std::string(s.status().message()).find(w), std::string::npos)
          << c.schema << " -> " << s.status().message();
    }
  }
}

// ParseJson gives ordered_json's own parse: the same document, keys in the text's order, a
// repeated key's last value at its first place, the same errors; in linear time, so an object of
// 200k keys (ordered_json's parser: minutes) is parsed at once.
TEST(JsonParseTest, SameDocumentAsOrderedJsonInLinearTime) {
  const std::vector<std::string> texts = {
      R"({"b": 1, "a": [true, false, null, -2, 3.5, "x"], "c": {"d": {}, "e": []}})",
      R"({"k": 1, "j": 2, "k": {"z": 3}, "j": [4]})",  // repeated keys, each before 16 keys
      R"([[[[1]]], {"\u00e9": "\n"}, 18446744073709551615, -9223372036854775808, 1e308])",
      R"("just a string")",
      "  7  ",
  };
  std::string many = "{";  // 40 keys, then every one of them again: the hashed path
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 40; ++i) absl::StrAppend(&many, "\"k", i, "\": ", round * 100 + i, ",");
  }
  many += "\"last\": {\"k0\": 1, \"k0\": 2}}";
  std::vector<std::string> all = texts;
  all.push_back(many);
  for (const std::string& text : all) {
    absl::StatusOr<Json> got = ParseJson(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status();
    const Json want = Json::parse(text);
    EXPECT_EQ(got->dump(), want.dump()) << text;
  }
  for (const std::string bad : {"{", R"({"a" 1})", "[1,]", "{} x", ""}) {
    absl::StatusOr<Json> got = ParseJson(bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("parse error"), std::string::npos) << got.status();
  }
  std::string huge = "{";
  for (int i = 0; i < 200000; ++i) absl::StrAppend(&huge, i ? ",\"" : "\"", i, "\":", i);
  huge += "}";
  absl::StatusOr<Json> got = ParseJson(huge);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 200000u);
  EXPECT_EQ(got->begin().key(), "0");
  EXPECT_EQ((*got)["199999"], 199999);
}

TEST(JsonParseTest, StopsWhenCancelled) {
  std::string big = "[";
  for (int i = 0; i < 100000; ++i) big += i ? ",1" : "1";
  big += "]";
  int polls = 0;
  absl::StatusOr<Json> got = ParseJson(big, [&] { return ++polls == 3; });
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_EQ(polls, 3);  // polled every 4096 values, stopped at the first yes
  EXPECT_TRUE(ParseJson(big, [] { return false; }).ok());
}

TEST(JsonMatcherTest, AcceptsValidTextsAndRejectsInvalidOnes) {
  const auto person = MustCompile(Schemas()[2]);
  EXPECT_TRUE(Accepts(*person, R"({"name": "Bo", "age": 7})"));
  EXPECT_TRUE(Accepts(*person, R"({"name":"Bo","age":7})"));
  // Compact by default: no newline, one space at most.
  const std::string indented = "{\n    \"name\" : \"B\xc3\xa9\",\n    \"age\": -12\n}";
  EXPECT_FALSE(Accepts(*person, indented));
  EXPECT_TRUE(AcceptsIndented(*person, indented));
  EXPECT_FALSE(AcceptsIndented(*person, "{\n      \"name\": \"Bo\", \"age\": 7}"));  // indent 6
  EXPECT_FALSE(Accepts(*person, "{  \"name\": \"Bo\", \"age\": 7}"));                // two spaces
  EXPECT_FALSE(AcceptsIndented(*person, "{  \"name\": \"Bo\", \"age\": 7}"));
  EXPECT_FALSE(AcceptsIndented(*person, "{\n\n\"name\": \"Bo\", \"age\": 7}"));  // two newlines
  EXPECT_FALSE(Accepts(*person, "{\t\"name\": \"Bo\", \"age\": 7}"));
  EXPECT_FALSE(Accepts(*person, R"({"name": "Bo"})"));                    // age is required
  EXPECT_FALSE(Accepts(*person, R"({"name": "Bo", "age": 7, "z": 1})"));  // closed
  EXPECT_FALSE(Accepts(*person, R"({"name": 1, "age": 7})"));
  EXPECT_FALSE(Accepts(*person, R"({"name": "0123456789abc", "age": 7})"));  // maxLength 12
  EXPECT_FALSE(Accepts(*person, R"({"name": "Bo", "age": 7.5})"));
  EXPECT_FALSE(Accepts(*person, R"({"name": "Bo", "age": 07})"));
  EXPECT_FALSE(Accepts(*person, R"({"name": "Bo", "age": 7} x)"));
  EXPECT_FALSE(Accepts(*person, "{\"name\": \"B\x01\", \"age\": 7}"));  // raw control byte
  EXPECT_FALSE(Accepts(*person, "{\"name\": \"B\xff\", \"age\": 7}"));  // not UTF-8
  EXPECT_FALSE(Accepts(*person, R"({"name": "\ud83d", "age": 7})"));    // lone surrogate

  const auto ints = MustCompile(Schemas()[4]);
  EXPECT_TRUE(Accepts(*ints, "[1, 2]"));
  EXPECT_FALSE(Accepts(*ints, "[1]"));
  EXPECT_FALSE(Accepts(*ints, "[1, 2, 3, 4, 5]"));
  const auto tree = MustCompile(Schemas()[9]);
  EXPECT_TRUE(Accepts(*tree, R"({"value": 1, "children": [{"value": 2, "children": []}]})"));
  EXPECT_FALSE(Accepts(*tree, R"({"value": 1, "children": [{}]})"));
  const auto numbers = MustCompile(Schemas()[12]);
  EXPECT_TRUE(Accepts(*numbers, "1"));
  EXPECT_TRUE(Accepts(*numbers, "12"));
  EXPECT_FALSE(Accepts(*numbers, "1234"));
  const auto any = MustCompile(Schemas()[1]);
  EXPECT_TRUE(Accepts(*any, R"([{"a": [true, false, null, -1.5e+3, "x\n\u00e9"]}])"));
  EXPECT_FALSE(Accepts(*any, "[1,]"));
  EXPECT_TRUE(Accepts(*JsonSchema::AnyObject(), R"({"k": [1, {"j": null}]})"));
  EXPECT_FALSE(Accepts(*JsonSchema::AnyObject(), "[]"));
}

// vLLM's guided_choice: exactly one of the strings, as raw text (no quotes, no whitespace),
// one that is a prefix of another included; the token mask ends it with EOS only once whole.
TEST(JsonSchemaTest, ChoiceIsOneOfTheStringsAsRawText) {
  auto choice = JsonSchema::Choice({"yes", "no", "yes!", "n\u00e9\"e", "no"});
  ASSERT_TRUE(choice.ok()) << choice.status();
  for (const char* text : {"yes", "no", "yes!", "n\u00e9\"e"}) {
    EXPECT_TRUE(Accepts(**choice, text)) << text;
  }
  for (const char* text : {"", "ye", "\"yes\"", " yes", "yes ", "nope", "yes!!"}) {
    EXPECT_FALSE(Accepts(**choice, text)) << text;
  }
  const TokenMask mask({"y", "es", "yes", "!", "no", "\"", ""});
  JsonMatcher m(**choice);
  std::vector<uint8_t> allowed;
  mask.Allowed(m, std::vector<int>{6}, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0, 0}));
  ASSERT_TRUE(mask.Advance(&m, 2));  // "yes": complete, or "!" to come
  mask.Allowed(m, std::vector<int>{6}, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 0, 0, 1, 0, 0, 1}));
  ASSERT_TRUE(mask.Advance(&m, 3));  // "yes!": only EOS
  mask.Allowed(m, std::vector<int>{6}, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1}));

  EXPECT_FALSE(JsonSchema::Choice({}).ok());
  EXPECT_FALSE(JsonSchema::Choice({"a", ""}).ok());
  EXPECT_FALSE(JsonSchema::Choice(std::vector<std::string>(JsonSchema::kMaxChoices + 1, "a")).ok());
  EXPECT_FALSE(JsonSchema::Choice({std::string(JsonSchema::kMaxChoiceBytes, 'a'), "b"}).ok());
}

TEST(JsonMatcherTest, NestingAndWhitespaceAreBounded) {
  const auto any = MustCompile("true");
  JsonMatcher m(any->root());
  int opened = 0;
  while (m.Feed('[')) ++opened;
  EXPECT_EQ(opened, JsonMatcher::kMaxDepth);
  JsonMatcher w(any->root());
  EXPECT_FALSE(w.Feed(' ')) << "no whitespace before the value";
  JsonMatcher inside(any->root(), JsonMatcher::Whitespace::kIndent);
  ASSERT_TRUE(inside.Feed("[[\n"));
  int spaces = 0;
  while (inside.Feed(' ')) ++spaces;
  EXPECT_EQ(spaces, 8) << "a newline and 4 spaces per enclosing container";
  JsonMatcher spaced(any->root(), JsonMatcher::Whitespace::kSpaced);
  EXPECT_FALSE(spaced.Feed("[[\n"));
  JsonMatcher one(any->root(), JsonMatcher::Whitespace::kSpaced);
  ASSERT_TRUE(one.Feed("[[ "));
  EXPECT_FALSE(one.Feed(' ')) << "spaced: one space";
  JsonMatcher compact(any->root());
  EXPECT_FALSE(compact.Feed("[[ ")) << "compact: none";
}

// Every case ({"schema", "text"}) through the `jsonschema` package (validate_json.py), which
// prints the ones it rejects; `name` names the file they pass through.
void ExpectJsonschemaAccepts(const Json& cases, const std::string& name) {
  const std::string path =
      ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << cases.dump();
  const std::string command =
      "python3 " + std::string(TANDEM_SOURCE_DIR) + "/tests/structured/validate_json.py " + path;
  EXPECT_EQ(std::system(command.c_str()), 0) << "jsonschema rejected a case (printed above)";
  std::remove(path.c_str());
}

// Every random walk, for every schema, parses and validates with the jsonschema package.
TEST(JsonMatcherTest, RandomWalksValidateAgainstJsonschema) {
  Json cases = Json::array();
  int unfinished = 0;
  for (size_t i = 0; i < Schemas().size(); ++i) {
    const auto schema = MustCompile(Schemas()[i]);
    ASSERT_NE(schema, nullptr);
    for (int seed = 0; seed < 25; ++seed) {
      std::mt19937 rng(1000 * i + seed);
      std::optional<std::string> text = RandomWalk(*schema, &rng, 400);
      if (!text) {
        ++unfinished;
        continue;
      }
      EXPECT_TRUE(Json::accept(*text)) << *text;
      cases.push_back({{"schema", Json::parse(Schemas()[i])}, {"text", *text}});
    }
  }
  EXPECT_LT(unfinished, 10);
  ExpectJsonschemaAccepts(cases, "structured_cases");
}

// The token mask's fast paths against trying every token, over random walks through a small
// vocabulary whose tokens cross value boundaries.
// Computing a mask notes progress to the step running on the thread (kernels/step_progress.h), so
// that a worker spending long on the masks of a wide pattern is not taken for a wedged one.
TEST(TokenMaskTest, AllowedNotesStepProgress) {
  const TokenMask mask({"{", "}", "\"a", "1", "12", " ", ""});
  const auto schema = MustCompile(R"({"type": "object"})");
  JsonMatcher m(schema->root());
  StepProgress progress;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const StepProgress::Clock::duration before = progress.Since();
  {
    const StepProgress::Scope scope(&progress);
    std::vector<uint8_t> allowed;
    const std::vector<int> eos_ids = {6};
    mask.Allowed(m, eos_ids, &allowed);
  }
  EXPECT_LT(progress.Since(), before);
}

// The tokens a mask allows among the `valid` ones (those the matcher accepts): all of them, but
// where exactly one byte may come next (among the tokens' first bytes) and the text forced from
// there is two bytes or more, only the longest valid token inside that text and the valid tokens
// that cover all of it.
std::set<int> ForcedOnly(const JsonMatcher& m, const std::vector<std::string>& vocab,
                         const std::vector<int>& valid) {
  std::set<unsigned char> firsts;
  for (int id : valid) firsts.insert(static_cast<unsigned char>(vocab[id][0]));
  std::set<int> all(valid.begin(), valid.end());
  if (firsts.size() != 1 || m.Complete()) return all;
  std::string forced(1, static_cast<char>(*firsts.begin()));
  JsonMatcher at = m;
  at.Feed(forced);
  while (forced.size() < TokenMask::kMaxForced && !at.Complete() && !at.Done()) {
    std::vector<int> next;
    for (int b = 0; b < 256; ++b) {
      JsonMatcher trial = at;
      if (trial.Feed(static_cast<unsigned char>(b))) next.push_back(b);
    }
    if (next.size() != 1) break;
    forced.push_back(static_cast<char>(next[0]));
    at.Feed(static_cast<unsigned char>(next[0]));
  }
  if (forced.size() < 2) return all;
  int best = -1;
  for (int id : valid) {
    if (forced.starts_with(vocab[id]) && (best < 0 || vocab[id].size() > vocab[best].size())) {
      best = id;
    }
  }
  if (best < 0) return all;
  std::set<int> kept = {best};
  for (int id : valid) {
    if (vocab[id].size() > forced.size() && vocab[id].starts_with(forced)) kept.insert(id);
  }
  return kept;
}

TEST(TokenMaskTest, AllowedEqualsTryingEveryToken) {
  std::vector<std::string> vocab = {
      "{",       "}",  "\"",    "\"a",       "a",        "b\"",          "\":",
      ":",       ",",  " ",     "1",         "12",       "2}",           "true",
      "fal",     "se", "null",  "[",         "]",        "\\",           "n",
      "u00",     "e9", "\xc3",  "\xa9",      "\xc3\xa9", "x\"}",         "\"name\"",
      "\"age\"", ": ", "-",     ".5",        "e+3",      "\"red\"",      "\n",
      "],",      "}]", "green", "\"value\"", "",         "\"children\"", "none\"",
      "\"x\"",   "0",  ", \"",  "\":\""};
  const int eos = static_cast<int>(vocab.size());
  vocab.push_back("");  // EOS: no bytes
  const TokenMask mask(vocab);
  const std::vector<int> eos_ids = {eos};
  std::mt19937 rng(7);
  int steps = 0;
  for (const std::string& text : Schemas()) {
    const auto schema = MustCompile(text);
    for (int walk = 0; walk < 10; ++walk) {
      JsonMatcher m(schema->root());
      for (int step = 0; step < 60; ++step, ++steps) {
        std::vector<uint8_t> allowed;
        mask.Allowed(m, eos_ids, &allowed);
        ASSERT_EQ(allowed.size(), vocab.size());
        std::vector<int> valid;
        for (int id = 0; id < eos; ++id) {
          JsonMatcher trial = m;
          if (!vocab[id].empty() && trial.Feed(vocab[id])) valid.push_back(id);
        }
        const std::set<int> want = ForcedOnly(m, vocab, valid);
        std::vector<int> choices;
        for (int id = 0; id < eos; ++id) {
          ASSERT_EQ(allowed[id] != 0, want.count(id) > 0)
              << text << " token " << id << " '" << vocab[id] << "'";
          if (allowed[id]) choices.push_back(id);
        }
        EXPECT_EQ(allowed[eos] != 0, m.Complete() || choices.empty());
        if (choices.empty()) break;
        ASSERT_TRUE(mask.Advance(&m, choices[rng() % choices.size()]));
      }
    }
  }
  EXPECT_GT(steps, 1000);
}

// A tagged union: the tag read first chooses the object, whose other properties then follow its
// own schema; tags that do not tell the objects apart are refused.
TEST(JsonSchemaTest, TaggedUnionsChooseTheObjectByItsTag) {
  const auto calls = MustCompile(kToolCalls);
  ASSERT_NE(calls, nullptr);
  EXPECT_EQ(calls->root()->kind, Kind::kUnion);  // the objects' tagged union, and null
  for (const char* text : {R"({"name": "get_weather", "arguments": {"city": "Paris"}})",
                           R"({"name": "get", "arguments": {"n": 3}})",
                           R"({"name":"now","arguments":{"n":-1}})", "null"}) {
    EXPECT_TRUE(Accepts(*calls, text)) << text;
  }
  EXPECT_TRUE(AcceptsIndented(*calls, "{\n  \"name\": \"now\",\n  \"arguments\": {\"n\": -1}\n}"));
  for (const char* text : {
           R"({"name": "get", "arguments": {"city": "Paris"}})",  // get's arguments
           R"({"name": "get_weather", "arguments": {"n": 1}})",   // get_weather's
           R"({"name": "get_weather", "arguments": {"description": ""}})",
           R"({"name": "other", "arguments": {}})",
           R"({"arguments": {"n": 1}, "name": "get"})",  // the tag comes first
           R"({"name": "get"})",                         // arguments are required
           R"({})",
       }) {
    EXPECT_FALSE(Accepts(*calls, text)) << text;
  }
  // The smallest value of a tagged union is its deepest object's: any tag may be chosen.
  const auto nested = MustCompile(R"({"anyOf": [
      {"type": "object", "properties": {"t": {"const": "flat"}}, "required": ["t"]},
      {"type": "object", "properties": {"t": {"const": "deep"}, "x": {"type": "array",
       "minItems": 1, "items": {"type": "array"}}}, "required": ["t", "x"]}]})");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->root()->kind, Kind::kTagged);
  EXPECT_EQ(nested->root()->min_depth, 3);

  struct Case {
    const char* schema;
    std::vector<std::string> words;
  };
  const Case bad[] = {
      // The same tag twice.
      {R"({"anyOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]},
          {"properties": {"k": {"enum": ["b", "a"]}}, "required": ["k"]}]})",
       {"at /anyOf", "two objects have the tag \"a\""}},
      // Tags that are not strings, a tag that may be left out, different first keys.
      {R"({"anyOf": [{"properties": {"k": {"const": 1}}, "required": ["k"]},
          {"properties": {"k": {"const": 2}}, "required": ["k"]}]})",
       {"at /anyOf", "differently"}},
      {R"({"anyOf": [{"properties": {"k": {"const": "a"}}},
          {"properties": {"k": {"const": "b"}}, "required": ["k"]}]})",
       {"at /anyOf", "differently"}},
      {R"({"anyOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]},
          {"properties": {"j": {"const": "b"}}, "required": ["j"]}]})",
       {"at /anyOf", "differently"}},
      // An object that needs no tag beside tagged ones.
      {R"({"anyOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]},
          {"type": "object"}]})",
       {"at /anyOf", "differently"}},
  };
  for (const Case& c : bad) {
    auto s = JsonSchema::Compile(c.schema);
    ASSERT_FALSE(s.ok()) << c.schema;
    for (const std::string& w : c.words) {
      EXPECT_NE(std::string(s.status().message()).find(w), std::string::npos)
          << c.schema << " -> " << s.status().message();
    }
  }
}

// ---- Recursion: schemas no finite value satisfies are refused; the others always complete ----

TEST(JsonSchemaTest, EndlessRecursionIsRefusedNamingTheRef) {
  struct Case {
    std::string schema;
    std::vector<std::string> words;
  };
  auto nested = [](int levels) {  // arrays that must hold arrays, `levels` deep
    std::string s = R"({"type": "string"})";
    for (int i = 1; i < levels; ++i) {
      s = absl::StrCat(R"({"type": "array", "minItems": 1, "items": )", s, "}");
    }
    return s;
  };
  const std::vector<Case> cases = {
      // The issue's schema: every array holds at least one array.
      {R"({"type": "array", "items": {"$ref": "#"}, "minItems": 1})",
       {"at /items/$ref", "\"#\"", "no finite value"}},
      {R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})",
       {"at /properties/next/$ref", "no finite value"}},
      {R"({"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}},
          "required": ["b"]}, "b": {"type": "array", "items": {"$ref": "#/$defs/a"},
          "minItems": 2}}, "$ref": "#/$defs/a"})",
       {"no finite value", "#/$defs/"}},
      // Every alternative is endless.
      {R"({"anyOf": [{"type": "array", "items": {"$ref": "#"}, "minItems": 1},
          {"type": "object", "properties": {"k": {"$ref": "#"}}, "required": ["k"]}]})",
       {"\"#\"", "no finite value"}},
      // Endless in an optional place is refused too: it describes nothing.
      {R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/loop"}}, "$defs": {"loop":
          {"type": "array", "items": {"$ref": "#/$defs/loop"}, "minItems": 1}}})",
       {"at /properties/x/$ref", "#/$defs/loop", "no finite value"}},
      // A cycle of references with no schema in it: it was taken for "any value".
      {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
          "$ref": "#/$defs/a"})",
       {R"("#/$defs/a" -> "#/$defs/b" -> "#/$defs/a")", "never reaches a schema"}},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
       {"never reaches a schema"}},
      {R"({"$ref": "#"})", {"never reaches a schema"}},
      {R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
          "$ref": "#/$defs/a"})",
       {"/anyOf/0", "before any value begins"}},
      // Finite, but deeper than the matcher's stack.
      {nested(40), {"at /", "40 levels", "at most 32"}},
  };
  for (const Case& c : cases) {
    auto s = JsonSchema::Compile(c.schema);
    ASSERT_FALSE(s.ok()) << c.schema;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    for (const std::string& w : c.words) {
      EXPECT_NE(std::string(s.status().message()).find(w), std::string::npos)
          << c.schema << " -> " << s.status().message();
    }
  }
  // A suffix waits under the value: one level fewer.
  EXPECT_TRUE(JsonSchema::Compile(nested(32)).ok());
  EXPECT_FALSE(JsonSchema::Compile(nested(33)).ok());
  EXPECT_TRUE(JsonSchema::Compile(nested(31), "<x>", "</x>").ok());
  auto with_suffix = JsonSchema::Compile(nested(32), "<x>", "</x>");
  ASSERT_FALSE(with_suffix.ok());
  EXPECT_NE(with_suffix.status().message().find("at most 31"), std::string::npos)
      << with_suffix.status();
}

// Recursion that can end: accepted, and a walk that opens every container it may still closes
// (no dead end at the nesting limit) with a text the jsonschema package validates.
TEST(JsonSchemaTest, RecursionThatCanEndAlwaysCompletes) {
  const std::vector<std::string> schemas = {
      R"({"type": "array", "items": {"$ref": "#"}})",
      R"({"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#"}},
          "required": ["v"]})",
      // Pydantic's Optional[Node]: a required property that may be null.
      R"({"$defs": {"Node": {"type": "object", "properties": {"value": {"type": "integer"},
          "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
          "required": ["value", "next"]}}, "$ref": "#/$defs/Node"})",
      // Another name for a schema that contains it.
      R"({"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/b"}}},
          "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
      R"({"anyOf": [{"type": "string", "maxLength": 2},
          {"type": "array", "items": {"$ref": "#"}, "minItems": 1, "maxItems": 2}]})",
      R"({"type": "object", "additionalProperties": {"$ref": "#"}})",
  };
  Json cases = Json::array();
  for (const std::string& text : schemas) {
    const auto schema = MustCompile(text);
    ASSERT_NE(schema, nullptr);
    for (int seed = 0; seed < 5; ++seed) {
      std::mt19937 rng(seed);
      JsonMatcher m(schema->root());
      std::string out;
      int deepest = 0, depth = 0;
      bool in_string = false;  // no backslash is ever taken: a quote toggles
      while (!(m.Complete() && m.Done()) && out.size() < 20000) {
        std::vector<unsigned char> ok;
        for (int c = 0x20; c < 0x7f; ++c) {
          JsonMatcher trial = m;
          if (c != '\\' && trial.Feed(static_cast<unsigned char>(c))) ok.push_back(c);
        }
        if (ok.empty()) break;
        auto first_of = [&](std::string_view wants) -> std::optional<unsigned char> {
          for (unsigned char w : wants) {
            if (std::find(ok.begin(), ok.end(), w) != ok.end()) return w;
          }
          return std::nullopt;
        };
        // Open whatever may be opened, then close everything; strings end at once.
        const std::optional<unsigned char> wanted = in_string          ? first_of("\"")
                                                    : out.size() < 600 ? first_of("[{\"n1:,")
                                                                       : first_of("]}");
        const unsigned char pick = wanted ? *wanted : ok[rng() % ok.size()];
        ASSERT_TRUE(m.Feed(pick));
        out += static_cast<char>(pick);
        if (pick == '"') in_string = !in_string;
        if (!in_string && pick != '"') {
          depth += (pick == '[' || pick == '{') - (pick == ']' || pick == '}');
        }
        deepest = std::max(deepest, depth);
      }
      ASSERT_TRUE(m.Complete()) << text << ": a dead end after " << out;
      EXPECT_LE(deepest, JsonMatcher::kMaxDepth) << text;
      cases.push_back({{"schema", Json::parse(text)}, {"text", out}});
    }
  }
  ExpectJsonschemaAccepts(cases, "structured_recursive");
}

// A value is begun only where its smallest form fits: an object that needs 4 levels may start
// in frame 28, not in frame 29, where an array (1 level) still may.
TEST(JsonMatcherTest, NeverBeginsAValueThatCannotCloseInTime) {
  const auto schema = MustCompile(R"({"$defs": {"deep": {"type": "object", "properties": {"a":
      {"type": "object", "properties": {"b": {"type": "object", "properties": {"c":
      {"type": "string"}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]}},
      "type": "array", "items": {"anyOf": [{"$ref": "#"}, {"$ref": "#/$defs/deep"}]}})");
  ASSERT_NE(schema, nullptr);
  for (int arrays : {28, 29}) {
    JsonMatcher m(schema->root());
    ASSERT_TRUE(m.Feed(std::string(arrays, '[')));
    JsonMatcher object = m, array = m;
    EXPECT_EQ(object.Feed('{'), arrays == 28) << arrays;
    EXPECT_TRUE(array.Feed('[')) << arrays;
    if (arrays == 28) {
      EXPECT_TRUE(object.Feed(R"("a":{"b":{"c":"x"}}})" + std::string(28, ']')));
      EXPECT_TRUE(object.Complete() && object.Done());
    }
  }
  // The optional deep property of a closed object is left out where it cannot fit.
  const auto optional = MustCompile(R"({"type": "array", "items": {"anyOf": [{"$ref": "#"},
      {"type": "object", "properties": {"deep": {"$ref": "#/$defs/d"}, "z": {"type": "null"}}}]},
      "$defs": {"d": {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1,
      "items": {"type": "string"}}}}})");
  ASSERT_NE(optional, nullptr);
  JsonMatcher m(optional->root());
  ASSERT_TRUE(m.Feed(std::string(29, '[') + "{"));  // the object in frame 29: d needs 3 more
  JsonMatcher deep = m, z = m;
  EXPECT_FALSE(deep.Feed(R"("d)"));
  EXPECT_TRUE(z.Feed(R"("z":null})" + std::string(29, ']')));
  EXPECT_TRUE(z.Complete());
}

// A string's pattern runs over its characters with escapes decoded; unanchored, a match anywhere
// will do; the string closes only once the pattern is satisfied.
TEST(JsonSchemaTest, StringPatternsAreSearchedOverTheDecodedCharacters) {
  auto anchored = MustCompile(R"({"type": "string", "pattern": "^a\\nb[0-9]$"})");
  ASSERT_NE(anchored, nullptr);
  EXPECT_TRUE(Accepts(*anchored, R"("a\nb7")"));
  EXPECT_FALSE(Accepts(*anchored, R"("\u0061\nb7")"));  // no \u escapes under a pattern
  EXPECT_FALSE(Accepts(*anchored, R"("a\nb")"));        // cannot close before the digit
  EXPECT_FALSE(Accepts(*anchored, R"("a\nb77")"));
  EXPECT_FALSE(Accepts(*anchored, R"("xa\nb7")"));
  auto search = MustCompile(R"({"type": "string", "pattern": "\u00e9t\u00e9|[0-9]{2}"})");
  ASSERT_NE(search, nullptr);
  EXPECT_TRUE(Accepts(*search, "\"an \u00e9t\u00e9 day\""));
  EXPECT_TRUE(Accepts(*search, R"("in 1984")"));
  EXPECT_TRUE(Accepts(*search, "\"\u00e9t\u00e9\""));  // the characters themselves
  EXPECT_FALSE(Accepts(*search, R"("in 1 9")"));
  EXPECT_FALSE(Accepts(*search, R"("")"));
  auto start = MustCompile(R"({"type": "string", "pattern": "^ab"})");
  ASSERT_NE(start, nullptr);
  EXPECT_TRUE(Accepts(*start, R"("ab and more")"));
  EXPECT_FALSE(Accepts(*start, R"("xab")"));
  // The token mask's free-string fast path is off where a pattern constrains the characters.
  JsonMatcher m(start->root());
  ASSERT_TRUE(m.Feed('"'));
  EXPECT_FALSE(m.InFreeString());
}

// Whole-text matching against std::regex (ECMAScript) on every string of up to 4 bytes over an
// alphabet that exercises the patterns, and a few longer ones.
TEST(ByteRegexTest, FullMatchEqualsStdRegex) {
  const std::vector<std::string> patterns = {
      "abc",        "a|bc|",       "(ab)*c",    "a+b?",   "[a-c]{2}", "[^a]x",   "\\d{1,3}",
      "(?:a|b)+c*", "x{0,2}y{2,}", "\\w\\s\\W", ".b",     "^a*$",     "[a\\-c]", "(a|ab)(c|bcd)",
      "\\.\\*\\[",  "[\\d_]+",     "a{3}",      "(a*)*b", "a.*?b"};
  const std::string alphabet = "abcxy1_ .-*[";
  std::vector<std::string> texts = {""};
  for (int len = 1; len <= 4; ++len) {
    const size_t before = texts.size();
    for (size_t i = 0; i < before; ++i) {
      if (texts[i].size() != static_cast<size_t>(len - 1)) continue;
      for (char c : alphabet) texts.push_back(texts[i] + c);
    }
  }
  texts.push_back("12345");
  texts.push_back("xxyyyyy");
  texts.push_back(".*[");
  for (const std::string& pattern : patterns) {
    SCOPED_TRACE(pattern);
    auto re = ByteRegex::Compile(pattern);
    ASSERT_TRUE(re.ok()) << re.status();
    const std::regex oracle(pattern);
    for (const std::string& t : texts) {
      ByteRegex::Mask state = ByteRegex::Start();
      for (unsigned char c : t) {
        if (state != 0) state = (*re)->Step(state, c);
      }
      const bool got = state != 0 && (*re)->Accepting(state);
      ASSERT_EQ(got, std::regex_match(t, oracle)) << "\"" << t << "\"";
    }
  }
}

TEST(ByteRegexTest, DotAndNegatedClassesTakeWholeUtf8Characters) {
  auto re = JsonSchema::Regex("[^x]\u00e9.");
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_TRUE(Accepts(**re, "\u00fc\u00e9\u20ac"));
  EXPECT_TRUE(Accepts(**re, "a\u00e9\xf0\x9f\x98\x80"));
  EXPECT_FALSE(Accepts(**re, "x\u00e9a"));
  EXPECT_FALSE(Accepts(**re, "a\u00e9\n"));
  EXPECT_FALSE(Accepts(**re, "a\u00e9\xc3"));      // half a character
  EXPECT_FALSE(Accepts(**re, "a\u00e9\x80"));      // a lone continuation byte
  EXPECT_FALSE(Accepts(**re, " \u00e9\xc0\x80"));  // an overlong form
}

TEST(ByteRegexTest, WhatIsNotSupportedIsRefusedByName) {
  for (const auto& [pattern, what] : std::vector<std::pair<std::string, std::string>>{
           {"(a)\\1", "backreferences"},
           {"(?=a)a", "lookaround"},
           {"(?P<x>a)", "named groups"},
           {"a\\bc", "\\b"},
           {"a^b", "anchors"},
           {"[\u00e9]", "non-ASCII"},
           {"a{65}", "over 64"},
           {"a**", "repeated quantifiers"},
           {"(a", "missing ')'"},
           {"a)", "unbalanced"},
           {"[a", "missing ']'"},
           {"*a", "nothing to repeat"},
           {"[z-a]", "out of order"},
           {".{13}", "more than 127"},
           {"((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))", "32 deep"},
           {"((((a{0}){64}){64}){64}){64}", "too deeply"},
       }) {
    auto re = ByteRegex::Compile(pattern);
    ASSERT_FALSE(re.ok()) << pattern;
    EXPECT_EQ(re.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(re.status().message().find(what), std::string::npos) << re.status();
  }
  EXPECT_FALSE(ByteRegex::Compile(std::string(ByteRegex::kMaxPatternBytes + 1, 'a')).ok());
}

// The token mask under a regex: tokens whose bytes keep a match possible; EOS only where the
// text so far matches; only EOS once nothing can follow.
TEST(ByteRegexTest, TokenMaskFollowsThePattern) {
  auto re = JsonSchema::Regex("(yes|no) [0-9]{1,2}");
  ASSERT_TRUE(re.ok()) << re.status();
  const TokenMask mask({"y", "es", "yes ", "no", " ", "1", "23", "4 ", ""});
  JsonMatcher m(**re);
  std::vector<uint8_t> allowed;
  const std::vector<int> eos = {8};
  mask.Allowed(m, eos, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{1, 0, 1, 1, 0, 0, 0, 0, 0}));
  ASSERT_TRUE(mask.Advance(&m, 2));  // "yes "
  mask.Allowed(m, eos, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 1, 0, 0}));
  ASSERT_TRUE(mask.Advance(&m, 5));  // "yes 1": complete, or one more digit
  mask.Allowed(m, eos, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 0, 0, 1}));
  ASSERT_TRUE(mask.Advance(&m, 5));  // "yes 11": only EOS
  mask.Allowed(m, eos, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_TRUE(m.Complete());
  // A copied matcher carries the automaton's whole state (positions above 64 included).
  auto wide = JsonSchema::Regex("(ab){35}c");
  ASSERT_TRUE(wide.ok()) << wide.status();
  std::string abs;
  for (int i = 0; i < 35; ++i) abs += "ab";
  JsonMatcher w(**wide);
  ASSERT_TRUE(w.Feed(abs));
  JsonMatcher copy = w;
  EXPECT_FALSE(copy.Complete());
  EXPECT_TRUE(copy.Feed('c'));
  EXPECT_TRUE(copy.Complete());
  EXPECT_FALSE(w.Feed('a'));
  // A pattern that matches the empty text is complete before any byte (found by the fuzzer).
  auto star = JsonSchema::Regex("a*");
  ASSERT_TRUE(star.ok());
  EXPECT_TRUE(JsonMatcher(**star).Complete());
  EXPECT_FALSE(JsonMatcher(**wide).Complete());
}

}  // namespace
}  // namespace tandem::structured
