// Checks over a compiled schema's graph of nodes (structured/json_schema.h), once every $ref is
// resolved: each node's smallest nesting depth, and the errors for schemas no finite value
// satisfies (a union that leads back to itself through unions, a cycle of required parts).
#ifndef TANDEM_STRUCTURED_SCHEMA_GRAPH_H_
#define TANDEM_STRUCTURED_SCHEMA_GRAPH_H_

#include <map>
#include <span>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "structured/json_schema.h"

namespace tandem::structured {

// INVALID_ARGUMENT "at PATH: WHY" (the JSON pointer of the schema, "/" for the root).
absl::Status SchemaInvalid(const std::string& path, const std::string& why);

// Sets every node's min_depth: the levels its smallest value needs, or 0 where no finite value
// satisfies it (every value would contain another without end).
void SetMinDepths(std::span<SchemaNode* const> nodes);

// An error if union `u`'s alternatives lead back to it through unions only (a value of it would
// begin with a value of itself); `here` is where it is.
absl::Status NoUnionCycle(const SchemaNode* u, const std::string& here);

// Each $ref's node: where the first reference to it is, and its target.
using RefSites = std::map<const SchemaNode*, std::pair<std::string, std::string>>;

// The error for `start`, a node no finite value satisfies (min_depth 0): follows its parts that
// cannot be left out to the cycle they run around, and names that cycle's $ref.
absl::Status EndlessCycle(const SchemaNode* start, const RefSites& ref_sites);

}  // namespace tandem::structured

#endif  // TANDEM_STRUCTURED_SCHEMA_GRAPH_H_
