// Parsing, YAML config files and the usage text of a FlagTable (see flags.h).
#include "common/flags.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace fp8rl::flags {
namespace {

std::string kebab(std::string_view name) {
  return absl::StrReplaceAll(std::string(name), {{"_", "-"}});
}

// One value from the command line or the file: the flag (canonical), its text and how the user
// spelled it (for messages: "--metrics-port" or "path: metrics_port").
struct Given {
  std::string name;
  std::string value;
  std::string where;
  std::string spelled;  // the name as given, no dashes (canonical or alias)
};

absl::Status with_prefix(const std::string& where, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace

bool ParseResult::was_given(std::string_view name) const {
  return std::find(given.begin(), given.end(), kebab(name)) != given.end();
}

FlagTable::FlagTable(std::string program) : program_(std::move(program)) {}

FlagTable& FlagTable::add(Flag flag) {
  flags_.push_back(std::move(flag));
  return *this;
}

const FlagTable::Flag* FlagTable::find(std::string_view name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const FlagTable::Alias* FlagTable::find_alias(std::string_view old_name) const {
  for (const Alias& a : aliases_) {
    if (a.old_name == old_name) return &a;
  }
  return nullptr;
}

bool FlagTable::has(std::string_view name) const {
  return find(kebab(name)) != nullptr || find_alias(kebab(name)) != nullptr;
}

absl::Status FlagTable::parse_int64(const std::string& value, int64_t lo, int64_t hi,
                                    int64_t* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("expected an integer, got '", value, "'"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status FlagTable::parse_uint64(const std::string& value, uint64_t lo, uint64_t hi,
                                     uint64_t* out) {
  uint64_t v = 0;
  if (absl::StartsWith(absl::StripAsciiWhitespace(value), "-") || !absl::SimpleAtoi(value, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a non-negative integer, got '", value, "'"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

FlagTable& FlagTable::add_double(std::string name, double* target, double lo, double hi,
                                 std::string help, bool lo_open) {
  Flag f;
  f.name = std::move(name);
  f.type = FlagType::kDouble;
  const std::string range = absl::StrCat(lo_open ? "(" : "[", lo, ", ", hi, "]");
  f.type_text = absl::StrCat("NUMBER in ", range);
  f.default_text = absl::StrCat(*target);
  f.help = std::move(help);
  f.set = [target, lo, hi, lo_open, range](const std::string& value) {
    double v = 0;
    if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("expected a number, got '", value, "'"));
    }
    if (!((lo_open ? v > lo : v >= lo) && v <= hi)) {
      return absl::InvalidArgumentError(absl::StrCat("must be in ", range, ", got ", value));
    }
    *target = v;
    return absl::OkStatus();
  };
  return add(std::move(f));
}

FlagTable& FlagTable::add_bool(std::string name, bool* target, std::string help) {
  Flag f;
  f.name = std::move(name);
  f.type = FlagType::kBool;
  f.type_text = "on|off";
  f.default_text = *target ? "on" : "off";
  f.help = std::move(help);
  f.set = [target](const std::string& value) {
    if (value != "on" && value != "off") {
      return absl::InvalidArgumentError(absl::StrCat("must be on or off, got '", value, "'"));
    }
    *target = value == "on";
    return absl::OkStatus();
  };
  return add(std::move(f));
}

FlagTable& FlagTable::add_string(std::string name, std::string* target, std::string help,
                                 bool allow_empty) {
  Flag f;
  f.name = std::move(name);
  f.type = FlagType::kString;
  f.type_text = "TEXT";
  f.default_text = *target;
  f.help = std::move(help);
  f.allow_empty = allow_empty;
  f.set = [target](const std::string& value) {
    *target = value;
    return absl::OkStatus();
  };
  return add(std::move(f));
}

FlagTable& FlagTable::required() {
  if (!flags_.empty()) flags_.back().required = true;
  return *this;
}

FlagTable& FlagTable::deprecated_alias(std::string old_name, std::string name) {
  aliases_.push_back({std::move(old_name), std::move(name)});
  return *this;
}

FlagTable& FlagTable::allow_empty(std::string_view name) {
  for (Flag& f : flags_) {
    if (f.name == name) f.allow_empty = true;
  }
  return *this;
}

FlagTable& FlagTable::enable_config_file() {
  config_file_ = true;
  return *this;
}

absl::StatusOr<ParseResult> FlagTable::parse(const std::vector<std::string>& args) const {
  ParseResult result;
  // The command line first into (flag, value) pairs, so --config applies before every flag.
  std::vector<Given> from_args;
  std::string config_path;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!arg.starts_with("--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string spelled = arg.substr(2);
    std::string value;
    const size_t eq = spelled.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = spelled.substr(eq + 1);
      spelled = spelled.substr(0, eq);
    }
    const bool is_config = config_file_ && spelled == "config";
    const Alias* alias = find_alias(spelled);
    const std::string name = alias != nullptr ? alias->name : spelled;
    if (!is_config && find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--", spelled, ": unknown flag"));
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", spelled, ": missing value"));
      }
      value = args[++i];
    }
    if (is_config) {
      config_path = value;
      continue;
    }
    from_args.push_back({name, value, "--" + spelled, spelled});
  }

  std::vector<Given> from_file;
  if (!config_path.empty()) {
    YAML::Node root;
    try {
      root = YAML::LoadFile(config_path);
    } catch (const YAML::BadFile&) {
      return absl::NotFoundError(absl::StrCat("--config: cannot read '", config_path, "'"));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": malformed YAML: ", e.what()));
    }
    if (!root.IsNull() && !root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": expected a mapping of options"));
    }
    if (root.IsMap()) {
      for (const auto& item : root) {
        const std::string key = item.first.as<std::string>();
        // Keys are snake_case only: a dash in a key is as unknown as a misspelled name.
        const Alias* alias = key.find('-') == std::string::npos ? find_alias(kebab(key)) : nullptr;
        const std::string name = alias != nullptr ? alias->name : kebab(key);
        if (key.find('-') != std::string::npos || find(name) == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(config_path, ": ", key, ": unknown option"));
        }
        if (!item.second.IsScalar()) {
          return absl::InvalidArgumentError(
              absl::StrCat(config_path, ": ", key, ": expected a scalar"));
        }
        from_file.push_back(
            {name, item.second.Scalar(), absl::StrCat(config_path, ": ", key), kebab(key)});
      }
    }
  }

  // An alias and its flag both on the command line must agree.
  for (const Given& a : from_args) {
    for (const Given& b : from_args) {
      if (a.name == b.name && a.spelled != a.name && b.spelled == b.name && a.value != b.value) {
        return absl::InvalidArgumentError(absl::StrCat(a.where, ": ", a.value, " disagrees with ",
                                                       b.where, " ", b.value,
                                                       " (they name the same flag; give one)"));
      }
    }
  }

  for (const std::vector<Given>* source : {&from_file, &from_args}) {
    for (const Given& g : *source) {
      const Flag* f = find(g.name);
      if (g.value.empty() && !f->allow_empty && f->type == FlagType::kString) {
        return absl::InvalidArgumentError(absl::StrCat(g.where, ": must not be empty, got ''"));
      }
      if (absl::Status s = f->set(g.value); !s.ok()) return with_prefix(g.where, s);
      if (g.spelled != g.name) {
        const std::string warning =
            absl::StrCat(flag_name(g.spelled), " is deprecated; use ", flag_name(g.name));
        if (std::find(result.warnings.begin(), result.warnings.end(), warning) ==
            result.warnings.end()) {
          result.warnings.push_back(warning);
        }
      }
      if (!result.was_given(g.name)) result.given.push_back(g.name);
    }
  }
  for (const Flag& f : flags_) {
    if (f.required && !result.was_given(f.name)) {
      return absl::InvalidArgumentError(absl::StrCat("--", f.name, ": required"));
    }
  }
  return result;
}

std::string FlagTable::usage() const {
  std::string out =
      absl::StrCat("usage: ", program_, config_file_ ? " [--config FILE]" : "", " [flags]\n");
  if (config_file_) {
    absl::StrAppend(&out,
                    "  --config FILE\n      YAML mapping of flag names in snake_case, read "
                    "before the flags (flags override it)\n");
  }
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, " ", f.type_text);
    if (f.required) {
      absl::StrAppend(&out, " (required)");
    } else {
      absl::StrAppend(&out, " (default: ", f.default_text.empty() ? "\"\"" : f.default_text, ")");
    }
    absl::StrAppend(&out, "\n");
    if (!f.help.empty()) absl::StrAppend(&out, "      ", f.help, "\n");
  }
  for (const Alias& a : aliases_) {
    absl::StrAppend(&out, "  --", a.old_name, "\n      deprecated: use --", a.name, "\n");
  }
  return out;
}

bool wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "--help" || a == "-h"; });
}

std::string flag_name(std::string_view name) { return absl::StrCat("--", kebab(name)); }

}  // namespace fp8rl::flags
