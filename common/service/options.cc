// Defaults < YAML file < flags for service options (see options.h).
#include "common/service/options.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"

namespace fp8rl::service {
namespace {

// One settable option: snake_case key, a setter that parses and range-checks, a getter for usage.
struct Field {
  std::string key;
  std::function<absl::Status(ServiceOptions&, const std::string& value, const std::string& where)>
      set;
  std::function<std::string(const ServiceOptions&)> get;
};

absl::Status bad(const std::string& where, std::string_view what, const std::string& value) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", std::string(what), ", got '", value, "'"));
}

Field port_field(std::string key, int ServiceOptions::*member) {
  return {key,
          [member](ServiceOptions& o, const std::string& v, const std::string& where) {
            int port = 0;
            if (!absl::SimpleAtoi(v, &port) || port < 0 || port > 65535) {
              return bad(where, "expected a port number in [0, 65535]", v);
            }
            o.*member = port;
            return absl::OkStatus();
          },
          [member](const ServiceOptions& o) { return absl::StrCat(o.*member); }};
}

Field string_field(std::string key, std::string ServiceOptions::*member) {
  return {key,
          [member](ServiceOptions& o, const std::string& v, const std::string& where) {
            if (v.empty()) return bad(where, "must not be empty", v);
            o.*member = v;
            return absl::OkStatus();
          },
          [member](const ServiceOptions& o) { return o.*member; }};
}

// A file path that may be left empty (the feature it configures is then off).
Field optional_path_field(std::string key, std::string ServiceOptions::*member) {
  return {key,
          [member](ServiceOptions& o, const std::string& v, const std::string&) {
            o.*member = v;
            return absl::OkStatus();
          },
          [member](const ServiceOptions& o) { return o.*member; }};
}

std::vector<Field> fields(const ServiceOptions& defaults) {
  std::vector<Field> out = {
      string_field("listen_host", &ServiceOptions::listen_host),
      port_field("grpc_port", &ServiceOptions::grpc_port),
      port_field("http_port", &ServiceOptions::http_port),
      string_field("advertise_host", &ServiceOptions::advertise_host),
      string_field("coordinator", &ServiceOptions::coordinator),
      string_field("data_dir", &ServiceOptions::data_dir),
      {"log_level",
       [](ServiceOptions& o, const std::string& v, const std::string& where) {
         if (v != "debug" && v != "info" && v != "warn" && v != "error") {
           return bad(where, "must be one of debug, info, warn, error", v);
         }
         o.log_level = v;
         return absl::OkStatus();
       },
       [](const ServiceOptions& o) { return o.log_level; }},
      {"shutdown_grace_seconds",
       [](ServiceOptions& o, const std::string& v, const std::string& where) {
         double x = 0;
         if (!absl::SimpleAtod(v, &x) || !std::isfinite(x) || x < 0 || x > 3600) {
           return bad(where, "expected seconds in [0, 3600]", v);
         }
         o.shutdown_grace_seconds = x;
         return absl::OkStatus();
       },
       [](const ServiceOptions& o) { return absl::StrCat(o.shutdown_grace_seconds); }},
      {"max_body_bytes",
       [](ServiceOptions& o, const std::string& v, const std::string& where) {
         int64_t x = 0;
         if (!absl::SimpleAtoi(v, &x) || x < 1 || x > (int64_t{1} << 32)) {
           return bad(where, "expected a byte count in [1, 2^32]", v);
         }
         o.max_body_bytes = x;
         return absl::OkStatus();
       },
       [](const ServiceOptions& o) { return absl::StrCat(o.max_body_bytes); }},
      optional_path_field("cluster_token_file", &ServiceOptions::cluster_token_file),
      optional_path_field("tls_cert", &ServiceOptions::tls_cert),
      optional_path_field("tls_key", &ServiceOptions::tls_key),
      optional_path_field("tls_ca", &ServiceOptions::tls_ca),
      optional_path_field("tls_server_name", &ServiceOptions::tls_server_name),
  };
  // A named copy, not a structured binding: clang 14 (the sanitizer builds) cannot capture one.
  for (const auto& entry : defaults.extra) {
    const std::string key = entry.first;
    out.push_back({key,
                   [key](ServiceOptions& o, const std::string& v, const std::string&) {
                     o.extra[key] = v;
                     return absl::OkStatus();
                   },
                   [key](const ServiceOptions& o) { return o.extra.at(key); }});
  }
  return out;
}

std::string flag_name(std::string_view key) {
  return absl::StrCat("--", absl::StrReplaceAll(std::string(key), {{"_", "-"}}));
}

const Field* find_field(const std::vector<Field>& all, std::string_view key) {
  for (const Field& f : all) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

absl::Status apply_yaml(const std::string& path, const std::vector<Field>& all,
                        ServiceOptions& options) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(absl::StrCat("--config: cannot read '", path, "'"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed YAML: ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a mapping of options"));
  }
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    const Field* field = find_field(all, key);
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": unknown option"));
    }
    if (!item.second.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": expected a scalar"));
    }
    if (absl::Status s = field->set(options, item.second.Scalar(), absl::StrCat(path, ": ", key));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServiceOptions> parse_service_options(const ServiceOptions& defaults,
                                                     const std::vector<std::string>& args) {
  const std::vector<Field> all = fields(defaults);
  // Split into (key, value) pairs first so --config applies before every flag.
  std::vector<std::pair<std::string, std::string>> pairs;
  std::string config_path;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!arg.starts_with("--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
      value = args[++i];
    }
    const std::string key = absl::StrReplaceAll(name, {{"-", "_"}});
    if (key == "config") {
      config_path = value;
      continue;
    }
    if (find_field(all, key) == nullptr || name.find('_') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": unknown flag"));
    }
    pairs.emplace_back(key, value);
  }
  ServiceOptions options = defaults;
  if (!config_path.empty()) {
    FP8RL_RETURN_IF_ERROR(apply_yaml(config_path, all, options));
  }
  for (const auto& [key, value] : pairs) {
    FP8RL_RETURN_IF_ERROR(find_field(all, key)->set(options, value, flag_name(key)));
  }
  return options;
}

