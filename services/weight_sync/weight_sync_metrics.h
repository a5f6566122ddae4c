// The weight-sync service's Prometheus metrics, exactly the names docs/metrics.md lists for
// `service="weight-sync"` plus the fp8rl_build_info / fp8rl_process_start_time_seconds pair every
// service exports.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/service/metrics.h"

namespace fp8rl::weight_sync {

struct WeightSyncMetrics {
  // Registers every family in `registry` (which must outlive the result), named
  // `<prefix>_latest_version` etc.; the weight-sync service's fp8rl_build_info /
  // fp8rl_process_start_time_seconds pair too unless `process_metrics` is false (a generation
  // worker's relay registers its families as fp8rl_worker_relay_* on the worker's registry, which
  // has the worker's pair).
  static absl::StatusOr<std::unique_ptr<WeightSyncMetrics>> create(
      service::MetricsRegistry* registry, const std::string& prefix = "fp8rl_weight_sync",
      bool process_metrics = true);

  service::GaugeFamily* latest_version = nullptr;    // newest complete version
  service::CounterFamily* uploads = nullptr;         // {result: accepted|rejected}
  service::CounterFamily* received_bytes = nullptr;  // payload bytes received
  service::CounterFamily* sent_bytes = nullptr;      // payload bytes streamed to workers
  service::GaugeFamily* subscribers = nullptr;       // workers with an open stream
  service::GaugeFamily* worker_version = nullptr;    // {worker}: acknowledged version
  service::HistogramFamily* push_seconds = nullptr;  // arrival -> last worker's ack
  service::GaugeFamily* version_bytes = nullptr;     // {format: fp8|bf16}: latest's size
  // Delta versions (services/weight_sync/delta.h).
  service::CounterFamily* pushes = nullptr;                 // {kind: full|delta}: versions pushed
  service::CounterFamily* pushed_bytes = nullptr;           // {kind}: payload bytes of those pushes
  service::GaugeFamily* version_wire_bytes = nullptr;       // {kind}: latest version's wire size
  service::GaugeFamily* delta_compression_ratio = nullptr;  // full / delta bytes, latest
  service::HistogramFamily* delta_encode_seconds = nullptr;  // one encode per (base, target)
  // The per-worker choice of full or delta (push_choice.h).
  service::GaugeFamily* push_cost_seconds = nullptr;  // {kind}: last measured push -> ack
  service::CounterFamily* push_probes = nullptr;      // {kind}: pushes sent to measure a kind
};

}  // namespace fp8rl::weight_sync
