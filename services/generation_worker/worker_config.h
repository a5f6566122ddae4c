// Command-line and YAML configuration of fp8rl-generation-worker: the common service options
// (common/service/options.h) plus --metrics-port, --weight-sync, --worker-id, --precision,
// --kv-cache, --max-batch-tokens and the scheduler limits, resolved into typed values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/options.h"
#include "services/generation_worker/scheduler.h"
#include "services/generation_worker/weight_loader.h"

namespace fp8rl::generation {

inline constexpr int kDefaultGrpcPort = 50061;
inline constexpr int kDefaultMetricsPort = 9461;

struct GenerationWorkerConfig {
  service::ServiceOptions service;         // --grpc-port, --coordinator, --advertise-host, ...
  int metrics_port = kDefaultMetricsPort;  // --metrics-port (alias --http-port): /metrics, /healthz
  std::string weight_sync = "localhost:50052";  // --weight-sync host:port
  // --worker-id: stable name registered with the coordinator and used with weight sync; empty
  // means "<advertise-host>:<bound grpc port>".
  std::string worker_id;
  PrecisionOverrides precision;  // --precision, --kv-cache (empty: from the payload)
  SchedulerOptions scheduler;    // --max-batch-tokens, --kv-cache-tokens, --max-queued-samples,
                                 // --batch-wait-ms
  int64_t max_samples_per_request = 4096;  // --max-samples-per-request
};

// Defaults of every flag (gRPC 50061, metrics 9461, shutdown grace 10 s).
service::ServiceOptions default_generation_worker_options();

// Parses the arguments after the program name (--config FILE first, flags override). Errors name
// the flag: "--max-batch-tokens: must be in [1, 16777216], got 0".
absl::StatusOr<GenerationWorkerConfig> parse_generation_worker_config(
    const std::vector<std::string>& args);

}  // namespace fp8rl::generation
