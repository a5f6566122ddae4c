// Command-line and YAML configuration of fp8rl-weight-sync: the common service options
// (common/service/options.h) plus --metrics-port, --keep-versions, --chunk-bytes and
// --max-version-bytes, resolved into the values main() wires together. --coordinator and
// --advertise-host say where the service registers (as WEIGHT_SYNC) and what address it gives.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/options.h"
#include "services/weight_sync/weight_sync_service.h"

namespace fp8rl::weight_sync {

inline constexpr int kDefaultGrpcPort = 50052;
inline constexpr int kDefaultMetricsPort = 9402;

struct WeightSyncConfig {
  service::ServiceOptions service;  // common flags (listen host, log level, shutdown grace, ...)
  WeightSyncOptions sync;           // store and streaming settings
  int metrics_port = kDefaultMetricsPort;  // HTTP port of /metrics and /healthz
  // service.coordinator (--coordinator, default localhost:50051) is where the service registers;
  // `--coordinator ""` disables registration (service.coordinator is then empty).
  // service.advertise_host (--advertise-host, default 127.0.0.1) is the host of the registered
  // gRPC and metrics addresses.
  bool registers() const { return !service.coordinator.empty(); }
};

// Defaults of every flag (gRPC 50052, metrics 9402, keep 2 versions).
service::ServiceOptions default_weight_sync_service_options();

// Parses the arguments after the program name (--config FILE first, flags override). Errors name
// the flag: "--keep-versions: must be in [1, 64], got 0". --metrics-port is the documented name
// of the HTTP port; --http-port (common to every service) is accepted as an alias. An empty
// --coordinator on the command line (the last one given wins) turns registration off.
absl::StatusOr<WeightSyncConfig> parse_weight_sync_config(const std::vector<std::string>& args);

}  // namespace fp8rl::weight_sync
