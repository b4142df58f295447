#include "tools/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args,
                                   const std::set<std::string>& value_flags,
                                   const std::set<std::string>& bool_flags) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) {
      f.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_inline = eq != std::string::npos;
    if (has_inline) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (bool_flags.count(name)) {
      if (has_inline && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrFormat("--%s takes no value", name));
      }
      if (value != "false") f.values_.emplace(name, "true");
      continue;
    }
    if (!value_flags.count(name)) {
      return absl::InvalidArgumentError(absl::StrFormat("unknown flag --%s", name));
    }
    if (!has_inline) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", name));
      }
      value = args[++i];
    }
    f.values_.emplace(name, value);
  }
  return f;
}

std::string Flags::Get(const std::string& name, const std::string& fallback) const {
  auto range = values_.equal_range(name);
  if (range.first == range.second) return fallback;
  return std::prev(range.second)->second;  // the last one wins
}

std::vector<std::string> Flags::GetAll(const std::string& name) const {
  std::vector<std::string> out;
  auto range = values_.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

absl::StatusOr<int64_t> Flags::GetInt(const std::string& name, int64_t fallback) const {
  if (!Has(name)) return fallback;
  const std::string v = Get(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) {
    return absl::InvalidArgumentError(absl::StrFormat("--%s: \"%s\" is not an integer", name, v));
  }
  return static_cast<int64_t>(x);
}

absl::StatusOr<double> Flags::GetDouble(const std::string& name, double fallback) const {
  if (!Has(name)) return fallback;
  const std::string v = Get(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') {
    return absl::InvalidArgumentError(absl::StrFormat("--%s: \"%s\" is not a number", name, v));
  }
  return x;
}

}  // namespace tandem
