// A small command-line parser for the `tandem` subcommands: --name value, --name=value and
// boolean --name. Unknown flags are errors, so a typo never silently changes a run.
#ifndef TANDEM_TOOLS_FLAGS_H_
#define TANDEM_TOOLS_FLAGS_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Flags {
 public:
  // `value_flags` take a value; `bool_flags` do not. Positional arguments are kept in order.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::set<std::string>& value_flags,
                                     const std::set<std::string>& bool_flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> GetAll(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace tandem

#endif  // TANDEM_TOOLS_FLAGS_H_
