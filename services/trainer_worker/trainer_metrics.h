// The trainer worker's Prometheus metrics: exactly the names docs/metrics.md lists for
// `service="trainer"`, plus the fp8rl_build_info / fp8rl_process_start_time_seconds pair every
// service exports. The Trainer writes them after each update and publish.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/service/metrics.h"
#include "rl/step_metric_schema.h"

namespace fp8rl::trainer {

struct TrainerMetrics {
  // Registers every family in `registry` (which must outlive the result).
  // `schema` is the step metrics' definition; tests pass a longer one.
  static absl::StatusOr<std::unique_ptr<TrainerMetrics>> create(
      service::MetricsRegistry* registry, rl::StepMetricSchema schema = rl::kStepMetrics);

  // Sets the step-metric gauges from a GRPO step's values; names without a gauge are ignored.
  void record_step(const rl::MetricsValues& values);

  service::CounterFamily* steps = nullptr;         // {kind: grpo|sft} optimizer steps
  service::CounterFamily* tokens = nullptr;        // training tokens processed
  service::GaugeFamily* loss = nullptr;            // last step's loss
  service::GaugeFamily* grad_norm = nullptr;       // last step's grad norm (before clipping)
  service::GaugeFamily* learning_rate = nullptr;   // current learning rate
  service::GaugeFamily* policy_version = nullptr;  // last published version
  service::GaugeFamily* phase_seconds = nullptr;   // {phase}: time of each phase, last step
  service::GaugeFamily* is_weight = nullptr;       // {stat: mean|min|max} before truncation
  // fp8rl_trainer_<name> for each step metric with a trainer help (rl/step_metric_schema.h).
  std::map<std::string, service::GaugeFamily*, std::less<>> step_metrics;
  service::GaugeFamily* recalibration_seconds = nullptr;  // quantize + calibrate, last publish
  service::GaugeFamily* weight_scale_inv = nullptr;       // {stat: min|mean|max}
  service::GaugeFamily* kv_scale = nullptr;               // {tensor: k|v, stat: min|mean|max}
  // Data-parallel group (docs/design/training.md "Trainer groups"): size and this trainer's rank,
  // time in the last step's all-reduces, payload bytes all-reduced.
  service::GaugeFamily* group_size = nullptr;
  service::GaugeFamily* group_rank = nullptr;
  service::GaugeFamily* all_reduce_seconds = nullptr;
  service::CounterFamily* all_reduce_bytes = nullptr;
  // The part of the gradient all-reduce the backward did not hide (all of it without buckets).
  service::GaugeFamily* all_reduce_wait_seconds = nullptr;
};

}  // namespace fp8rl::trainer
