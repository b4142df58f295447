#include "structured/json_schema.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "structured/json_parse.h"
#include "structured/schema_graph.h"

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
      "type",       "properties", "required", "additionalProperties",
      "items",      "minItems",   "maxItems", "minLength",
      "maxLength",  "enum",       "const",    "anyOf",
      "pattern",    "oneOf",      "$ref",     "$defs",
      "definitions"};
  return *kSet;
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
    case Kind::kTagged:
      return b == '{';
    case Kind::kRegex:
      return node.regex->Step(ByteRegex::Start(), b) != 0;
  }
  return false;
}

class SchemaCompiler {
  // Schemas compiled inside an object or array (Typed's children): a $ref that comes back to a
  // schema being compiled with no container in between has no value to begin with.
  struct Inside {
    explicit Inside(int* n) : n(n) { ++*n; }
    ~Inside() { --*n; }
    int* n;
  };
  struct Pending {
    std::string ref;  // its target
    int containers;   // containers_ when it began
  };

 public:
  SchemaCompiler(const Json& doc, JsonSchema* out) : doc_(doc), out_(out) {}

  absl::StatusOr<const SchemaNode*> Compile(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) {
      return SchemaInvalid(path, absl::StrCat("nested deeper than ", kMaxSchemaDepth, " schemas"));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValueNode();
      return SchemaInvalid(path, "the schema false accepts no value");
    }
    if (!s.is_object()) return SchemaInvalid(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (!Supported().count(key) && !Annotations().count(key)) {
        return SchemaInvalid(path, absl::StrCat("keyword \"", key, "\" is not supported"));
      }
    }
    if (s.contains("$ref")) {
      for (const auto& [key, value] : s.items()) {
        if (key != "$ref" && key != "$defs" && key != "definitions" && !Annotations().count(key)) {
          return SchemaInvalid(path,
                               absl::StrCat("\"$ref\" beside \"", key, "\" is not supported"));
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
          if (!e.is_string()) return SchemaInvalid(path + "/type", "type names must be strings");
          types.push_back(e.get<std::string>());
        }
      } else {
        return SchemaInvalid(path + "/type", "must be a type name or a non-empty list of them");
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
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) {
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
      return SchemaInvalid(
          path, absl::StrCat("the schema needs more than ", JsonSchema::kMaxNodes, " nodes"));
    }
    out_->nodes_.push_back(std::make_unique<SchemaNode>(std::move(node)));
    return out_->nodes_.back().get();
  }

