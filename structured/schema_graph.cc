#include "structured/schema_graph.h"

#include <algorithm>
#include <functional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::structured {

absl::Status SchemaInvalid(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("at ", path.empty() ? "/" : path, ": ", why));
}

void SetMinDepths(std::span<SchemaNode* const> nodes) {
  for (SchemaNode* n : nodes) n->min_depth = 0;  // unknown
  // Level by level: a node gets depth h once its required parts are known below h (a union:
  // once an alternative is known at h). A level that settles nothing ends the search: later
  // levels would ask the same of the same nodes.
  auto known = [](const SchemaNode* n, int below) {
    return n->min_depth > 0 && n->min_depth < below;
  };
  for (int h = 1;; ++h) {
    bool progress = false;
    for (SchemaNode* n : nodes) {
      if (n->min_depth > 0 || n->kind == Kind::kUnion || n->kind == Kind::kTagged) continue;
      bool ready = true;
      if (n->kind == Kind::kObject && n->closed) {
        for (const SchemaNode::Property& p : n->properties) {
          ready &= !p.required || known(p.value, h);
        }
      } else if (n->kind == Kind::kArray) {
        ready = n->min_items == 0 || known(n->items, h);
      }
      if (ready) {
        n->min_depth = h;
        progress = true;
      }
    }
    for (bool more = true; more;) {  // unions of unions settle within the level
      more = false;
      for (SchemaNode* n : nodes) {
        if (n->min_depth > 0 || (n->kind != Kind::kUnion && n->kind != Kind::kTagged)) continue;
        auto settled = [&](const SchemaNode* a) { return known(a, h + 1); };
        // A union needs its smallest alternative; a tagged union whichever the tag chooses.
        if (n->kind == Kind::kUnion
                ? std::any_of(n->alternatives.begin(), n->alternatives.end(), settled)
                : std::all_of(n->alternatives.begin(), n->alternatives.end(), settled)) {
          n->min_depth = h;
          more = progress = true;
        }
      }
    }
    if (!progress) break;
  }
}

absl::Status NoUnionCycle(const SchemaNode* u, const std::string& here) {
  std::set<const SchemaNode*> done, path;
  std::function<bool(const SchemaNode*)> cyclic = [&](const SchemaNode* n) {
    if (path.count(n) > 0) return true;
    if (!done.insert(n).second) return false;
    path.insert(n);
    for (const SchemaNode* a : n->alternatives) {
      if (a->kind == Kind::kUnion && cyclic(a)) return true;
    }
    path.erase(n);
    return false;
  };
  if (cyclic(u)) {
    return SchemaInvalid(here,
                         "an alternative refers back to this schema before any value begins: a "
                         "$ref cycle that never reaches a schema");
  }
  return absl::OkStatus();
}

absl::Status EndlessCycle(const SchemaNode* start, const RefSites& ref_sites) {
  std::vector<const SchemaNode*> walk;
  const SchemaNode* n = start;
  while (n != nullptr && std::find(walk.begin(), walk.end(), n) == walk.end()) {
    walk.push_back(n);
    const SchemaNode* next = nullptr;
    if (n->kind == Kind::kObject) {
      for (const SchemaNode::Property& p : n->properties) {
        if (p.required && p.value->min_depth == 0) {
          next = p.value;
          break;
        }
      }
    } else if (n->kind == Kind::kArray) {
      next = n->items;
    } else if (n->kind == Kind::kUnion) {
      next = n->alternatives.front();
    } else if (n->kind == Kind::kTagged) {
      for (const SchemaNode* a : n->alternatives) {
        if (a->min_depth == 0) {
          next = a;
          break;
        }
      }
    }
    n = next;
  }
  for (auto it = std::find(walk.begin(), walk.end(), n); it != walk.end(); ++it) {
    if (auto site = ref_sites.find(*it); site != ref_sites.end()) {
      return SchemaInvalid(
          site->second.first,
          absl::StrCat("no finite value satisfies the $ref cycle through \"", site->second.second,
                       "\": each of its values must contain another (through required "
                       "properties or minItems >= 1) without end"));
    }
  }
  return SchemaInvalid("", "no finite value satisfies the schema");
}

}  // namespace tandem::structured
