// The generation worker's Prometheus metrics: exactly the names docs/metrics.md lists for
// `service="generation-worker"`, plus the fp8rl_build_info / fp8rl_process_start_time_seconds
// pair every service exports. One struct so the scheduler and the gRPC handler share them.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/service/metrics.h"

namespace fp8rl::generation {

struct GenerationMetrics {
  // Registers every family in `registry` (which must outlive the result).
  static absl::StatusOr<std::unique_ptr<GenerationMetrics>> create(
      service::MetricsRegistry* registry);

  service::CounterFamily* tokens = nullptr;             // {kind: prompt|generated}
  service::CounterFamily* requests = nullptr;           // {status: ok|error}
  service::GaugeFamily* queue_depth = nullptr;          // sequences waiting to join a batch
  service::GaugeFamily* batch_size = nullptr;           // sequences in the current decode batch
  service::GaugeFamily* kv_cache_usage = nullptr;       // reserved / budgeted KV slots (0..1)
  service::GaugeFamily* kv_cache_bytes = nullptr;       // bytes held by the KV cache
  service::GaugeFamily* weight_version = nullptr;       // weight version in use
  service::CounterFamily* weight_swaps = nullptr;       // versions swapped in
  service::HistogramFamily* request_seconds = nullptr;  // request arrival -> last token
};

}  // namespace fp8rl::generation
