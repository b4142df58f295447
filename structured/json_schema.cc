#include "structured/json_schema.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tandem::structured {

using Json = nlohmann::ordered_json;  // keeps `properties` in the schema's order

namespace {

constexpr int kMaxSchemaDepth = 64;
constexpr int kMaxProperties = 64;
constexpr int kMaxLiterals = 256;

const std::set<std::string, std::less<>>& Annotations() {
  static const auto* const kSet = new std::set<std::string, std::less<>>{
      "title", "description", "default",    "examples", "format",   "$schema",
      "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};
  return *kSet;
}

const std::set<std::string, std::less<>>& Supported() {
  static const auto* const kSet = new std::set<std::string, std::less<>>{
      "type",      "properties", "required", "additionalProperties",
      "items",     "minItems",   "maxItems", "minLength",
      "maxLength", "enum",       "const",    "anyOf",
      "oneOf",     "$ref",       "$defs",    "definitions"};
  return *kSet;
}

std::string Pointer(const std::string& path) { return path.empty() ? "/" : path; }

absl::Status Invalid(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("at ", Pointer(path), ": ", why));
}

// RFC 6901 escaping of one reference token.
std::string Token(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string TypeOf(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    case Json::value_t::string:
      return "string";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::null:
      return "null";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    default:
      return "number";
  }
}

SchemaNode LiteralNode(std::vector<std::string> literals) {
  SchemaNode n;
  n.kind = Kind::kLiteral;
  std::sort(literals.begin(), literals.end());
  literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
  n.literals = std::move(literals);
  return n;
}

}  // namespace

const SchemaNode* AnyValueNode() {
  static const SchemaNode kNode{};
  return &kNode;
}

