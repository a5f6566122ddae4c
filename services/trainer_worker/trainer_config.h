// Command-line and YAML configuration of fp8rl-trainer-worker: the common service options
// (common/service/options.h: --grpc-port, --coordinator, --advertise-host, --data-dir, --config,
// --log-level, --shutdown-grace-seconds, ...) plus --metrics-port, --weight-sync and --name.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/options.h"

namespace fp8rl::trainer {

inline constexpr int kDefaultGrpcPort = 50053;
inline constexpr int kDefaultMetricsPort = 9403;
inline constexpr char kDefaultWeightSync[] = "localhost:50052";
inline constexpr char kDefaultDataDir[] = "./fp8rl-data/checkpoints";

struct TrainerConfig {
  service::ServiceOptions service;               // common flags
  int metrics_port = kDefaultMetricsPort;        // HTTP port of /metrics and /healthz
  std::string weight_sync = kDefaultWeightSync;  // default Publish target
  std::string name = "trainer";                  // name registered with the coordinator
  std::string logprob_log_dir;                   // --logprob-log-dir (empty: no log)
  std::string data_root;    // --data-root: checkpoint paths must lie here ("" = unchecked)
  std::string models_root;  // --models-root: model checkpoints must lie here ("" = unchecked)
  // --allreduce-bucket-mb (MiB, may be fractional; 4 by default): trainer-group gradient
  // buckets; 0 = one all-reduce after the backward.
  int64_t allreduce_bucket_bytes = 4 << 20;
};

// Defaults of every flag (gRPC 50053, metrics 9403, coordinator localhost:50051).
service::ServiceOptions default_trainer_service_options();

// Parses the arguments after the program name (--config FILE first, flags override). Errors name
// the flag ("--metrics-port: must be in [0, 65535], got 70000"). --http-port is accepted as an
// alias of --metrics-port. An empty --coordinator disables registration.
absl::StatusOr<TrainerConfig> parse_trainer_config(const std::vector<std::string>& args);

}  // namespace fp8rl::trainer
