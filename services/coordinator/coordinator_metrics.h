// The coordinator's Prometheus metrics, exactly the coordinator section of docs/metrics.md: jobs
// by state, rejected and refused API requests, live workers, and the RL loop's step, reward,
// validation accuracy, the step metrics the schema marks (from the trainer's TrainStep answer) and
// time per phase.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/service/metrics.h"
#include "rl/step_metric_schema.h"
#include "rl/step_metrics.h"

namespace fp8rl::coordinator {

// The phases of the RL loop, as the `phase` label and the `time_<phase>_seconds` keys of a
// metrics row: sft (warm start, before step 1), then per step generate, score, train, publish,
// sync, and at their cadence validate and checkpoint.
inline constexpr std::array<std::string_view, 8> kRlPhases = {
    "sft", "validate", "generate", "score", "train", "publish", "sync", "checkpoint"};

class CoordinatorMetrics {
 public:
  // `schema` is the step metrics' definition; tests pass a longer one.
  static absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> create(
      service::MetricsRegistry* registry, rl::StepMetricSchema schema = rl::kStepMetrics);

  // Phase times of one metrics row (keys `time_<phase>_seconds`, phases of kRlPhases): the
  // last-step gauge of every phase is set (0 for a phase the row lacks), the totals and the
  // histogram grow by the phases the row has.
  void record_phases(const std::map<std::string, double>& row);
  // The fp8rl_rl_<name> gauges of the step metrics (rl/step_metric_schema.h, coordinator_gauge)
  // from a train step's statistics; names the trainer did not send leave their gauge unchanged.
  void record_step_metrics(const std::map<std::string, double>& values);
  // Asynchronous RL (docs/design/rl-step.md "Asynchronous RL"): one step's staleness histogram,
  // stale samples regenerated, trainer and generation idle time.
  void record_staleness(const rl::StepMetrics::Async& step);
  // One request rejected as invalid; api is "rest" or "grpc".
  void count_rejected(std::string_view api);

  service::GaugeFamily* jobs = nullptr;              // {state}
  service::CounterFamily* jobs_submitted = nullptr;  // jobs accepted
  service::CounterFamily* job_resumes =
      nullptr;  // jobs resumed (coordinator restart, lost trainer)
  service::CounterFamily* requests_rejected = nullptr;        // {api}
  service::CounterFamily* requests_refused = nullptr;         // {reason}, admission.h
  service::CounterFamily* checkpoint_fallbacks = nullptr;     // unreadable checkpoint, previous one
  service::CounterFamily* store_write_failures = nullptr;     // {write}, store_retry.h
  service::CounterFamily* trainer_groups_reformed = nullptr;  // groups formed again on resume
  service::GaugeFamily* live_workers = nullptr;               // {kind}
  service::CounterFamily* workers_expired = nullptr;          // {kind}, no heartbeat in time
  service::CounterFamily* sync_lagging_workers = nullptr;     // live, new version late
  service::GaugeFamily* step = nullptr;                       // running job's completed steps
  service::CounterFamily* steps = nullptr;                    // RL steps completed
  service::GaugeFamily* reward_mean = nullptr;                // last step's mean reward
  service::GaugeFamily* validation_accuracy = nullptr;        // last validation accuracy
  service::GaugeFamily* step_phase_seconds = nullptr;         // {phase}, last step
  service::CounterFamily* phase_seconds_total = nullptr;      // {phase}
  service::HistogramFamily* phase_seconds = nullptr;          // {phase}, distribution
  service::CounterFamily* samples = nullptr;                  // samples generated and scored
  service::CounterFamily* redispatched_requests = nullptr;    // failed generation calls re-sent
  service::CounterFamily* redispatched_samples = nullptr;     // samples those calls carried
  service::GaugeFamily* weight_version = nullptr;             // last published policy version
  std::map<std::string, service::GaugeFamily*, std::less<>> step_metrics;  // by metric name
  // Asynchronous RL only (stay at 0 in synchronous jobs).
  service::HistogramFamily* sample_staleness = nullptr;         // versions behind, per sample
  service::CounterFamily* stale_regenerated_samples = nullptr;  // older than K, generated again
  service::CounterFamily* trainer_idle_seconds = nullptr;       // loop waited for a rollout
  service::CounterFamily* generation_idle_seconds = nullptr;    // producer waited for a version
};

}  // namespace fp8rl::coordinator
