// Command-line and YAML configuration of fp8rl-generation-worker, one typed flag table
// (common/flags.h): the common service options (common/service/options.h: --http-port, ...)
// plus --weight-sync, --worker-id, --precision,
// --kv-cache, --device, --gpu-memory-fraction, --max-batch-tokens, the scheduler limits
// (--kv-cache-tokens, --kv-block-size, ...) and --weight-relay / --relay-stall-ms, resolved into
// typed values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/options.h"
#include "model/device.h"
#include "services/generation_worker/scheduler.h"
#include "services/generation_worker/weight_loader.h"
#include "services/weight_sync/same_host.h"

namespace fp8rl::generation {

inline constexpr int kDefaultGrpcPort = 50061;
inline constexpr int kDefaultMetricsPort = 9461;

struct GenerationWorkerConfig {
  service::ServiceOptions service;              // --grpc-port, --coordinator, --advertise-host, ...
  int metrics_port = kDefaultMetricsPort;       // --http-port (old name --metrics-port): /metrics
  std::string weight_sync = "localhost:50052";  // --weight-sync host:port
  // --worker-id: stable name registered with the coordinator and used with weight sync; empty
  // means "<advertise-host>:<bound grpc port>".
  std::string worker_id;
  PrecisionOverrides precision;  // --precision, --kv-cache (empty: from the payload)
  SchedulerOptions scheduler;    // --max-batch-tokens, --kv-cache-tokens, --kv-block-size,
                                 // --max-queued-samples, --batch-wait-ms
  // --device cuda|cpu|auto (auto: cuda when an sm_90 device is visible, else cpu); resolved
  // by model::select_device when the worker starts (model/device.h).
  std::string device;
  // --gpu-memory-fraction in (0, 1]: the share of the device's memory the CUDA backend may take
  // (weights, activations and KV blocks); unused on the CPU.
  double gpu_memory_fraction = 0.9;
  int64_t max_samples_per_request = 4096;  // --max-samples-per-request
  // --weight-relay on|off: serve WeightSyncService Subscribe on the worker's gRPC port and pass
  // each version on to the workers behind it, when weight sync runs --fanout chain|tree:K
  // (docs/design/weight-sync-fanout.md). Costs one more version in memory (the relay's store).
  bool weight_relay = false;
  // --relay-stall-ms: an upstream relay silent this long while a newer version exists is left.
  int64_t relay_stall_ms = 10000;
  // --weight-same-host off|auto: on weight sync's host (run with --same-host auto), read each
  // version from the file weight sync writes there instead of over TCP; a worker that cannot
  // read it says so and takes versions over TCP (docs/design/weight-sync.md "Same-host mapping").
  weight_sync::SameHostMode weight_same_host = weight_sync::SameHostMode::kAuto;
  // One line per deprecated flag name used ("--metrics-port is deprecated; use --http-port").
  std::vector<std::string> warnings;
};

// The worker's device probe for --device: model::probe_cuda_device, except that a visible device
// is offered only when this build has the CUDA inference backend (model::cuda_backend_available();
// otherwise auto stays on the CPU and `cuda` is refused with the reason).
model::DeviceProbeResult worker_device_probe();

// Records the selected device in config->scheduler (device, and for cuda the byte budget
// floor(gpu_memory_fraction * device memory)).
absl::Status apply_device(const model::DeviceSelection& device, GenerationWorkerConfig* config);

// Defaults of the common flags (gRPC 50061, HTTP 9461, shutdown grace 10 s); the others default
// to GenerationWorkerConfig's and SchedulerOptions'.
service::ServiceOptions default_generation_worker_options();

// The --help text, generated from the flag table.
std::string generation_worker_usage();

// Parses the arguments after the program name (--config FILE first, flags override). Errors name
// the flag: "--max-batch-tokens: must be in [1, 16777216], got 0".
absl::StatusOr<GenerationWorkerConfig> parse_generation_worker_config(
    const std::vector<std::string>& args);

}  // namespace fp8rl::generation
