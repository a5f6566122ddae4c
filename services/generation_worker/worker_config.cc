// Flag and YAML parsing for fp8rl-generation-worker (see worker_config.h).
#include "services/generation_worker/worker_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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
  const SchedulerOptions scheduler;
  o.extra = {
      {"metrics_port", absl::StrCat(kDefaultMetricsPort)},
      {"weight_sync", "localhost:50052"},
      {"worker_id", ""},
      {"precision", ""},
      {"kv_cache", ""},
      {"max_batch_tokens", absl::StrCat(scheduler.max_batch_tokens)},
      {"kv_cache_tokens", absl::StrCat(scheduler.kv_cache_tokens)},
      {"kv_block_size", absl::StrCat(scheduler.kv_block_size)},
      {"device", "auto"},
      {"gpu_memory_fraction", "0.9"},
      {"gpu_weight_slots", absl::StrCat(scheduler.gpu_weight_slots)},
      {"max_queued_samples", absl::StrCat(scheduler.max_queued_samples)},
      {"batch_wait_ms", absl::StrCat(scheduler.batch_wait.count())},
      {"max_samples_per_request", "4096"},
      {"weight_relay", "off"},
      {"relay_stall_ms", "10000"},
  };
  return o;
}

absl::StatusOr<GenerationWorkerConfig> parse_generation_worker_config(
    const std::vector<std::string>& args) {
  const service::ServiceOptions defaults = default_generation_worker_options();
  absl::StatusOr<service::ServiceOptions> parsed = service::parse_service_options(defaults, args);
  if (!parsed.ok()) return parsed.status();
  GenerationWorkerConfig config;
  config.service = *parsed;

  absl::StatusOr<int> metrics_port =
      service::resolve_metrics_port(&config.service, kDefaultMetricsPort);
  if (!metrics_port.ok()) return metrics_port.status();
  config.metrics_port = *metrics_port;

  FP8RL_RETURN_IF_ERROR(check_address("--coordinator", config.service.coordinator));
  config.weight_sync = service::extra_string(config.service, "weight_sync");
  FP8RL_RETURN_IF_ERROR(check_address("--weight-sync", config.weight_sync));
  config.worker_id = service::extra_string(config.service, "worker_id");

  if (const std::string p = service::extra_string(config.service, "precision"); !p.empty()) {
    absl::StatusOr<model::Precision> precision = model::parse_precision(p);
    if (!precision.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precision: ", precision.status().message()));
    }
    config.precision.linear = *precision;
  }
  if (const std::string k = service::extra_string(config.service, "kv_cache"); !k.empty()) {
    absl::StatusOr<model::KvCacheDtype> kv = model::parse_kv_cache_dtype(k);
    if (!kv.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache: ", kv.status().message()));
    }
    config.precision.kv_cache = *kv;
  }

  absl::StatusOr<int64_t> max_batch_tokens =
      service::extra_int_in_range(config.service, "max_batch_tokens", 1, int64_t{1} << 24);
  if (!max_batch_tokens.ok()) return max_batch_tokens.status();
  absl::StatusOr<int64_t> kv_tokens =
      service::extra_int_in_range(config.service, "kv_cache_tokens", 1, int64_t{1} << 34);
  if (!kv_tokens.ok()) return kv_tokens.status();
  absl::StatusOr<int64_t> kv_block_size =
      service::extra_int_in_range(config.service, "kv_block_size", 1, 1024);
  if (!kv_block_size.ok()) return kv_block_size.status();
  if (*kv_block_size > *kv_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-tokens: must hold at least one ",
                                                   "KV block (--kv-block-size ", *kv_block_size,
                                                   "), got ", *kv_tokens));
  }
  config.device = service::extra_string(config.service, "device");
  if (absl::Status s = model::check_device_flag(config.device); !s.ok()) return s;
  absl::StatusOr<double> fraction = model::parse_gpu_memory_fraction(
      service::extra_string(config.service, "gpu_memory_fraction"));
  if (!fraction.ok()) return fraction.status();
  config.gpu_memory_fraction = *fraction;
  absl::StatusOr<int64_t> weight_slots =
      service::extra_int_in_range(config.service, "gpu_weight_slots", 1, 2);
  if (!weight_slots.ok()) return weight_slots.status();
  config.scheduler.gpu_weight_slots = *weight_slots;
  absl::StatusOr<int64_t> max_queued =
      service::extra_int_in_range(config.service, "max_queued_samples", 1, int64_t{1} << 24);
  if (!max_queued.ok()) return max_queued.status();
  absl::StatusOr<int64_t> batch_wait =
      service::extra_int_in_range(config.service, "batch_wait_ms", 0, 10000);
  if (!batch_wait.ok()) return batch_wait.status();
  absl::StatusOr<int64_t> max_samples =
      service::extra_int_in_range(config.service, "max_samples_per_request", 1, int64_t{1} << 20);
  if (!max_samples.ok()) return max_samples.status();
  config.scheduler.max_batch_tokens = *max_batch_tokens;
  config.scheduler.kv_cache_tokens = *kv_tokens;
  config.scheduler.kv_block_size = *kv_block_size;
  config.scheduler.max_queued_samples = *max_queued;
  config.scheduler.batch_wait = std::chrono::milliseconds(*batch_wait);
  config.max_samples_per_request = *max_samples;
  const std::string relay = service::extra_string(config.service, "weight_relay");
  if (relay != "on" && relay != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight-relay: must be on or off, got '", relay, "'"));
  }
  config.weight_relay = relay == "on";
  absl::StatusOr<int64_t> stall =
      service::extra_int_in_range(config.service, "relay_stall_ms", 100, 3600000);
  if (!stall.ok()) return stall.status();
  config.relay_stall_ms = *stall;
  FP8RL_RETURN_IF_ERROR(validate_scheduler_options(config.scheduler));
  return config;
}

}  // namespace fp8rl::generation
