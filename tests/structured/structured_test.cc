// The JSON Schema compiler, the byte-level matcher and the token mask (structured/). The oracle
// for validity is the `jsonschema` Python package (tests/structured/validate_json.py): texts the
// matcher generates by random walks, for many schemas, must parse and validate there.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "structured/json_matcher.h"
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

bool Accepts(const JsonSchema& schema, const std::string& text) {
  JsonMatcher m(schema.root());
  return m.Feed(text) && m.Complete();
}

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
  };
  return *kSchemas;
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
      {R"({"type": "string", "pattern": "a+"})", {"at /", "\"pattern\""}},
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

TEST(JsonMatcherTest, AcceptsValidTextsAndRejectsInvalidOnes) {
  const auto person = MustCompile(Schemas()[2]);
  EXPECT_TRUE(Accepts(*person, R"({"name": "Bo", "age": 7})"));
  EXPECT_TRUE(Accepts(*person, "{\n    \"name\" : \"B\xc3\xa9\",\n    \"age\": -12\n}"));
  EXPECT_FALSE(Accepts(*person, "{\n      \"name\": \"Bo\", \"age\": 7}"));  // indent 6
  EXPECT_FALSE(Accepts(*person, "{  \"name\": \"Bo\", \"age\": 7}"));        // two spaces
  EXPECT_FALSE(Accepts(*person, "{\n\n\"name\": \"Bo\", \"age\": 7}"));      // two newlines
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

TEST(JsonMatcherTest, NestingAndWhitespaceAreBounded) {
  const auto any = MustCompile("true");
  JsonMatcher m(any->root());
  int opened = 0;
  while (m.Feed('[')) ++opened;
  EXPECT_EQ(opened, JsonMatcher::kMaxDepth);
  JsonMatcher w(any->root());
  EXPECT_FALSE(w.Feed(' ')) << "no whitespace before the value";
  JsonMatcher inside(any->root());
  ASSERT_TRUE(inside.Feed("[[\n"));
  int spaces = 0;
  while (inside.Feed(' ')) ++spaces;
  EXPECT_EQ(spaces, 8) << "a newline and 4 spaces per enclosing container";
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
  const std::string path =
      ::testing::TempDir() + "/structured_cases_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << cases.dump();
  const std::string command =
      "python3 " + std::string(TANDEM_SOURCE_DIR) + "/tests/structured/validate_json.py " + path;
  EXPECT_EQ(std::system(command.c_str()), 0) << "jsonschema rejected a case (printed above)";
  std::remove(path.c_str());
}

// The token mask's fast paths against trying every token, over random walks through a small
// vocabulary whose tokens cross value boundaries.
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
        std::vector<int> choices;
        for (int id = 0; id < eos; ++id) {
          JsonMatcher trial = m;
          const bool want = !vocab[id].empty() && trial.Feed(vocab[id]);
          ASSERT_EQ(allowed[id] != 0, want) << text << " token " << id << " '" << vocab[id] << "'";
          if (want) choices.push_back(id);
        }
        EXPECT_EQ(allowed[eos] != 0, m.Complete() || choices.empty());
        if (choices.empty()) break;
        ASSERT_TRUE(mask.Advance(&m, choices[rng() % choices.size()]));
      }
    }
  }
  EXPECT_GT(steps, 1000);
}

}  // namespace
}  // namespace tandem::structured
