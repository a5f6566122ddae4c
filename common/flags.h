// One typed flag table per program: every flag's name, type, default, range and help in one place,
// parsed into the program's own options struct. The service binaries build theirs in
// services/*/*_config.cc; `--help` is generated from the table, so it cannot drift.
//
// Rules (docs/design/services.md "Flags"):
//   * flags are --kebab-case and take a value: `--name VALUE` or `--name=VALUE`;
//   * `--config FILE` (when enabled) loads a YAML mapping first, keys the flag names in
//     snake_case; flags given on the command line override it;
//   * an unknown flag, a missing value or a bad value is an INVALID_ARGUMENT error whose message
//     names the flag as it was spelled ("--keep-versions: must be in [1, 64], got 0");
//   * a deprecated alias still works and adds a warning naming the new flag; the alias and the
//     new name both given with different values is an error.
//
// A table binds each flag to a variable (`add_int("keep-versions", &options.keep_versions, ...)`);
// the variable's value when the flag is added is its default. Parsing writes only the variables
// of flags that were given, so a table is built on a struct holding the defaults.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp8rl::flags {

enum class FlagType { kInt, kUint, kDouble, kBool, kString, kDuration, kEnum };

// The unit a duration flag's number is in; the flag's name says it too (`--batch-wait-ms`).
enum class DurationUnit { kMilliseconds, kSeconds };

// What a successful parse reports besides the values it wrote.
struct ParseResult {
  // One line per deprecated alias used: "--metrics-port is deprecated; use --http-port".
  std::vector<std::string> warnings;
  // The canonical names (no dashes) of the flags given on the command line or in the file.
  std::vector<std::string> given;
  bool was_given(std::string_view name) const;
};

class FlagTable {
 public:
  // `program` opens the usage line ("fp8rl-weight-sync").
  explicit FlagTable(std::string program);

  FlagTable(const FlagTable&) = delete;
  FlagTable& operator=(const FlagTable&) = delete;

  // Integers in [lo, hi]: "expected an integer, got 'x'", "must be in [lo, hi], got v".
  template <typename T>
  requires std::is_integral_v<T> FlagTable& add_int(std::string name, T* target, int64_t lo,
                                                    int64_t hi, std::string help);
  // Unsigned integers in [lo, hi] (a leading '-' is refused as not an integer).
  template <typename T>
  requires std::is_integral_v<T> FlagTable& add_uint(std::string name, T* target, uint64_t lo,
                                                     uint64_t hi, std::string help);
  // Finite numbers in [lo, hi], or (lo, hi] when lo_open: "expected a number, got 'x'".
  FlagTable& add_double(std::string name, double* target, double lo, double hi, std::string help,
                        bool lo_open = false);
  // on | off: "must be on or off, got 'x'".
  FlagTable& add_bool(std::string name, bool* target, std::string help);
  // Any text; empty is refused ("must not be empty") unless allow_empty.
  FlagTable& add_string(std::string name, std::string* target, std::string help,
                        bool allow_empty = false);
  // A whole number of `unit` in [lo, hi] of that unit, stored as a std::chrono duration.
  template <typename Rep, typename Period>
  FlagTable& add_duration(std::string name, std::chrono::duration<Rep, Period>* target,
                          DurationUnit unit, int64_t lo, int64_t hi, std::string help);
  // One of `values` (spelled as listed): "must be a, b or c, got 'x'". `synonyms` are accepted
  // spellings left out of the help and the message (YAML's true/false for on/off).
  template <typename E>
  FlagTable& add_enum(std::string name, E* target, std::vector<std::pair<std::string, E>> values,
                      std::string help, std::vector<std::pair<std::string, E>> synonyms = {});

  // Marks the last added flag required: absent from both the file and the command line is
  // "--name: required".
  FlagTable& required();
  // `old_name` is accepted for `name` (already added), with a warning naming `name`.
  FlagTable& deprecated_alias(std::string old_name, std::string name);
  // Lets `name` (a string flag already added) be given empty.
  FlagTable& allow_empty(std::string_view name);
  // Accepts `--config FILE` (YAML) before the flags.
  FlagTable& enable_config_file();

  // `args` are the arguments after the program name. Writes the given flags' variables.
  absl::StatusOr<ParseResult> parse(const std::vector<std::string>& args) const;

  // "usage: PROGRAM [--config FILE] [flags]" then per flag its name, type and range, default,
  // help, and the deprecated aliases.
  std::string usage() const;

  // Whether a flag (canonical or alias, no dashes) is in the table.
  bool has(std::string_view name) const;

 private:
  struct Flag {
    std::string name;  // kebab-case, no dashes in front
    FlagType type = FlagType::kString;
    std::string type_text;     // "INT in [1, 64]", "on|off", ...
    std::string default_text;  // the bound variable's value when added
    std::string help;
    bool required = false;
    bool allow_empty = false;
    // Parses and stores `value`; the error message is without the "--name: " prefix.
    std::function<absl::Status(const std::string& value)> set;
  };
  struct Alias {
    std::string old_name;
    std::string name;
  };

