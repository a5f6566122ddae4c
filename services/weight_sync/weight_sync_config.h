// Command-line and YAML configuration of fp8rl-weight-sync, one typed flag table
// (common/flags.h): the common service options (common/service/options.h) plus --keep-versions,
// --chunk-bytes,
// --max-version-bytes, the FP8 delta settings --deltas on|always|off, --delta-max-fraction F and
// --delta-zstd-level N, --fanout direct|chain|tree:K (docs/design/weight-sync-fanout.md) and
// --same-host off|auto with --same-host-dir (docs/design/weight-sync.md "Same-host mapping"),
// resolved into the values main() wires together. --coordinator and --advertise-host say where the
// service registers (as WEIGHT_SYNC) and what address it gives.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/options.h"
#include "services/weight_sync/weight_sync_service.h"

namespace fp8rl::weight_sync {

inline constexpr int kDefaultGrpcPort = 50052;
inline constexpr int kDefaultMetricsPort = 9402;
// --delta-zstd-level takes zstd's regular compression levels; 20..22 ("ultra") need a window
// larger than a delta tensor gains from, and zstd's negative (fast) levels are not offered.
inline constexpr int kMinDeltaZstdLevel = 1;
inline constexpr int kMaxDeltaZstdLevel = 19;

struct WeightSyncConfig {
  service::ServiceOptions service;  // common flags (listen host, log level, shutdown grace, ...)
  WeightSyncOptions sync;           // store and streaming settings
  int metrics_port = kDefaultMetricsPort;  // --http-port: HTTP port of /metrics and /healthz
  // One line per deprecated flag name used ("--metrics-port is deprecated; use --http-port").
  std::vector<std::string> warnings;
  // service.coordinator (--coordinator, default localhost:50051) is where the service registers;
  // `--coordinator ""` disables registration (service.coordinator is then empty).
  // service.advertise_host (--advertise-host, default 127.0.0.1) is the host of the registered
  // gRPC and metrics addresses.
  bool registers() const { return !service.coordinator.empty(); }
};

// Defaults of the common flags (gRPC 50052, HTTP 9402, shutdown grace 5 s); the others default
// to WeightSyncOptions (keep 2 versions, deltas on: full or delta per worker by measured cost, a
// delta only when at most 0.9 of the full version, zstd level 1).
service::ServiceOptions default_weight_sync_service_options();

// The --help text, generated from the flag table.
std::string weight_sync_usage();

// Parses the arguments after the program name (--config FILE first, flags override). Errors name
// the flag: "--keep-versions: must be in [1, 64], got 0", "--deltas: must be on, always or off, got
// 'x'",
// "--delta-max-fraction: must be in (0, 1], got 0", "--delta-zstd-level: must be in [1, 19],
// got 22". --http-port is the HTTP port (common to every service); --metrics-port, its old name
// here, is a deprecated alias. An empty --coordinator (the last one given wins) turns
// registration off.
absl::StatusOr<WeightSyncConfig> parse_weight_sync_config(const std::vector<std::string>& args);

}  // namespace fp8rl::weight_sync
