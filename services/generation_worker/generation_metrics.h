// The generation worker's Prometheus metrics: exactly the names docs/metrics.md lists for
// `service="generation-worker"`, plus the fp8rl_build_info / fp8rl_process_start_time_seconds
// pair every service exports. One struct so the scheduler and the gRPC handler share them; the
// weight-path series are fed from running totals by a WeightPathRecorder.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

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
  // Weight versions (docs/design/weight-sync.md "Installing a weight version in place", "Delta
  // versions").
  service::CounterFamily* weight_installs = nullptr;              // {mode: in_place|rebuilt}
  service::CounterFamily* weight_delta_versions = nullptr;        // versions rebuilt from a delta
  service::CounterFamily* weight_delta_fallbacks = nullptr;       // deltas refused: full refetched
  service::CounterFamily* weight_delta_received_bytes = nullptr;  // delta payload bytes
  service::HistogramFamily* weight_delta_decode_seconds = nullptr;  // one delta's apply time
  service::HistogramFamily* weight_install_seconds = nullptr;   // a verified version -> its model
  service::GaugeFamily* weight_receive_buffer_bytes = nullptr;  // both receive buffers, mapped
  // Subscribe streams to weight sync opened again (broken, stalled or ended; docs/design/faults.md
  // "Network delay, loss and partitions"), recorded with the next weight version's install.
  service::CounterFamily* weight_stream_reconnects = nullptr;
};

// Running totals of a worker's weight path, as the double buffer (WeightDoubleBuffer::Stats) and
// the weight-sync subscriber (WeightSubscriber::Stats) count them.
struct WeightPathCounts {
  int64_t installs = 0;             // versions written into a model
  int64_t in_place_installs = 0;    // of them, into the idle slot's existing model
  int64_t delta_versions = 0;       // versions rebuilt from a delta
  int64_t delta_fallbacks = 0;      // deltas that could not be applied
  uint64_t delta_bytes = 0;         // delta payload bytes received
  double last_delta_seconds = 0.0;  // decode time of the newest delta
  int64_t receive_buffer_bytes = 0;
  int64_t stream_reconnects = 0;  // Subscribe streams opened after the first
};

// Turns successive WeightPathCounts into the weight metrics above: counters grow by what the
// totals grew since the previous record(); each new delta version observes the newest delta's
// decode time once. Totals that shrink (a restarted subscriber) are taken as the new baseline, so
// callers must record snapshots in the order they were taken.
class WeightPathRecorder {
 public:
  explicit WeightPathRecorder(GenerationMetrics* metrics) : metrics_(metrics) {}
  void record(const WeightPathCounts& now);

 private:
  GenerationMetrics* const metrics_;
  std::mutex mu_;
  WeightPathCounts last_;  // Guarded by mu_.
};

}  // namespace fp8rl::generation