bool CanStartWith(const SchemaNode& node, unsigned char b) {
  const bool number = b == '-' || (b >= '0' && b <= '9');
  switch (node.kind) {
    case Kind::kAny:
      return b == '{' || b == '[' || b == '"' || number || b == 't' || b == 'f' || b == 'n';
    case Kind::kObject:
      return b == '{';
    case Kind::kArray:
      return b == '[';
    case Kind::kString:
      return b == '"';
    case Kind::kNumber:
    case Kind::kInteger:
      return number;
    case Kind::kLiteral:
      return std::any_of(node.literals.begin(), node.literals.end(), [b](const std::string& l) {
        return static_cast<unsigned char>(l[0]) == b;
      });
    case Kind::kUnion:
      return std::any_of(node.alternatives.begin(), node.alternatives.end(),
                         [b](const SchemaNode* a) { return CanStartWith(*a, b); });
  }
  return false;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& doc, JsonSchema* out) : doc_(doc), out_(out) {}

  absl::StatusOr<const SchemaNode*> Compile(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) {
      return Invalid(path, absl::StrCat("nested deeper than ", kMaxSchemaDepth, " schemas"));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValueNode();
      return Invalid(path, "the schema false accepts no value");
    }
    if (!s.is_object()) return Invalid(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (!Supported().count(key) && !Annotations().count(key)) {
        return Invalid(path, absl::StrCat("keyword \"", key, "\" is not supported"));
      }
    }
    if (s.contains("$ref")) {
      for (const auto& [key, value] : s.items()) {
        if (key != "$ref" && key != "$defs" && key != "definitions" && !Annotations().count(key)) {
          return Invalid(path, absl::StrCat("\"$ref\" beside \"", key, "\" is not supported"));
        }
      }
      return Ref(s["$ref"], path + "/$ref", depth);
    }
    if (s.contains("enum") || s.contains("const")) return Literals(s, path);
    if (s.contains("anyOf") || s.contains("oneOf")) return Alternatives(s, path, depth);
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& e : t) {
          if (!e.is_string()) return Invalid(path + "/type", "type names must be strings");
          types.push_back(e.get<std::string>());
        }
      } else {
        return Invalid(path + "/type", "must be a type name or a non-empty list of them");
      }
      // number includes integer.
      if (std::count(types.begin(), types.end(), "number") > 0) {
        types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
      }
      std::sort(types.begin(), types.end());
      types.erase(std::unique(types.begin(), types.end()), types.end());
    } else if (s.contains("properties") || s.contains("required") ||
               s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return AnyValueNode();
    }
    std::vector<const SchemaNode*> nodes;
    for (const std::string& type : types) {
      auto n = Typed(s, type, path, depth);
      if (!n.ok()) return n.status();
      nodes.push_back(*n);
    }
    if (nodes.size() == 1) return nodes[0];
    SchemaNode u;
    u.kind = Kind::kUnion;
    u.alternatives = std::move(nodes);
    return Add(std::move(u), path);
  }

 private:
  absl::StatusOr<const SchemaNode*> Add(SchemaNode node, const std::string& path) {
    if (static_cast<int>(out_->nodes_.size()) >= JsonSchema::kMaxNodes) {
      return Invalid(path,
                     absl::StrCat("the schema needs more than ", JsonSchema::kMaxNodes, " nodes"));
    }
    out_->nodes_.push_back(std::make_unique<SchemaNode>(std::move(node)));
    return out_->nodes_.back().get();
  }

  static absl::StatusOr<int> Count(const Json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return -1;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30)) {
      return Invalid(absl::StrCat(path, "/", key), "must be a non-negative integer");
    }
    return static_cast<int>(v.get<int64_t>());
  }

  // s[min_key] into *lo (0 when absent) and s[max_key] into *hi (-1, no limit, when absent);
  // INVALID_ARGUMENT for a bad count or a max below the min.
  static absl::Status Bounds(const Json& s, const char* min_key, const char* max_key,
                             const std::string& path, int* lo, int* hi) {
    auto min = Count(s, min_key, path);
    if (!min.ok()) return min.status();
    auto max = Count(s, max_key, path);
    if (!max.ok()) return max.status();
    *lo = std::max(*min, 0);
    *hi = *max;
    if (*hi >= 0 && *hi < *lo) {
      return Invalid(absl::StrCat(path, "/", max_key), absl::StrCat("is less than ", min_key));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const SchemaNode*> Typed(const Json& s, const std::string& type,
                                          const std::string& path, int depth) {
    SchemaNode n;
    if (type == "object") {
      n.kind = Kind::kObject;
      std::set<std::string> required;
      if (s.contains("required")) {
        const Json& r = s["required"];
        if (!r.is_array()) return Invalid(path + "/required", "must be a list of names");
        for (const Json& e : r) {
          if (!e.is_string()) return Invalid(path + "/required", "must be a list of names");
          required.insert(e.get<std::string>());
        }
      }
      const Json* additional =
          s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
      if (s.contains("properties")) {
        const Json& props = s["properties"];
        if (!props.is_object()) return Invalid(path + "/properties", "must be an object");
        if (props.size() > kMaxProperties) {
          return Invalid(path + "/properties",
                         absl::StrCat("more than ", kMaxProperties, " properties"));
        }
        n.closed = true;
        for (const auto& [name, sub] : props.items()) {
          auto v = Compile(sub, absl::StrCat(path, "/properties/", Token(name)), depth + 1);
          if (!v.ok()) return v.status();
          n.properties.push_back({Json(name).dump(), *v, required.count(name) > 0});
          required.erase(name);
        }
      } else if (additional != nullptr && additional->is_boolean() && !additional->get<bool>()) {
        n.closed = true;  // {} only
      } else {
        n.values = AnyValueNode();
        if (additional != nullptr && !additional->is_boolean()) {
          auto v = Compile(*additional, path + "/additionalProperties", depth + 1);
          if (!v.ok()) return v.status();
          n.values = *v;
        }
      }
      if (!required.empty()) {
        return Invalid(
            path + "/required",
            absl::StrCat("\"", *required.begin(), "\" is required but not declared in properties"));
      }
      if (additional != nullptr && !additional->is_boolean() && !additional->is_object()) {
        return Invalid(path + "/additionalProperties", "must be a boolean or a schema");
      }
    } else if (type == "array") {
      n.kind = Kind::kArray;
      n.items = AnyValueNode();
      if (s.contains("items")) {
        if (s["items"].is_array()) {
          return Invalid(path + "/items", "a list of item schemas (tuple form) is not supported");
        }
        auto v = Compile(s["items"], path + "/items", depth + 1);
        if (!v.ok()) return v.status();
        n.items = *v;
      }
      if (absl::Status b = Bounds(s, "minItems", "maxItems", path, &n.min_items, &n.max_items);
          !b.ok()) {
        return b;
      }
    } else if (type == "string") {
      n.kind = Kind::kString;
      if (absl::Status b = Bounds(s, "minLength", "maxLength", path, &n.min_length, &n.max_length);
          !b.ok()) {
        return b;
      }
    } else if (type == "number" || type == "integer") {
      n.kind = type == "number" ? Kind::kNumber : Kind::kInteger;
    } else if (type == "boolean") {
      n = LiteralNode({"false", "true"});
    } else if (type == "null") {
      n = LiteralNode({"null"});
    } else {
      return Invalid(path + "/type", absl::StrCat("unknown type \"", type, "\""));
    }
    return Add(std::move(n), path);
  }

  absl::StatusOr<const SchemaNode*> Literals(const Json& s, const std::string& path) {
    for (const auto& [key, value] : s.items()) {
      if (key != "enum" && key != "const" && key != "type" && key != "$defs" &&
          key != "definitions" && !Annotations().count(key)) {
        return Invalid(path,
                       absl::StrCat("\"enum\" or \"const\" beside \"", key, "\" is not supported"));
      }
    }
    if (s.contains("enum") && s.contains("const")) {
      return Invalid(path, "\"enum\" and \"const\" together are not supported");
    }
    std::vector<Json> values;
    if (s.contains("const")) {
      values.push_back(s["const"]);
    } else {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) return Invalid(path + "/enum", "must be a non-empty list");
      if (e.size() > kMaxLiterals) {
        return Invalid(path + "/enum", absl::StrCat("more than ", kMaxLiterals, " values"));
      }
      values.assign(e.begin(), e.end());
    }
    std::set<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.insert(t.get<std::string>());
      } else if (t.is_array()) {
        for (const Json& x : t) {
          if (x.is_string()) types.insert(x.get<std::string>());
        }
      }
    }
    std::vector<std::string> literals;
    for (const Json& v : values) {
      const std::string type = TypeOf(v);
      const bool fits = types.empty() || types.count(type) > 0 ||
                        (type == "integer" && types.count("number") > 0);
      if (fits) literals.push_back(v.dump());
    }
    if (literals.empty()) return Invalid(path, "no enum value has the schema's type");
    return Add(LiteralNode(std::move(literals)), path);
  }

  absl::StatusOr<const SchemaNode*> Alternatives(const Json& s, const std::string& path,
                                                 int depth) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    for (const auto& [k, value] : s.items()) {
      if (k != key && k != "$defs" && k != "definitions" && !Annotations().count(k)) {
        return Invalid(path, absl::StrCat("\"", key, "\" beside \"", k, "\" is not supported"));
      }
    }
    const Json& list = s[key];
    const std::string here = absl::StrCat(path, "/", key);
    if (!list.is_array() || list.empty()) return Invalid(here, "must be a non-empty list");
    std::vector<const SchemaNode*> alternatives;
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = Compile(list[i], absl::StrCat(here, "/", i), depth + 1);
      if (!n.ok()) return n.status();
      if ((*n)->kind == Kind::kUnion) {
        alternatives.insert(alternatives.end(), (*n)->alternatives.begin(),
                            (*n)->alternatives.end());
      } else {
        alternatives.push_back(*n);
      }
    }
    for (int b = 0; b < 256; ++b) {
      int starts = 0;
      for (const SchemaNode* a : alternatives) starts += CanStartWith(*a, b) ? 1 : 0;
      if (starts > 1) {
        return Invalid(here,
                       "alternatives must begin differently (one object, one array, one string, "
                       "one number, or literals with different first characters)");
      }
    }
    if (alternatives.size() == 1) return alternatives[0];
    SchemaNode u;
    u.kind = Kind::kUnion;
    u.alternatives = std::move(alternatives);
    return Add(std::move(u), path);
  }

  absl::StatusOr<const SchemaNode*> Ref(const Json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return Invalid(path, "must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    const Json* target = nullptr;
    if (r == "#") {
      target = &doc_;
    } else {
      for (const char* defs : {"#/$defs/", "#/definitions/"}) {
        const std::string prefix = defs;
        if (r.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string section = prefix.substr(2, prefix.size() - 3);
        const std::string name = r.substr(prefix.size());
        if (doc_.is_object() && doc_.contains(section) && doc_[section].is_object() &&
            doc_[section].contains(name)) {
          target = &doc_[section][name];
        }
      }
    }
    if (target == nullptr) {
      return Invalid(path, absl::StrCat("\"", r,
                                        "\" is not \"#\" or a schema under #/$defs or "
                                        "#/definitions"));
    }
    // A placeholder first, so that a schema referring to itself finds it.
    auto placeholder = Add(SchemaNode{}, path);
    if (!placeholder.ok()) return placeholder.status();
    auto* node = const_cast<SchemaNode*>(*placeholder);
    refs_[r] = node;
    auto compiled = Compile(*target, r.substr(1), depth + 1);
    if (!compiled.ok()) return compiled.status();
    if (*compiled == node) return Invalid(path, "a reference that only refers to itself");
    *node = **compiled;
    return node;
  }

  const Json& doc_;
  JsonSchema* out_;
  std::map<std::string, SchemaNode*> refs_;
};

absl::StatusOr<std::shared_ptr<const JsonSchema>> JsonSchema::Compile(std::string_view schema_json,
                                                                      std::string_view prefix,
                                                                      std::string_view suffix) {
  Json doc = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("the schema is not valid JSON");
  auto schema = std::make_shared<JsonSchema>();
  SchemaCompiler compiler(doc, schema.get());
  auto root = compiler.Compile(doc, "", 0);
  if (!root.ok()) return root.status();
  schema->root_ = *root;
  auto text = [&](std::string_view t) -> const SchemaNode* {
    if (t.empty()) return nullptr;
    schema->nodes_.push_back(
        std::make_unique<SchemaNode>(LiteralNode({std::string(t.data(), t.size())})));
    return schema->nodes_.back().get();
  };
  schema->prefix_ = text(prefix);
  schema->suffix_ = text(suffix);
  return schema;
}

std::shared_ptr<const JsonSchema> JsonSchema::AnyObject() {
  static const std::shared_ptr<const JsonSchema> kSchema = [] {
    auto s = std::make_shared<JsonSchema>();
    SchemaNode n;
    n.kind = Kind::kObject;
    n.values = AnyValueNode();
    s->nodes_.push_back(std::make_unique<SchemaNode>(std::move(n)));
    s->root_ = s->nodes_.back().get();
    return s;
  }();
  return kSchema;
}

}  // namespace tandem::structured
