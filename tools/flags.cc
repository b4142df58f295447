#include "tools/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

FlagSpec ValueFlag(std::string name, std::string type, std::string default_value,
                   std::string help) {
  return {std::move(name), FlagSpec::Kind::kValue, std::move(type), std::move(default_value),
          std::move(help)};
}

FlagSpec BoolFlag(std::string name, std::string help) {
  return {std::move(name), FlagSpec::Kind::kBool, "", "", std::move(help)};
}

FlagSpec RepeatedFlag(std::string name, std::string type, std::string help) {
  return {std::move(name), FlagSpec::Kind::kRepeated, std::move(type), "", std::move(help)};
}

namespace {

// CLI11's message for a parse error, in the words of the flag it concerns.
absl::Status ParseErrorStatus(const CLI::ParseError& e) {
  std::string message = e.what();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    // "--NAME: 1 required TYPE missing"
    message = message.substr(0, message.find(':')) + " needs a value";
  } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    // "Could not convert: --NAME = VALUE" (only booleans are converted here)
    const size_t at = message.find("--");
    if (at != std::string::npos) {
      message = message.substr(at, message.find(' ', at) - at) + " takes no value (or true|false)";
    }
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, const Command& command) {
  Flags f;
  CLI::App app(command.description, command.name);
  app.footer(command.footer);
  app.allow_extras();  // unknown flags and positional arguments are named below
  // What CLI11 writes each flag's values into (a deque: stable addresses).
  struct Slot {
    const FlagSpec* spec;
    CLI::Option* option = nullptr;
    std::string last;              // kValue
    std::vector<std::string> all;  // kRepeated
    bool set = false;              // kBool
  };
  std::deque<Slot> slots;
  for (const FlagSpec& spec : command.flags) {
    Slot& slot = slots.emplace_back(Slot{&spec});
    const std::string name = "--" + spec.name;
    switch (spec.kind) {
      case FlagSpec::Kind::kBool:
        slot.option = app.add_flag(name, slot.set, spec.help);
        break;
      case FlagSpec::Kind::kValue:
        slot.option = app.add_option(name, slot.last, spec.help)
                          ->type_name(spec.type)
                          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
        if (!spec.default_value.empty()) slot.option->default_str(spec.default_value);
        break;
      case FlagSpec::Kind::kRepeated:
        slot.option = app.add_option(name, slot.all, spec.help)
                          ->type_name(spec.type)
                          ->allow_extra_args(false)
                          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
        break;
    }
    f.defaults_[spec.name] = spec.default_value;
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    f.help_requested_ = true;
    f.help_ = app.help();
    return f;
  } catch (const CLI::ParseError& e) {
    return ParseErrorStatus(e);
  }
  for (const std::string& extra : app.remaining()) {
    if (extra.size() > 1 && extra[0] == '-') {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown flag %s", extra.substr(0, extra.find('='))));
    }
    if (command.positional.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s takes no argument \"%s\"", command.name, extra));
    }
    f.positional_.push_back(extra);
  }
  for (const Slot& slot : slots) {
    if (slot.option->count() == 0) continue;
    switch (slot.spec->kind) {
      case FlagSpec::Kind::kBool:
        if (slot.set) f.values_[slot.spec->name] = {"true"};  // not --NAME=false
        break;
      case FlagSpec::Kind::kValue:
        f.values_[slot.spec->name] = {slot.last};
        break;
      case FlagSpec::Kind::kRepeated:
        f.values_[slot.spec->name] = slot.all;
        break;
    }
  }
  return f;
}

bool Flags::Has(const std::string& name) const { return values_.contains(name); }

std::string Flags::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second.back();  // the last one wins
  auto d = defaults_.find(name);
  return d == defaults_.end() ? "" : d->second;
}

std::vector<std::string> Flags::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> Flags::GetInt(const std::string& name) const {
  const std::string v = Get(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) {
    return absl::InvalidArgumentError(absl::StrFormat("--%s: \"%s\" is not an integer", name, v));
  }
  return static_cast<int64_t>(x);
}

absl::StatusOr<double> Flags::GetDouble(const std::string& name) const {
  const std::string v = Get(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') {
    return absl::InvalidArgumentError(absl::StrFormat("--%s: \"%s\" is not a number", name, v));
  }
  return x;
}

std::vector<FlagSpec> Concat(std::vector<FlagSpec> flags, const std::vector<FlagSpec>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

std::vector<FlagSpec> Pick(const std::vector<FlagSpec>& specs,
                           std::initializer_list<const char*> names) {
  std::vector<FlagSpec> out;
  for (const FlagSpec& spec : specs) {
    if (std::any_of(names.begin(), names.end(), [&](const char* n) { return spec.name == n; })) {
      out.push_back(spec);
    }
  }
  return out;
}

std::optional<int> ParseOrExit(const std::vector<std::string>& args, const Flags::Command& command,
                               absl::StatusOr<Flags>* flags) {
  *flags = Flags::Parse(args, command);
  if (!flags->ok()) {
    std::fprintf(stderr, "%s: %s\n", command.name.c_str(),
                 std::string(flags->status().message()).c_str());
    return 2;
  }
  if ((*flags)->help_requested()) {
    std::fputs((*flags)->help().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

}  // namespace tandem