std::string service_options_usage(const ServiceOptions& defaults) {
  std::string out = absl::StrCat("usage: fp8rl-", defaults.name, " [--config FILE] [flags]\n");
  for (const Field& f : fields(defaults)) {
    absl::StrAppend(&out, "  ", flag_name(f.key), " (default: ", f.get(defaults), ")\n");
  }
  return out;
}

absl::StatusOr<int64_t> extra_int(const ServiceOptions& options, std::string_view key) {
  auto it = options.extra.find(std::string(key));
  if (it == options.extra.end()) {
    return absl::NotFoundError(absl::StrCat(std::string(key), ": not a declared option"));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(key), ": expected an integer, got '", it->second, "'"));
  }
  return value;
}

absl::StatusOr<double> extra_double(const ServiceOptions& options, std::string_view key) {
  auto it = options.extra.find(std::string(key));
  if (it == options.extra.end()) {
    return absl::NotFoundError(absl::StrCat(std::string(key), ": not a declared option"));
  }
  double value = 0;
  if (!absl::SimpleAtod(it->second, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(key), ": expected a number, got '", it->second, "'"));
  }
  return value;
}

std::string extra_string(const ServiceOptions& options, std::string_view key) {
  auto it = options.extra.find(std::string(key));
  return it == options.extra.end() ? std::string() : it->second;
}

absl::StatusOr<int64_t> extra_int_in_range(const ServiceOptions& options, std::string_view key,
                                           int64_t lo, int64_t hi) {
  std::string flag = absl::StrCat("--", std::string(key));
  for (char& c : flag) c = c == '_' ? '-' : c;
  const std::string text = extra_string(options, key);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected an integer, got '", text, "'"));
  }
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": must be in [", lo, ", ", hi, "], got ", value));
  }
  return value;
}

absl::StatusOr<int> resolve_metrics_port(ServiceOptions* options, int default_port) {
  absl::StatusOr<int64_t> metrics_port = extra_int_in_range(*options, "metrics_port", 0, 65535);
  if (!metrics_port.ok()) return metrics_port.status();
  const bool metrics_set = *metrics_port != default_port;
  const bool http_set = options->http_port != default_port;
  if (metrics_set && http_set && *metrics_port != options->http_port) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port: ", *metrics_port, " disagrees with --http-port ",
                     options->http_port, " (they name the same port; give one)"));
  }
  options->http_port = metrics_set ? static_cast<int>(*metrics_port) : options->http_port;
  return options->http_port;
}

std::string listen_address(const ServiceOptions& options, int port) {
  return absl::StrCat(options.listen_host, ":", port);
}

std::string advertise_address(const ServiceOptions& options, int port) {
  return absl::StrCat(options.advertise_host, ":", port);
}

}  // namespace fp8rl::service