  static absl::StatusOr<int> Count(const Json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return -1;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30)) {
      return SchemaInvalid(absl::StrCat(path, "/", key), "must be a non-negative integer");
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
      return SchemaInvalid(absl::StrCat(path, "/", max_key),
                           absl::StrCat("is less than ", min_key));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const SchemaNode*> Typed(const Json& s, const std::string& type,
                                          const std::string& path, int depth) {
    Inside inside(&containers_);
    SchemaNode n;
    if (type == "object") {
      n.kind = Kind::kObject;
      std::set<std::string> required;
      if (s.contains("required")) {
        const Json& r = s["required"];
        if (!r.is_array()) return SchemaInvalid(path + "/required", "must be a list of names");
        for (const Json& e : r) {
          if (!e.is_string()) return SchemaInvalid(path + "/required", "must be a list of names");
          required.insert(e.get<std::string>());
        }
      }
      const Json* additional =
          s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
      if (s.contains("properties")) {
        const Json& props = s["properties"];
        if (!props.is_object()) return SchemaInvalid(path + "/properties", "must be an object");
        if (props.size() > kMaxProperties) {
          return SchemaInvalid(path + "/properties",
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
        return SchemaInvalid(
            path + "/required",
            absl::StrCat("\"", *required.begin(), "\" is required but not declared in properties"));
      }
      if (additional != nullptr && !additional->is_boolean() && !additional->is_object()) {
        return SchemaInvalid(path + "/additionalProperties", "must be a boolean or a schema");
      }
    } else if (type == "array") {
      n.kind = Kind::kArray;
      n.items = AnyValueNode();
      if (s.contains("items")) {
        if (s["items"].is_array()) {
          return SchemaInvalid(path + "/items",
                               "a list of item schemas (tuple form) is not supported");
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
      if (s.contains("pattern")) {
        if (absl::Status p = Pattern(s, path, &n); !p.ok()) return p;
      }
    } else if (type == "number" || type == "integer") {
      n.kind = type == "number" ? Kind::kNumber : Kind::kInteger;
    } else if (type == "boolean") {
      n = LiteralNode({"false", "true"});
    } else if (type == "null") {
      n = LiteralNode({"null"});
    } else {
      return SchemaInvalid(path + "/type", absl::StrCat("unknown type \"", type, "\""));
    }
    return Add(std::move(n), path);
  }

  // `pattern` of a string schema: compiled, its anchors noted.
  absl::Status Pattern(const Json& s, const std::string& path, SchemaNode* n) {
    const Json& p = s["pattern"];
    if (!p.is_string()) return SchemaInvalid(path + "/pattern", "must be a string");
    if (s.contains("minLength") || s.contains("maxLength")) {
      return SchemaInvalid(path + "/pattern", "beside minLength or maxLength is not supported");
    }
    const std::string text = p.get<std::string>();
    auto re = ByteRegex::Compile(text);
    if (!re.ok()) return SchemaInvalid(path + "/pattern", std::string(re.status().message()));
    if ((*re)->positions() > JsonSchema::kMaxPatternPositions) {
      return SchemaInvalid(
          path + "/pattern",
          absl::StrCat("needs ", (*re)->positions(), " character positions (at most ",
                       JsonSchema::kMaxPatternPositions,
                       "; repetitions count each copy, `.` counts 10)"));
    }
    // A JSON string writes control characters other than \b \f \n \r \t only as \u escapes,
    // which a string under a pattern does not use (structured/json_matcher.cc).
    if (!(*re)->EveryPositionAcceptsSome([](unsigned char b) {
          return b >= 0x20 || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t';
        })) {
      return SchemaInvalid(path + "/pattern",
                           "needs a control character a string can only write as a \\u escape");
    }
    n->pattern = *std::move(re);
    n->pattern_start = text.starts_with('^');
    n->pattern_end = text.ends_with('$') && !text.ends_with("\\$");
    return absl::OkStatus();
  }

  absl::StatusOr<const SchemaNode*> Literals(const Json& s, const std::string& path) {
    for (const auto& [key, value] : s.items()) {
      if (key != "enum" && key != "const" && key != "type" && key != "$defs" &&
          key != "definitions" && !Annotations().count(key)) {
        return SchemaInvalid(
            path, absl::StrCat("\"enum\" or \"const\" beside \"", key, "\" is not supported"));
      }
    }
    if (s.contains("enum") && s.contains("const")) {
      return SchemaInvalid(path, "\"enum\" and \"const\" together are not supported");
    }
    std::vector<Json> values;
    if (s.contains("const")) {
      values.push_back(s["const"]);
    } else {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty())
        return SchemaInvalid(path + "/enum", "must be a non-empty list");
      if (e.size() > kMaxLiterals) {
        return SchemaInvalid(path + "/enum", absl::StrCat("more than ", kMaxLiterals, " values"));
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
    if (literals.empty()) return SchemaInvalid(path, "no enum value has the schema's type");
    return Add(LiteralNode(std::move(literals)), path);
  }

  absl::StatusOr<const SchemaNode*> Alternatives(const Json& s, const std::string& path,
                                                 int depth) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    for (const auto& [k, value] : s.items()) {
      if (k != key && k != "$defs" && k != "definitions" && !Annotations().count(k)) {
        return SchemaInvalid(path,
                             absl::StrCat("\"", key, "\" beside \"", k, "\" is not supported"));
      }
    }
    const Json& list = s[key];
    const std::string here = absl::StrCat(path, "/", key);
    if (!list.is_array() || list.empty()) return SchemaInvalid(here, "must be a non-empty list");
    std::vector<const SchemaNode*> alternatives;
    bool deferred = false;  // an alternative is a $ref still being compiled
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = absl::StrCat(here, "/", i);
      auto n = Compile(list[i], at, depth + 1);
      if (!n.ok()) return n.status();
      if (const Pending* p = Circular(*n)) {
        return SchemaInvalid(at, absl::StrCat("refers back to \"", p->ref,
                                              "\" before any value begins: a $ref cycle that never "
                                              "reaches a schema"));
      }
      if (Unresolved(*n)) {
        deferred = true;  // a $ref around this one, as in {"anyOf": [{"$ref": "#"}, null]}
        alternatives.push_back(*n);
      } else if ((*n)->kind == Kind::kUnion) {
        alternatives.insert(alternatives.end(), (*n)->alternatives.begin(),
                            (*n)->alternatives.end());
      } else {
        alternatives.push_back(*n);
      }
    }
    if (!deferred) {
      if (absl::Status t = TagObjects(&alternatives, here); !t.ok()) return t;
    }
    if (alternatives.size() == 1) return alternatives[0];
    SchemaNode u;
    u.kind = Kind::kUnion;
    u.alternatives = std::move(alternatives);
    if (!deferred) {
      if (absl::Status d = Distinct(u, here); !d.ok()) return d;
    }
    auto added = Add(std::move(u), path);
    if (added.ok() && deferred) deferred_unions_.push_back({*added, here});
    return added;
  }

  // Replaces two or more objects among `alternatives` by one kTagged node, when every one of them
  // is closed and has the same required first property, whose value is string literals that no
  // other has: the tag, which the matcher reads before it knows which object it is in. Objects
  // that do not have that shape are left for Distinct to refuse.
  absl::Status TagObjects(std::vector<const SchemaNode*>* alternatives, const std::string& here) {
    std::vector<const SchemaNode*> objects;
    for (const SchemaNode* a : *alternatives) {
      if (a->kind == Kind::kObject) objects.push_back(a);
    }
    if (objects.size() < 2) return absl::OkStatus();
    std::vector<std::pair<std::string, const SchemaNode*>> tags;
    for (const SchemaNode* o : objects) {
      if (!o->closed || o->properties.empty() || objects[0]->properties.empty()) {
        return absl::OkStatus();
      }
      const SchemaNode::Property& first = o->properties[0];
      if (!first.required || first.key != objects[0]->properties[0].key ||
          Unresolved(first.value) || first.value->kind != Kind::kLiteral) {
        return absl::OkStatus();
      }
      for (const std::string& literal : first.value->literals) {
        if (literal.empty() || literal[0] != '"') return absl::OkStatus();
        tags.emplace_back(literal, o);
      }
    }
    std::sort(tags.begin(), tags.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 1; i < tags.size(); ++i) {
      if (tags[i].first == tags[i - 1].first) {
        return SchemaInvalid(here, absl::StrCat("two objects have the tag ", tags[i].first, " in ",
                                                objects[0]->properties[0].key,
                                                ": alternatives must begin differently"));
      }
    }
    std::vector<std::string> literals;
    SchemaNode t;
    t.kind = Kind::kTagged;
    t.closed = true;
    for (const auto& [literal, object] : tags) {
      literals.push_back(literal);
      t.alternatives.push_back(object);
    }
    auto values = Add(LiteralNode(std::move(literals)), here);
    if (!values.ok()) return values.status();
    t.properties.push_back({objects[0]->properties[0].key, *values, true});
    auto tagged = Add(std::move(t), here);
    if (!tagged.ok()) return tagged.status();
    // The tagged node stands where the first object stood.
    std::vector<const SchemaNode*> out;
    for (const SchemaNode* a : *alternatives) {
      if (a->kind != Kind::kObject) {
        out.push_back(a);
      } else if (a == objects[0]) {
        out.push_back(*tagged);
      }
    }
    *alternatives = std::move(out);
    return absl::OkStatus();
  }

  // The alternatives of a union begin with different bytes.
  static absl::Status Distinct(const SchemaNode& u, const std::string& here) {
    for (int b = 0; b < 256; ++b) {
      int starts = 0;
      for (const SchemaNode* a : u.alternatives) starts += CanStartWith(*a, b) ? 1 : 0;
      if (starts > 1) {
        return SchemaInvalid(
            here,
            "alternatives must begin differently (one object, one array, one string, "
            "one number, or literals with different first characters; objects only "
            "when told apart by a string const of the same required first property)");
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const SchemaNode*> Ref(const Json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return SchemaInvalid(path, "must be a string");
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
      return SchemaInvalid(path, absl::StrCat("\"", r,
                                              "\" is not \"#\" or a schema under #/$defs or "
                                              "#/definitions"));
    }
    // A placeholder first, so that a schema referring to itself finds it.
    auto placeholder = Add(SchemaNode{}, path);
    if (!placeholder.ok()) return placeholder.status();
    auto* node = const_cast<SchemaNode*>(*placeholder);
    refs_[r] = node;
    ref_sites_[node] = {path, r};
    pending_[node] = {r, containers_};
    ref_chain_.push_back(r);
    auto compiled = Compile(*target, r.substr(1), depth + 1);
    if (const Pending* p = compiled.ok() ? Circular(*compiled) : nullptr) {
      // The target is a reference back to one being compiled (a -> b -> a), with no object or
      // array in between: no value to begin with.
      auto from = std::find(ref_chain_.begin(), ref_chain_.end(), p->ref);
      std::vector<std::string> cycle(from, ref_chain_.end());
      cycle.push_back(p->ref);
      return SchemaInvalid(path, absl::StrCat("the $ref cycle \"", absl::StrJoin(cycle, "\" -> \""),
                                              "\" never reaches a schema"));
    }
    ref_chain_.pop_back();
    pending_.erase(node);
    if (!compiled.ok()) return compiled.status();
    if (Unresolved(*compiled)) {
      // Another name for a schema around this one, not compiled yet: copied in Finish.
      alias_of_[node] = *compiled;
    } else {
      *node = **compiled;
    }
    return node;
  }

  // What `n` names: an alias's schema, followed.
  const SchemaNode* Target(const SchemaNode* n) const {
    for (auto it = alias_of_.find(n); it != alias_of_.end(); it = alias_of_.find(n)) {
      n = it->second;
    }
    return n;
  }
  // A node whose contents are not known yet: a $ref being compiled, or an alias.
  bool Unresolved(const SchemaNode* n) const {
    return pending_.count(n) > 0 || alias_of_.count(n) > 0;
  }
  // The $ref being compiled that `n` names with no object or array since it began; null if none.
  const Pending* Circular(const SchemaNode* n) const {
    auto it = pending_.find(Target(n));
    return it != pending_.end() && it->second.containers == containers_ ? &it->second : nullptr;
  }

 public:
  // After the root compiled: the references to schemas that were still being compiled resolved,
  // every node's min_depth, and the schemas no value can satisfy refused: a $ref cycle that
  // never ends (every value would contain another), or a root whose smallest value needs more
  // than `max_depth` levels.
  absl::Status Finish(const SchemaNode* root, int max_depth) {
    for (const auto& [alias, named] : alias_of_) {
      *const_cast<SchemaNode*>(alias) = *Target(named);
    }
    for (const auto& [u, here] : deferred_unions_) {
      if (absl::Status s = NoUnionCycle(u, here); !s.ok()) return s;
      if (absl::Status s = Distinct(*u, here); !s.ok()) return s;
    }
    std::vector<SchemaNode*> nodes;
    for (const auto& n : out_->nodes_) nodes.push_back(n.get());
    SetMinDepths(nodes);
    for (const SchemaNode* n : nodes) {
      if (n->min_depth == 0) return EndlessCycle(root->min_depth == 0 ? root : n, ref_sites_);
    }
    if (root->min_depth > max_depth) {
      return SchemaInvalid("",
                           absl::StrCat("the smallest value of this schema nests ", root->min_depth,
                                        " levels deep; at most ", max_depth, " are supported"));
    }
    return absl::OkStatus();
  }

 private:
  const Json& doc_;
  JsonSchema* out_;
  std::map<std::string, SchemaNode*> refs_;
  RefSites ref_sites_;
  // The $ref nodes whose targets are being compiled (placeholders still); the chain of those
  // targets, outermost first; the containers being compiled around the current schema.
  std::map<const SchemaNode*, Pending> pending_;
  std::vector<std::string> ref_chain_;
  int containers_ = 0;
  // $ref nodes that name a schema still being compiled then (copied in Finish), and unions
  // with such an alternative (checked in Finish).
  std::map<const SchemaNode*, const SchemaNode*> alias_of_;
  std::vector<std::pair<const SchemaNode*, std::string>> deferred_unions_;
};

absl::StatusOr<std::shared_ptr<const JsonSchema>> JsonSchema::Compile(std::string_view schema_json,
                                                                      std::string_view prefix,
                                                                      std::string_view suffix) {
  absl::StatusOr<Json> parsed = ParseJson(schema_json);
  if (!parsed.ok()) return absl::InvalidArgumentError("the schema is not valid JSON");
  Json doc = *std::move(parsed);
  auto schema = std::make_shared<JsonSchema>();
  SchemaCompiler compiler(doc, schema.get());
  auto root = compiler.Compile(doc, "", 0);
  if (!root.ok()) return root.status();
  // The suffix's frame waits under the value.
  const int max_depth = kMaxDepth - (suffix.empty() ? 0 : 1);
  if (absl::Status s = compiler.Finish(*root, max_depth); !s.ok()) return s;
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

absl::StatusOr<std::shared_ptr<const JsonSchema>> JsonSchema::Choice(
    const std::vector<std::string>& choices) {
  if (choices.empty()) return absl::InvalidArgumentError("must hold at least one string");
  if (choices.size() > static_cast<size_t>(kMaxChoices)) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxChoices, " strings"));
  }
  size_t bytes = 0;
  for (const std::string& c : choices) {
    if (c.empty()) return absl::InvalidArgumentError("strings must not be empty");
    bytes += c.size();
  }
  if (bytes > kMaxChoiceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxChoiceBytes, " bytes"));
  }
  auto s = std::make_shared<JsonSchema>();
  s->nodes_.push_back(std::make_unique<SchemaNode>(LiteralNode(choices)));
  s->root_ = s->nodes_.back().get();
  return s;
}

absl::StatusOr<std::shared_ptr<const JsonSchema>> JsonSchema::Regex(std::string_view pattern) {
  auto re = ByteRegex::Compile(pattern);
  if (!re.ok()) return re.status();
  auto s = std::make_shared<JsonSchema>();
  SchemaNode n;
  n.kind = Kind::kRegex;
  n.regex = *std::move(re);
  s->nodes_.push_back(std::make_unique<SchemaNode>(std::move(n)));
  s->root_ = s->nodes_.back().get();
  return s;
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
