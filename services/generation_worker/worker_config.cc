// Flag and YAML parsing for fp8rl-generation-worker (see worker_config.h).
#include "services/generation_worker/worker_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "model/device.h"

namespace fp8rl::generation {
namespace {

// host:port with a non-empty host and a port in [1, 65535].
absl::Status check_address(const std::string& flag, const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected host:port, got '", address, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

model::DeviceProbeResult worker_device_probe() {
  model::DeviceProbeResult r = model::probe_cuda_device();
  if (r.device.has_value() && !model::cuda_backend_available()) {
    r.detail =
        absl::StrCat(r.device->name, " visible, but ", model::cuda_backend_unavailable_reason());
    r.device.reset();
  }
  return r;
}

absl::Status apply_device(const model::DeviceSelection& device, GenerationWorkerConfig* config) {
  config->scheduler.device = device.device;
  config->scheduler.gpu_memory_budget_bytes = 0;
  if (device.device == model::Device::kCuda) {
    if (!device.cuda.has_value()) {
      return absl::InvalidArgumentError("--device cuda: no device information");
    }
    config->scheduler.gpu_memory_budget_bytes =
        model::gpu_memory_budget_bytes(*device.cuda, config->gpu_memory_fraction);
  }
  return absl::OkStatus();
}

service::ServiceOptions default_generation_worker_options() {
  service::ServiceOptions o;
  o.name = "generation-worker";
  o.grpc_port = kDefaultGrpcPort;
  o.http_port = kDefaultMetricsPort;
  o.shutdown_grace_seconds = 10.0;
  return o;
}

namespace {

// Flag values that are converted after parsing (the table holds their text).
struct FlagText {
  std::string precision;
  std::string kv_cache;
};

// The flag table of fp8rl-generation-worker bound to `config` (whose values are the defaults).
void add_flags(flags::FlagTable& table, GenerationWorkerConfig* config, FlagText* text) {
  SchedulerOptions& scheduler = config->scheduler;
  service::add_service_flags(table, &config->service);
  table.add_string("weight-sync", &config->weight_sync, "host:port of the weight-sync service")
      .add_string("worker-id", &config->worker_id,
                  "name registered with the coordinator and weight sync (empty: "
                  "<advertise-host>:<grpc port>)",
                  /*allow_empty=*/true)
      .add_string("precision", &text->precision,
                  "linear-layer format overriding the published one (empty: as published)", true)
      .add_string("kv-cache", &text->kv_cache,
                  "KV-cache format overriding the published one (empty: as published)", true)
      .add_int("max-batch-tokens", &scheduler.max_batch_tokens, 1, int64_t{1} << 24,
               "tokens per scheduler step")
      .add_int("kv-cache-tokens", &scheduler.kv_cache_tokens, 1, int64_t{1} << 34,
               "KV budget on the CPU, in tokens (whole blocks)")
      .add_int("kv-block-size", &scheduler.kv_block_size, 1, 1024, "tokens per KV block")
      .add_enum<std::string>("device", &config->device,
                             {{"cuda", "cuda"}, {"cpu", "cpu"}, {"auto", "auto"}},
                             "where the model runs (auto: cuda when an sm_90 device is visible)")
      .add_double("gpu-memory-fraction", &config->gpu_memory_fraction, 0, 1,
                  "share of the device's memory the CUDA backend may take", /*lo_open=*/true)
      .add_int("gpu-weight-slots", &scheduler.gpu_weight_slots, 1, 2,
               "weight versions on the device (2: the next is copied while a batch drains)")
      .add_int("max-queued-samples", &scheduler.max_queued_samples, 1, int64_t{1} << 24,
               "samples waiting at most")
      .add_duration("batch-wait-ms", &scheduler.batch_wait, flags::DurationUnit::kMilliseconds, 0,
                    10000, "how long a step waits for more samples")
      .add_int("max-samples-per-request", &config->max_samples_per_request, 1, int64_t{1} << 20,
               "samples one Generate call may ask for")
      .add_bool("weight-relay", &config->weight_relay,
                "serve Subscribe and pass versions on (weight sync --fanout chain|tree:K)")
      .add_int("relay-stall-ms", &config->relay_stall_ms, 100, 3600000,
               "an upstream relay silent this long while a newer version exists is left")
      .add_enum(
          "weight-same-host", &config->weight_same_host,
          {{"off", weight_sync::SameHostMode::kOff}, {"auto", weight_sync::SameHostMode::kAuto}},
          "auto: on weight sync's host, read versions from its same-host file (TCP "
          "otherwise)");
}

GenerationWorkerConfig defaults() {
  GenerationWorkerConfig config;
  config.service = default_generation_worker_options();
  config.device = "auto";
  return config;
}

}  // namespace

std::string generation_worker_usage() {
  GenerationWorkerConfig config = defaults();
  FlagText text;
  flags::FlagTable table("fp8rl-generation-worker");
  add_flags(table, &config, &text);
  return table.usage();
}

absl::StatusOr<GenerationWorkerConfig> parse_generation_worker_config(
    const std::vector<std::string>& args) {
  GenerationWorkerConfig config = defaults();
  FlagText text;
  flags::FlagTable table("fp8rl-generation-worker");
  add_flags(table, &config, &text);
  absl::StatusOr<flags::ParseResult> parsed = table.parse(args);
  if (!parsed.ok()) return parsed.status();
  config.warnings = parsed->warnings;
  config.metrics_port = config.service.http_port;

  FP8RL_RETURN_IF_ERROR(check_address("--coordinator", config.service.coordinator));
  FP8RL_RETURN_IF_ERROR(check_address("--weight-sync", config.weight_sync));
  if (!text.precision.empty()) {
    absl::StatusOr<model::Precision> precision = model::parse_precision(text.precision);
    if (!precision.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precision: ", precision.status().message()));
    }
    config.precision.linear = *precision;
  }
  if (!text.kv_cache.empty()) {
    absl::StatusOr<model::KvCacheDtype> kv = model::parse_kv_cache_dtype(text.kv_cache);
    if (!kv.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache: ", kv.status().message()));
    }
    config.precision.kv_cache = *kv;
  }
  if (config.scheduler.kv_block_size > config.scheduler.kv_cache_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-tokens: must hold at least one ", "KV block (--kv-block-size ",
                     config.scheduler.kv_block_size, "), got ", config.scheduler.kv_cache_tokens));
  }
  FP8RL_RETURN_IF_ERROR(validate_scheduler_options(config.scheduler));
  return config;
}

}  // namespace fp8rl::generation
