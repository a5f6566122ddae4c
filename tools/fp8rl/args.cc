// Flag parsing shared by every fp8rl subcommand.
#include "tools/fp8rl/args.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace fp8rl::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& args, const FlagSpec& spec) {
  Args out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() > 2 && a.rfind("--", 0) == 0) {
      std::string name = a.substr(2);
      std::optional<std::string> inline_value;
      if (auto eq = name.find('='); eq != std::string::npos) {
        inline_value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (spec.bool_flags.count(name)) {
        if (inline_value) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
        }
        out.bools_.insert(name);
      } else if (spec.value_flags.count(name)) {
        if (inline_value) {
          out.values_[name].push_back(*inline_value);
        } else {
          if (i + 1 >= args.size()) {
            return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
          }
          out.values_[name].push_back(args[++i]);
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
      }
    } else {
      if (static_cast<int>(out.positionals_.size()) >= spec.max_positionals) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
      }
      out.positionals_.push_back(a);
    }
  }
  return out;
}

bool Args::has(const std::string& flag) const {
  return bools_.count(flag) > 0 || values_.count(flag) > 0;
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Args::get_all(const std::string& flag) const {
  auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<std::string> Args::required(const std::string& flag) const {
  auto v = get(flag);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("missing required flag --", flag));
  return *v;
}

absl::StatusOr<int64_t> Args::get_int(const std::string& flag, int64_t default_value) const {
  auto v = get(flag);
  if (!v) return default_value;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": expected an integer, got '", *v, "'"));
  }
  return static_cast<int64_t>(x);
}

absl::StatusOr<double> Args::get_double(const std::string& flag, double default_value) const {
  auto v = get(flag);
  if (!v) return default_value;
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": expected a number, got '", *v, "'"));
  }
  return x;
}

}  // namespace fp8rl::cli
