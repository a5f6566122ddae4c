// Command-line and YAML configuration of fp8rl-trainer-worker, one typed flag table
// (common/flags.h): the common service options (common/service/options.h: --grpc-port,
// --http-port, --coordinator, --advertise-host, --data-dir, --config, --log-level,
// --shutdown-grace-seconds, ...) plus --weight-sync, --worker-id and the training settings.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/service/options.h"
#include "model/device.h"
#include "services/weight_sync/same_host.h"
#include "train/shard.h"
#include "train/train_backend.h"

namespace fp8rl::trainer {

inline constexpr int kDefaultGrpcPort = 50053;
inline constexpr int kDefaultMetricsPort = 9403;
inline constexpr char kDefaultWeightSync[] = "localhost:50052";
inline constexpr char kDefaultDataDir[] = "./fp8rl-data/checkpoints";

struct TrainerConfig {
  service::ServiceOptions service;               // common flags
  int metrics_port = kDefaultMetricsPort;        // --http-port: /metrics and /healthz
  std::string weight_sync = kDefaultWeightSync;  // --weight-sync: default Publish target
  std::string worker_id = "trainer";             // --worker-id (old name --name): registered name
  std::string logprob_log_dir;                   // --logprob-log-dir (empty: no log)
  std::string data_root;    // --data-root: checkpoint paths must lie here ("" = unchecked)
  std::string models_root;  // --models-root: model checkpoints must lie here ("" = unchecked)
  // --allreduce-bucket-mb (MiB, may be fractional; 4 by default): trainer-group gradient
  // buckets; 0 = one all-reduce after the backward.
  int64_t allreduce_bucket_bytes = 4 << 20;
  // --device cuda|cpu|auto (auto: cuda when an sm_90 device is visible and this build can train
  // on it, else cpu); resolved by model::select_device when the worker starts (model/device.h).
  std::string device;
  // --gpu-memory-fraction in (0, 1]: the share of the device's memory training may take.
  double gpu_memory_fraction = 0.9;
  // --recompute none|layers: activation recomputation per decoder layer (train/train_backend.h).
  train::Recompute recompute = train::Recompute::kNone;
  // --max-step-tokens: tokens of the largest training forward the memory plan budgets for.
  int64_t max_step_tokens = 16384;
  // --shard none|grads_optimizer|params: ZeRO-2 / ZeRO-3 in a trainer group
  // (train::Learner::set_shard_mode).
  train::ShardMode shard = train::ShardMode::kNone;
  // --upload-streams N in [1, 256]: a trainer alone (or rank 0 of an unsharded group) uploads each
  // version as N parts on N connections (make_grpc_weight_publisher); a sharded group uploads one
  // part per rank whatever this says.
  int64_t upload_streams = 1;
  // --weight-same-host off|auto: on weight sync's host (when it runs --same-host auto), write each
  // single-stream upload into its same-host directory instead of sending it over TCP
  // (weight_sync::upload_same_host; TCP otherwise).
  weight_sync::SameHostMode weight_same_host = weight_sync::SameHostMode::kAuto;
  // One line per deprecated flag name used ("--name is deprecated; use --worker-id").
  std::vector<std::string> warnings;
};

// The trainer's device probe: model::probe_cuda_device, then no device (with the reason) when
// this build cannot train on CUDA (train::cuda_train_backend_available).
model::DeviceProbeResult trainer_device_probe();
// The resolved --device into `options` (device name and, on cuda, the memory budget).
void apply_device(const model::DeviceSelection& device, const TrainerConfig& config,
                  std::string* options_device, int64_t* budget_bytes);

// Defaults of the common flags (gRPC 50053, HTTP 9403, coordinator localhost:50051, shutdown
// grace 30 s); the others default to TrainerConfig's.
service::ServiceOptions default_trainer_service_options();

// The --help text, generated from the flag table.
std::string trainer_usage();

// Parses the arguments after the program name (--config FILE first, flags override). Errors name
// the flag as given ("--http-port: must be in [0, 65535], got 70000"). --metrics-port and --name
// are deprecated aliases of --http-port and --worker-id.
absl::StatusOr<TrainerConfig> parse_trainer_config(const std::vector<std::string>& args);

}  // namespace fp8rl::trainer
