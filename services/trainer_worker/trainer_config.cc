// Flag and YAML parsing for fp8rl-trainer-worker (see trainer_config.h).
#include "services/trainer_worker/trainer_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fp8rl::trainer {

service::ServiceOptions default_trainer_service_options() {
  service::ServiceOptions o;
  o.name = "trainer";
  o.grpc_port = kDefaultGrpcPort;
  o.http_port = kDefaultMetricsPort;
  o.data_dir = kDefaultDataDir;
  // A TrainStep on 2 CPU cores can take seconds: give the in-flight call time to finish.
  o.shutdown_grace_seconds = 30.0;
  o.extra = {
      {"metrics_port", absl::StrCat(kDefaultMetricsPort)},
      {"weight_sync", kDefaultWeightSync},
      {"name", "trainer"},
      // Per-token logprob log of every TrainStep (relative: under --data-dir); empty = off.
      {"logprob_log_dir", ""},
      // Folders the paths of incoming calls must lie in (common/path_roots.h), checked again here
      // where the files are opened: SaveCheckpoint/LoadCheckpoint paths under --data-root,
      // InitPolicy's model.checkpoint_dir under --models-root. Empty: not checked.
      {"data_root", ""},
      {"models_root", ""},
      // Trainer groups: gradient all-reduce buckets (MiB) sent while the backward runs; 0: one
      // all-reduce after the backward (docs/design/training.md "Trainer groups"; 4 measured in
      // docs/perf.md).
      {"allreduce_bucket_mb", "4"},
      // Where the policy trains: cuda, cpu or auto (cuda when an sm_90 device is visible and
      // the build can train on it), and the share of the device's memory it may take.
      {"device", "auto"},
      {"gpu_memory_fraction", "0.9"},
      // Activation recomputation per decoder layer (none | layers) and the largest training
      // forward, in tokens, the memory plan budgets for.
      {"recompute", "none"},
      {"max_step_tokens", "16384"},
      // Trainer groups: what the ranks shard (none | grads_optimizer; docs/design/sharding.md).
      {"shard", "none"},
  };
  return o;
}

model::DeviceProbeResult trainer_device_probe() {
  model::DeviceProbeResult r = model::probe_cuda_device();
  if (r.device.has_value() && !train::cuda_train_backend_available()) {
    r.detail = absl::StrCat(r.device->name, " visible, but ",
                            train::cuda_train_backend_unavailable_reason());
    r.device.reset();
  }
  return r;
}

void apply_device(const model::DeviceSelection& device, const TrainerConfig& config,
                  std::string* options_device, int64_t* budget_bytes) {
  const bool cuda = device.device == model::Device::kCuda && device.cuda.has_value();
  *options_device = cuda ? "cuda" : "cpu";
  *budget_bytes =
      cuda ? model::gpu_memory_budget_bytes(*device.cuda, config.gpu_memory_fraction) : 0;
}

absl::StatusOr<TrainerConfig> parse_trainer_config(const std::vector<std::string>& args) {
  const service::ServiceOptions defaults = default_trainer_service_options();
  absl::StatusOr<service::ServiceOptions> parsed = service::parse_service_options(defaults, args);
  if (!parsed.ok()) return parsed.status();
  TrainerConfig config;
  config.service = *parsed;

  absl::StatusOr<int> metrics_port =
      service::resolve_metrics_port(&config.service, kDefaultMetricsPort);
  if (!metrics_port.ok()) return metrics_port.status();
  config.metrics_port = *metrics_port;
  config.weight_sync = service::extra_string(config.service, "weight_sync");
  if (config.weight_sync.empty()) {
    return absl::InvalidArgumentError("--weight-sync: must be a host:port");
  }
  config.name = service::extra_string(config.service, "name");
  config.logprob_log_dir = service::extra_string(config.service, "logprob_log_dir");
  config.data_root = service::extra_string(config.service, "data_root");
  config.models_root = service::extra_string(config.service, "models_root");
  absl::StatusOr<double> bucket_mb = service::extra_double(config.service, "allreduce_bucket_mb");
  if (!bucket_mb.ok()) return bucket_mb.status();
  if (!(*bucket_mb >= 0 && *bucket_mb <= 4096)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--allreduce-bucket-mb: must be in [0, 4096], got ", *bucket_mb));
  }
  config.allreduce_bucket_bytes = static_cast<int64_t>(*bucket_mb * 1024 * 1024);
  config.device = service::extra_string(config.service, "device");
  if (absl::Status s = model::check_device_flag(config.device); !s.ok()) return s;
  absl::StatusOr<double> fraction = model::parse_gpu_memory_fraction(
      service::extra_string(config.service, "gpu_memory_fraction"));
  if (!fraction.ok()) return fraction.status();
  config.gpu_memory_fraction = *fraction;
  absl::StatusOr<train::Recompute> recompute =
      train::parse_recompute(service::extra_string(config.service, "recompute"), "--recompute");
  if (!recompute.ok()) return recompute.status();
  config.recompute = *recompute;
  absl::StatusOr<int64_t> step_tokens =
      service::extra_int_in_range(config.service, "max_step_tokens", 1, int64_t{1} << 30);
  if (!step_tokens.ok()) return step_tokens.status();
  config.max_step_tokens = *step_tokens;
  absl::StatusOr<train::ShardMode> shard =
      train::parse_shard_mode(service::extra_string(config.service, "shard"), "--shard");
  if (!shard.ok()) return shard.status();
  if (*shard == train::ShardMode::kParams) {
    return absl::InvalidArgumentError(
        "--shard: 'params' (ZeRO-3) is not implemented yet; use none or grads_optimizer");
  }
  config.shard = *shard;
  if (config.service.data_dir.empty()) {
    return absl::InvalidArgumentError("--data-dir: must not be empty");
  }
  return config;
}

}  // namespace fp8rl::trainer