  FlagTable& add(Flag flag);
  // add_int and add_uint: parse as Wide in [lo, hi], store as T; type_text "<word> in [lo, hi]".
  template <typename Wide, typename T>
  FlagTable& add_integral(std::string name, T* target, Wide lo, Wide hi, std::string help,
                          FlagType type, std::string_view word,
                          absl::Status (*parse)(const std::string&, Wide, Wide, Wide*));
  const Flag* find(std::string_view name) const;
  const Alias* find_alias(std::string_view old_name) const;
  static absl::Status parse_int64(const std::string& value, int64_t lo, int64_t hi, int64_t* out);
  static absl::Status parse_uint64(const std::string& value, uint64_t lo, uint64_t hi,
                                   uint64_t* out);

  std::string program_;
  std::vector<Flag> flags_;
  std::vector<Alias> aliases_;
  bool config_file_ = false;
};

// True when `args` ask for the usage text (--help or -h anywhere).
bool wants_help(const std::vector<std::string>& args);

// "--keep-versions" for "keep_versions" or "keep-versions".
std::string flag_name(std::string_view name);

// ---- templates ----

template <typename Wide, typename T>
FlagTable& FlagTable::add_integral(std::string name, T* target, Wide lo, Wide hi, std::string help,
                                   FlagType type, std::string_view word,
                                   absl::Status (*parse)(const std::string&, Wide, Wide, Wide*)) {
  Flag f;
  f.name = std::move(name);
  f.type = type;
  f.type_text = std::string(word) + " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  f.default_text = std::to_string(*target);
  f.help = std::move(help);
  f.set = [target, lo, hi, parse](const std::string& value) {
    Wide v = 0;
    if (absl::Status s = parse(value, lo, hi, &v); !s.ok()) return s;
    *target = static_cast<T>(v);
    return absl::OkStatus();
  };
  return add(std::move(f));
}

template <typename T>
requires std::is_integral_v<T> FlagTable& FlagTable::add_int(std::string name, T* target,
                                                             int64_t lo, int64_t hi,
                                                             std::string help) {
  return add_integral<int64_t>(std::move(name), target, lo, hi, std::move(help), FlagType::kInt,
                               "INT", &parse_int64);
}

template <typename T>
requires std::is_integral_v<T> FlagTable& FlagTable::add_uint(std::string name, T* target,
                                                              uint64_t lo, uint64_t hi,
                                                              std::string help) {
  return add_integral<uint64_t>(std::move(name), target, lo, hi, std::move(help), FlagType::kUint,
                                "UINT", &parse_uint64);
}

template <typename Rep, typename Period>
FlagTable& FlagTable::add_duration(std::string name, std::chrono::duration<Rep, Period>* target,
                                   DurationUnit unit, int64_t lo, int64_t hi, std::string help) {
  using Target = std::chrono::duration<Rep, Period>;
  const bool ms = unit == DurationUnit::kMilliseconds;
  Flag f;
  f.name = std::move(name);
  f.type = FlagType::kDuration;
  f.type_text = std::string(ms ? "MILLISECONDS" : "SECONDS") + " in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]";
  f.default_text =
      ms ? std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(*target).count())
         : std::to_string(std::chrono::duration_cast<std::chrono::seconds>(*target).count());
  f.help = std::move(help);
  f.set = [target, lo, hi, ms](const std::string& value) {
    int64_t v = 0;
    if (absl::Status s = parse_int64(value, lo, hi, &v); !s.ok()) return s;
    *target = ms ? std::chrono::duration_cast<Target>(std::chrono::milliseconds(v))
                 : std::chrono::duration_cast<Target>(std::chrono::seconds(v));
    return absl::OkStatus();
  };
  return add(std::move(f));
}

template <typename E>
FlagTable& FlagTable::add_enum(std::string name, E* target,
                               std::vector<std::pair<std::string, E>> values, std::string help,
                               std::vector<std::pair<std::string, E>> synonyms) {
  Flag f;
  f.name = std::move(name);
  f.type = FlagType::kEnum;
  std::string listed;  // "a, b or c"
  for (size_t i = 0; i < values.size(); ++i) {
    f.type_text += (i ? "|" : "") + values[i].first;
    listed += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + values[i].first;
    if (values[i].second == *target) f.default_text = values[i].first;
  }
  f.help = std::move(help);
  std::vector<std::pair<std::string, E>> accepted = values;
  accepted.insert(accepted.end(), synonyms.begin(), synonyms.end());
  f.set = [target, accepted = std::move(accepted), listed](const std::string& value) {
    for (const auto& [text, v] : accepted) {
      if (text == value) {
        *target = v;
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError("must be " + listed + ", got '" + value + "'");
  };
  return add(std::move(f));
}

}  // namespace fp8rl::flags
