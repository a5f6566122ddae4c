// The common service flags in a typed flag table (see options.h).
#include "common/service/options.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace fp8rl::service {

void add_service_flags(flags::FlagTable& table, ServiceOptions* o) {
  table.enable_config_file();
  table.add_string("listen-host", &o->listen_host, "bind address of the gRPC and HTTP servers")
      .add_int("grpc-port", &o->grpc_port, 0, 65535, "gRPC port (0: a free port)")
      .add_int("http-port", &o->http_port, 0, 65535,
               "HTTP port: /metrics, /healthz (and REST on the coordinator); 0: a free port")
      .deprecated_alias("metrics-port", "http-port")
      .add_string("advertise-host", &o->advertise_host, "the host other processes reach us by")
      .add_string("coordinator", &o->coordinator, "host:port of the coordinator")
      .add_string("data-dir", &o->data_dir, "folder of this service's state")
      .add_enum<std::string>(
          "log-level", &o->log_level,
          {{"debug", "debug"}, {"info", "info"}, {"warn", "warn"}, {"error", "error"}},
          "least severe log line written")
      .add_double("shutdown-grace-seconds", &o->shutdown_grace_seconds, 0, 3600,
                  "how long in-flight calls get to finish on SIGTERM")
      .add_int("max-body-bytes", &o->max_body_bytes, 1, int64_t{1} << 32,
               "largest HTTP request body accepted")
      .add_string("cluster-token-file", &o->cluster_token_file,
                  "token internal calls carry and this service requires (empty: off)",
                  /*allow_empty=*/true)
      .add_string("tls-cert", &o->tls_cert, "PEM certificate for gRPC TLS and HTTPS (empty: off)",
                  true)
      .add_string("tls-key", &o->tls_key, "PEM private key of --tls-cert", true)
      .add_string("tls-ca", &o->tls_ca, "CA that verifies peers: mutual TLS (empty: off)", true)
      .add_string("tls-server-name", &o->tls_server_name,
                  "name peers' certificates are checked against (empty: the host called)", true);
}

namespace {

// The table of a program with only the common flags and string-valued extras.
void add_extra_flags(flags::FlagTable& table, ServiceOptions* options) {
  for (auto& [key, value] : options->extra) {
    table.add_string(absl::StrReplaceAll(key, {{"_", "-"}}), &value, "", /*allow_empty=*/true);
  }
}

}  // namespace

absl::StatusOr<ServiceOptions> parse_service_options(const ServiceOptions& defaults,
                                                     const std::vector<std::string>& args) {
  ServiceOptions options = defaults;
  flags::FlagTable table("fp8rl-" + defaults.name);
  add_service_flags(table, &options);
  add_extra_flags(table, &options);
  absl::StatusOr<flags::ParseResult> parsed = table.parse(args);
  if (!parsed.ok()) return parsed.status();
  return options;
}

std::string service_options_usage(const ServiceOptions& defaults) {
  ServiceOptions options = defaults;
  flags::FlagTable table("fp8rl-" + defaults.name);
  add_service_flags(table, &options);
  add_extra_flags(table, &options);
  return table.usage();
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

std::string listen_address(const ServiceOptions& options, int port) {
  return absl::StrCat(options.listen_host, ":", port);
}

std::string advertise_address(const ServiceOptions& options, int port) {
  return absl::StrCat(options.advertise_host, ":", port);
}

}  // namespace fp8rl::service
