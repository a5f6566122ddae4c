// Flag and YAML parsing for fp8rl-weight-sync (see weight_sync_config.h).
#include "services/weight_sync/weight_sync_config.h"

#include <string>

#include "common/flags.h"
#include "common/status_macros.h"

namespace fp8rl::weight_sync {
namespace {

// --deltas: the two settings it stands for (deltas on/off and which choice).
enum class DeltasFlag { kOn, kAlways, kOff };

// The flag table of fp8rl-weight-sync bound to `config` (whose values are the defaults).
void add_flags(flags::FlagTable& table, WeightSyncConfig* config, DeltasFlag* deltas,
               std::string* fanout) {
  WeightSyncOptions& sync = config->sync;
  service::add_service_flags(table, &config->service);
  // Registration is optional here: `--coordinator ""` serves without registering.
  table.allow_empty("coordinator")
      .add_int("keep-versions", &sync.keep_versions, 1, 64, "weight versions kept in memory")
      .add_uint("chunk-bytes", &sync.chunk_bytes, 1, kMaxChunkBytes,
                "bytes per streamed chunk of a version")
      .add_uint("max-version-bytes", &sync.max_version_bytes, 1, uint64_t{1} << 40,
                "largest version accepted")
      .add_enum(
          "deltas", deltas,
          {{"on", DeltasFlag::kOn}, {"always", DeltasFlag::kAlways}, {"off", DeltasFlag::kOff}},
          "FP8 deltas: on (full or delta per worker by measured cost), always, off",
          {{"true", DeltasFlag::kOn}, {"false", DeltasFlag::kOff}})
      .add_double("delta-max-fraction", &sync.delta_max_fraction, 0.0, 1.0,
                  "a delta is sent only when at most this fraction of the full version",
                  /*lo_open=*/true)
      .add_int("delta-zstd-level", &sync.delta_zstd_level, kMinDeltaZstdLevel, kMaxDeltaZstdLevel,
               "zstd level of delta payloads")
      .add_bool("cut-through", &sync.cut_through,
                "push a full version while its upload still arrives")
      .add_duration("upload-part-timeout-ms", &sync.part_timeout,
                    flags::DurationUnit::kMilliseconds, 1, int64_t{3600} * 1000,
                    "a version uploaded in parts fails when a part has not begun this long after "
                    "the first")
      .add_string("fanout", fanout,
                  "direct | chain | tree:K (K in [1, 64]): how a version reaches N workers")
      .add_enum("same-host", &sync.same_host,
                {{"off", SameHostMode::kOff}, {"auto", SameHostMode::kAuto}},
                "auto: a worker on this host reads each version from a file in --same-host-dir "
                "instead of over TCP")
      .add_string("same-host-dir", &sync.same_host_dir,
                  "shared tmpfs directory of the same-host files");
}

WeightSyncConfig defaults() {
  WeightSyncConfig config;
  config.service = default_weight_sync_service_options();
  return config;
}

}  // namespace

service::ServiceOptions default_weight_sync_service_options() {
  service::ServiceOptions o;
  o.name = "weight-sync";
  o.grpc_port = kDefaultGrpcPort;
  o.http_port = kDefaultMetricsPort;
  o.shutdown_grace_seconds = 5.0;
  return o;
}

std::string weight_sync_usage() {
  WeightSyncConfig config = defaults();
  DeltasFlag deltas = DeltasFlag::kOn;
  std::string fanout = fanout_name(config.sync.fanout);
  flags::FlagTable table("fp8rl-weight-sync");
  add_flags(table, &config, &deltas, &fanout);
  return table.usage() +
         "Registers with --coordinator as WEIGHT_SYNC at --advertise-host:<grpc port>;\n"
         "--coordinator \"\" serves without registering.\n";
}

absl::StatusOr<WeightSyncConfig> parse_weight_sync_config(const std::vector<std::string>& args) {
  WeightSyncConfig config = defaults();
  DeltasFlag deltas = !config.sync.deltas ? DeltasFlag::kOff
                      : config.sync.delta_choice == WeightSyncOptions::DeltaChoice::kAlways
                          ? DeltasFlag::kAlways
                          : DeltasFlag::kOn;
  std::string fanout = fanout_name(config.sync.fanout);
  flags::FlagTable table("fp8rl-weight-sync");
  add_flags(table, &config, &deltas, &fanout);
  absl::StatusOr<flags::ParseResult> parsed = table.parse(args);
  if (!parsed.ok()) return parsed.status();
  config.warnings = parsed->warnings;
  config.metrics_port = config.service.http_port;
  config.sync.deltas = deltas != DeltasFlag::kOff;
  config.sync.delta_choice = deltas == DeltasFlag::kAlways
                                 ? WeightSyncOptions::DeltaChoice::kAlways
                                 : WeightSyncOptions::DeltaChoice::kMeasured;
  // --fanout direct|chain|tree:K: how a version reaches N workers (fanout.h).
  absl::StatusOr<Fanout> parsed_fanout = parse_fanout(fanout);
  if (!parsed_fanout.ok()) return parsed_fanout.status();
  config.sync.fanout = *parsed_fanout;
  FP8RL_RETURN_IF_ERROR(validate_options(config.sync));
  return config;
}

}  // namespace fp8rl::weight_sync
