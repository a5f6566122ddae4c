// A small flag parser for fp8rl subcommands: --name VALUE, --name=VALUE, boolean --flag,
// repeated flags, positionals. Unknown flags and missing values are errors naming the flag.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::cli {

struct FlagSpec {
  std::set<std::string> value_flags;  // take a value ("model", "out", ...), may repeat
  std::set<std::string> bool_flags;   // present or not ("pow2-scales")
  int max_positionals = 0;
};

class Args {
 public:
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& args, const FlagSpec& spec);

  bool has(const std::string& flag) const;
  std::optional<std::string> get(const std::string& flag) const;  // last value
  std::vector<std::string> get_all(const std::string& flag) const;
  absl::StatusOr<std::string> required(const std::string& flag) const;
  // Typed accessors: error "--flag: expected an integer, got 'x'" etc.
  absl::StatusOr<int64_t> get_int(const std::string& flag, int64_t default_value) const;
  absl::StatusOr<double> get_double(const std::string& flag, double default_value) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> bools_;
  std::vector<std::string> positionals_;
};

}  // namespace fp8rl::cli
