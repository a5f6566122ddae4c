// The coordinator's Prometheus metrics (docs/metrics.md): jobs by state, the running job's step,
// reward and validation accuracy, time per phase, live workers, dispatch re-tries.
#pragma once

#include "absl/status/statusor.h"
#include "common/service/metrics.h"

namespace fp8rl::coordinator {

class CoordinatorMetrics {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> create(
      service::MetricsRegistry* registry);

  service::GaugeFamily* jobs = nullptr;                 // {state}
  service::GaugeFamily* job_step = nullptr;             // running job's completed steps
  service::GaugeFamily* reward_mean = nullptr;          // last step's mean reward
  service::GaugeFamily* validation_accuracy = nullptr;  // last validation accuracy
  service::GaugeFamily* live_workers = nullptr;         // {kind}
  service::GaugeFamily* weight_version = nullptr;       // last published policy version
  service::CounterFamily* steps = nullptr;              // RL steps completed
  service::CounterFamily* samples = nullptr;            // samples generated and scored
  service::CounterFamily* redispatched = nullptr;       // samples re-dispatched after a failure
  service::HistogramFamily* phase_seconds = nullptr;    // {phase}
};

}  // namespace fp8rl::coordinator
