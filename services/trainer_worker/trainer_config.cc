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
  };
  return o;
}

absl::StatusOr<TrainerConfig> parse_trainer_config(const std::vector<std::string>& args) {
  const service::ServiceOptions defaults = default_trainer_service_options();
  absl::StatusOr<service::ServiceOptions> parsed = service::parse_service_options(defaults, args);
  if (!parsed.ok()) return parsed.status();
  TrainerConfig config;
  config.service = *parsed;

  const std::string text = service::extra_string(config.service, "metrics_port");
  int64_t metrics_port = 0;
  if (!absl::SimpleAtoi(text, &metrics_port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port: expected an integer, got '", text, "'"));
  }
  if (metrics_port < 0 || metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port: must be in [0, 65535], got ", metrics_port));
  }
  const bool metrics_set = metrics_port != kDefaultMetricsPort;
  const bool http_set = config.service.http_port != kDefaultMetricsPort;
  if (metrics_set && http_set && metrics_port != config.service.http_port) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port: ", metrics_port, " disagrees with --http-port ",
                     config.service.http_port, " (they name the same port; give one)"));
  }
  config.metrics_port = metrics_set ? static_cast<int>(metrics_port) : config.service.http_port;
  config.service.http_port = config.metrics_port;
  config.weight_sync = service::extra_string(config.service, "weight_sync");
  if (config.weight_sync.empty()) {
    return absl::InvalidArgumentError("--weight-sync: must be a host:port");
  }
  config.name = service::extra_string(config.service, "name");
  if (config.service.data_dir.empty()) {
    return absl::InvalidArgumentError("--data-dir: must not be empty");
  }
  return config;
}

}  // namespace fp8rl::trainer
