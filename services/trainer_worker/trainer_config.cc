// Flag and YAML parsing for fp8rl-trainer-worker (see trainer_config.h).
#include "services/trainer_worker/trainer_config.h"

#include "absl/strings/str_cat.h"
#include "common/flags.h"

namespace fp8rl::trainer {

service::ServiceOptions default_trainer_service_options() {
  service::ServiceOptions o;
  o.name = "trainer";
  o.grpc_port = kDefaultGrpcPort;
  o.http_port = kDefaultMetricsPort;
  o.data_dir = kDefaultDataDir;
  // A TrainStep on 2 CPU cores can take seconds: give the in-flight call time to finish.
  o.shutdown_grace_seconds = 30.0;
  return o;
}

namespace {

// Flag values that are converted after parsing (the table holds their text).
struct FlagText {
  double allreduce_bucket_mb = 4;
  std::string shard = "none";
};

// The flag table of fp8rl-trainer-worker bound to `config` (whose values are the defaults).
void add_flags(flags::FlagTable& table, TrainerConfig* config, FlagText* text) {
  service::add_service_flags(table, &config->service);
  table.add_string("weight-sync", &config->weight_sync, "host:port of the default Publish target")
      .add_string("worker-id", &config->worker_id, "name registered with the coordinator")
      .deprecated_alias("name", "worker-id")
      // Per-token logprob log of every TrainStep (relative: under --data-dir).
      .add_string("logprob-log-dir", &config->logprob_log_dir,
                  "per-token logprob log of every TrainStep, relative to --data-dir (empty: off)",
                  /*allow_empty=*/true)
      // Folders the paths of incoming calls must lie in (common/path_roots.h), checked again
      // here where the files are opened.
      .add_string("data-root", &config->data_root,
                  "SaveCheckpoint/LoadCheckpoint paths must lie here (empty: not checked)", true)
      .add_string("models-root", &config->models_root,
                  "InitPolicy's model.checkpoint_dir must lie here (empty: not checked)", true)
      // docs/design/training.md "Trainer groups"; 4 measured in docs/perf.md.
      .add_double("allreduce-bucket-mb", &text->allreduce_bucket_mb, 0, 4096,
                  "trainer groups: gradient all-reduce buckets (MiB) sent while the backward "
                  "runs; 0: one all-reduce after the backward")
      .add_enum<std::string>("device", &config->device,
                             {{"cuda", "cuda"}, {"cpu", "cpu"}, {"auto", "auto"}},
                             "where the policy trains (auto: cuda when an sm_90 device is "
                             "visible and this build can train on it)")
      .add_double("gpu-memory-fraction", &config->gpu_memory_fraction, 0, 1,
                  "share of the device's memory training may take", /*lo_open=*/true)
      .add_enum("recompute", &config->recompute,
                {{"none", train::Recompute::kNone}, {"layers", train::Recompute::kLayers}},
                "activation recomputation per decoder layer")
      .add_int("max-step-tokens", &config->max_step_tokens, 1, int64_t{1} << 30,
               "tokens of the largest training forward the memory plan budgets for")
      .add_string("shard", &text->shard,
                  "trainer groups: none | grads_optimizer | params (docs/design/sharding.md)")
      .add_int("upload-streams", &config->upload_streams, 1, 256,
               "upload each published version in this many parts on as many connections")
      .add_enum(
          "weight-same-host", &config->weight_same_host,
          {{"off", weight_sync::SameHostMode::kOff}, {"auto", weight_sync::SameHostMode::kAuto}},
          "auto: on weight sync's host, hand it each version as a file in its same-host "
          "directory (TCP otherwise)");
}

TrainerConfig defaults() {
  TrainerConfig config;
  config.service = default_trainer_service_options();
  config.device = "auto";
  return config;
}

}  // namespace

std::string trainer_usage() {
  TrainerConfig config = defaults();
  FlagText text;
  flags::FlagTable table("fp8rl-trainer-worker");
  add_flags(table, &config, &text);
  return table.usage();
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
  TrainerConfig config = defaults();
  FlagText text;
  flags::FlagTable table("fp8rl-trainer-worker");
  add_flags(table, &config, &text);
  absl::StatusOr<flags::ParseResult> parsed = table.parse(args);
  if (!parsed.ok()) return parsed.status();
  config.warnings = parsed->warnings;
  config.metrics_port = config.service.http_port;
  config.allreduce_bucket_bytes = static_cast<int64_t>(text.allreduce_bucket_mb * 1024 * 1024);
  absl::StatusOr<train::ShardMode> shard = train::parse_shard_mode(text.shard, "--shard");
  if (!shard.ok()) return shard.status();
  config.shard = *shard;
  return config;
}

}  // namespace fp8rl::trainer
