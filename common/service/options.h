// The options every service binary takes: defaults chosen by the binary, overridden by an
// optional YAML config file (--config FILE), overridden by command-line flags. Flags are
// --kebab-case, YAML keys the same in snake_case. Unknown flags/keys and bad values are errors
// naming the flag or key. Each service adds these to its own typed flag table (common/flags.h)
// with add_service_flags, next to its own flags; parse_service_options serves a program that has
// only string-valued settings of its own (`extra`).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/flags.h"

namespace fp8rl::service {

struct ServiceOptions {
  std::string name;                     // component name in logs ("coordinator")
  std::string listen_host = "0.0.0.0";  // --listen-host: bind address of gRPC and HTTP
  int grpc_port = 0;                    // --grpc-port (0: pick a free port)
  int http_port = 0;  // --http-port (/metrics, /healthz, REST; 0: free port); alias --metrics-port
  std::string advertise_host = "127.0.0.1";     // --advertise-host: how other processes reach us
  std::string coordinator = "localhost:50051";  // --coordinator: host:port of the coordinator
  std::string data_dir = "/tmp/fp8rl";          // --data-dir: state (job store, checkpoints, ...)
  std::string log_level = "info";               // --log-level: debug|info|warn|error
  double shutdown_grace_seconds = 10.0;         // --shutdown-grace-seconds: drain deadline
  int64_t max_body_bytes = 1 << 20;             // --max-body-bytes: HTTP request body limit
  // Security (security.h); every one off when empty. --cluster-token-file: the token internal
  // calls carry and this service's internal endpoints require. --tls-cert/--tls-key: PEM pair
  // for gRPC TLS and HTTPS; --tls-ca: CA that verifies peers (mutual TLS between services).
  std::string cluster_token_file = {};
  std::string tls_cert = {};
  std::string tls_key = {};
  std::string tls_ca = {};
  // --tls-server-name: the name peers' certificates are checked against instead of the host of
  // the address called (workers advertised by IP or container id share one certificate name).
  std::string tls_server_name = {};
  std::map<std::string, std::string> extra;  // service-specific: snake_case key -> value
};

// Adds the common flags to `table`, bound to `options` (whose values are the defaults), and
// --metrics-port as a deprecated alias of --http-port (the workers' old name for it).
void add_service_flags(flags::FlagTable& table, ServiceOptions* options);

// `args` are the arguments after the program name. `defaults` supplies every default and the
// declared extra keys (string-valued). Accepts --flag VALUE and --flag=VALUE. --config FILE loads
// YAML first.
absl::StatusOr<ServiceOptions> parse_service_options(const ServiceOptions& defaults,
                                                     const std::vector<std::string>& args);

// Help text listing every flag with its default.
std::string service_options_usage(const ServiceOptions& defaults);

// Typed access to extra settings; errors name the key ("heartbeat_seconds: expected a number").
absl::StatusOr<int64_t> extra_int(const ServiceOptions& options, std::string_view key);
absl::StatusOr<double> extra_double(const ServiceOptions& options, std::string_view key);
std::string extra_string(const ServiceOptions& options, std::string_view key);

// "host:port" for gRPC / HTTP listening and for advertising.
std::string listen_address(const ServiceOptions& options, int port);
std::string advertise_address(const ServiceOptions& options, int port);

}  // namespace fp8rl::service
