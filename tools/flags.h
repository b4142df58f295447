// The flags of the `tandem` commands and `tandem-health`, parsed by CLI11 as tandem-server's are.
// A command declares each flag once (FlagSpec: its name, value type, default and help); the
// parser, the command's --help and the accessors' defaults all come from that declaration.
// Unknown flags are errors, so a typo never silently changes a run.
#ifndef TANDEM_TOOLS_FLAGS_H_
#define TANDEM_TOOLS_FLAGS_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct FlagSpec {
  enum class Kind { kValue, kBool, kRepeated };
  std::string name;  // without the leading "--"
  Kind kind = Kind::kValue;
  std::string type;           // the value's name in --help (N, PATH, ...); empty for a boolean
  std::string default_value;  // what Get returns when the flag is absent (empty: none)
  std::string help;
};

// --NAME TYPE (default DEFAULT).
FlagSpec ValueFlag(std::string name, std::string type, std::string default_value, std::string help);
// --NAME, --NAME=true|false.
FlagSpec BoolFlag(std::string name, std::string help);
// --NAME TYPE, given any number of times; GetAll returns every value in order.
FlagSpec RepeatedFlag(std::string name, std::string type, std::string help);

// What one command line says, after parsing against the command's FlagSpecs.
class Flags {
 public:
  struct Command {
    std::string name;         // "tandem generate", in --help and errors
    std::string description;  // --help's first paragraph
    std::vector<FlagSpec> flags;
    // The positional arguments' name in --help (e.g. "FILE.json..."); empty: none are taken.
    std::string positional;
    std::string footer;  // --help's last paragraph
  };

  // INVALID_ARGUMENT naming the flag for an unknown flag, a value missing, a value given to a
  // boolean flag, or a positional argument the command does not take. --help or -h anywhere:
  // help_requested() and nothing else is checked.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args, const Command& command);

  bool help_requested() const { return help_requested_; }
  // With help_requested(): the command's --help text, made from its FlagSpecs.
  const std::string& help() const { return help_; }

  // Whether the flag was given (a boolean: given and not =false).
  bool Has(const std::string& name) const;
  // The last value given, else the declared default.
  std::string Get(const std::string& name) const;
  std::vector<std::string> GetAll(const std::string& name) const;
  // Get as a number: INVALID_ARGUMENT naming the flag when it is not one.
  absl::StatusOr<int64_t> GetInt(const std::string& name) const;
  absl::StatusOr<double> GetDouble(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;  // given flags' values, in order
  std::map<std::string, std::string> defaults_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
  std::string help_;
};

// `flags`, then `more`.
std::vector<FlagSpec> Concat(std::vector<FlagSpec> flags, const std::vector<FlagSpec>& more);
// The specs of `specs` named in `names`, in their order in `specs`.
std::vector<FlagSpec> Pick(const std::vector<FlagSpec>& specs,
                           std::initializer_list<const char*> names);

// Parses a command's flags into *flags. Returns the exit code when the command is over: 0 when
// its --help was printed on stdout, 2 when the flags were refused (the reason on stderr, after
// the command's name); nothing when the command goes on.
std::optional<int> ParseOrExit(const std::vector<std::string>& args, const Flags::Command& command,
                               absl::StatusOr<Flags>* flags);

}  // namespace tandem

#endif  // TANDEM_TOOLS_FLAGS_H_
