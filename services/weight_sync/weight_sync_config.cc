// Flag and YAML parsing for fp8rl-weight-sync (see weight_sync_config.h).
#include "services/weight_sync/weight_sync_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace fp8rl::weight_sync {
namespace {

constexpr char kCoordinatorFlag[] = "--coordinator";

// Takes every --coordinator with an empty value out of `args` (the common option parser rejects
// empty strings); true when the last --coordinator given is empty, i.e. registration is off.
bool strip_empty_coordinator(std::vector<std::string>* args) {
  std::vector<std::string> kept;
  bool disabled = false;
  const std::string with_equals = absl::StrCat(kCoordinatorFlag, "=");
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a == with_equals) {
      disabled = true;
      continue;
    }
    if (a == kCoordinatorFlag && i + 1 < args->size()) {
      if ((*args)[i + 1].empty()) {
        disabled = true;
        ++i;
        continue;
      }
      disabled = false;
      kept.push_back(a);
      kept.push_back((*args)[++i]);
      continue;
    }
    if (a.starts_with(with_equals)) disabled = false;
    kept.push_back(a);
  }
  *args = std::move(kept);
  return disabled;
}

// --deltas: "on" (the measured choice per worker), "always" (a delta whenever one is possible)
// or "off" (YAML's true / false spelled as strings are accepted too).
absl::StatusOr<std::pair<bool, WeightSyncOptions::DeltaChoice>> parse_deltas(
    const service::ServiceOptions& options) {
  using Choice = WeightSyncOptions::DeltaChoice;
  const std::string text = service::extra_string(options, "deltas");
  if (text == "on" || text == "true") return std::make_pair(true, Choice::kMeasured);
  if (text == "always") return std::make_pair(true, Choice::kAlways);
  if (text == "off" || text == "false") return std::make_pair(false, Choice::kMeasured);
  return absl::InvalidArgumentError(
      absl::StrCat("--deltas: must be on, always or off, got '", text, "'"));
}

// --delta-max-fraction: a number in (0, 1].
absl::StatusOr<double> parse_delta_max_fraction(const service::ServiceOptions& options) {
  const std::string text = service::extra_string(options, "delta_max_fraction");
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--delta-max-fraction: expected a number, got '", text, "'"));
  }
  if (!(value > 0.0 && value <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--delta-max-fraction: must be in (0, 1], got ", text));
  }
  return value;
}

}  // namespace

service::ServiceOptions default_weight_sync_service_options() {
  service::ServiceOptions o;
  o.name = "weight-sync";
  o.grpc_port = kDefaultGrpcPort;
  o.http_port = kDefaultMetricsPort;
  o.shutdown_grace_seconds = 5.0;
  o.extra = {
      {"metrics_port", absl::StrCat(kDefaultMetricsPort)},
      {"keep_versions", "2"},
      {"chunk_bytes", absl::StrCat(kDefaultChunkBytes)},
      {"max_version_bytes", absl::StrCat(kDefaultMaxVersionBytes)},
      {"deltas", "on"},
      {"delta_max_fraction", absl::StrCat(WeightSyncOptions{}.delta_max_fraction)},
      {"delta_zstd_level", absl::StrCat(kDefaultDeltaZstdLevel)},
      {"cut_through", "on"},
      {"fanout", "direct"},
  };
  return o;
}

absl::StatusOr<WeightSyncConfig> parse_weight_sync_config(const std::vector<std::string>& args) {
  const service::ServiceOptions defaults = default_weight_sync_service_options();
  std::vector<std::string> flags = args;
  const bool no_coordinator = strip_empty_coordinator(&flags);
  absl::StatusOr<service::ServiceOptions> parsed = service::parse_service_options(defaults, flags);
  if (!parsed.ok()) return parsed.status();
  WeightSyncConfig config;
  config.service = *parsed;
  if (no_coordinator) config.service.coordinator.clear();

  absl::StatusOr<int> metrics_port =
      service::resolve_metrics_port(&config.service, kDefaultMetricsPort);
  if (!metrics_port.ok()) return metrics_port.status();
  config.metrics_port = *metrics_port;

  absl::StatusOr<int64_t> keep =
      service::extra_int_in_range(config.service, "keep_versions", 1, 64);
  if (!keep.ok()) return keep.status();
  absl::StatusOr<int64_t> chunk = service::extra_int_in_range(config.service, "chunk_bytes", 1,
                                                              static_cast<int64_t>(kMaxChunkBytes));
  if (!chunk.ok()) return chunk.status();
  absl::StatusOr<int64_t> max_bytes =
      service::extra_int_in_range(config.service, "max_version_bytes", 1, int64_t{1} << 40);
  if (!max_bytes.ok()) return max_bytes.status();
  absl::StatusOr<std::pair<bool, WeightSyncOptions::DeltaChoice>> deltas =
      parse_deltas(config.service);
  if (!deltas.ok()) return deltas.status();
  absl::StatusOr<double> fraction = parse_delta_max_fraction(config.service);
  if (!fraction.ok()) return fraction.status();
  absl::StatusOr<int64_t> zstd_level = service::extra_int_in_range(
      config.service, "delta_zstd_level", kMinDeltaZstdLevel, kMaxDeltaZstdLevel);
  if (!zstd_level.ok()) return zstd_level.status();
  config.sync.keep_versions = static_cast<int>(*keep);
  config.sync.chunk_bytes = static_cast<uint64_t>(*chunk);
  config.sync.max_version_bytes = static_cast<uint64_t>(*max_bytes);
  config.sync.deltas = deltas->first;
  config.sync.delta_choice = deltas->second;
  config.sync.delta_max_fraction = *fraction;
  config.sync.delta_zstd_level = static_cast<int>(*zstd_level);
  // --cut-through on|off: push a full version while its upload still arrives.
  const std::string cut_through = service::extra_string(config.service, "cut_through");
  if (cut_through != "on" && cut_through != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cut-through: must be on or off, got '", cut_through, "'"));
  }
  config.sync.cut_through = cut_through == "on";
  // --fanout direct|chain|tree:K: how a version reaches N workers (fanout.h).
  absl::StatusOr<Fanout> fanout = parse_fanout(service::extra_string(config.service, "fanout"));
  if (!fanout.ok()) return fanout.status();
  config.sync.fanout = *fanout;
  FP8RL_RETURN_IF_ERROR(validate_options(config.sync));
  return config;
}

}  // namespace fp8rl::weight_sync
