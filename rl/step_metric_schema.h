// The one definition of the trainer's per-step statistics (the GRPO loss parts and the mismatch
// metrics of rl/mismatch.h): each entry gives the metrics-row key, which is also the key in
// TrainStepResponse.metrics and the suffix of the Prometheus series, and says where the metric is
// shown. The trainer's and the coordinator's Prometheus families, the coordinator's rows, the
// console's chart list, `fp8rl run`'s summary and docs/metrics.md all derive from kStepMetrics.
// A C++ table rather than proto options: every consumer is C++ and reads it at compile time,
// with no descriptor walk, and the Python and Markdown consumers are checked against it by tests.
//
// Adding a metric: an entry here, its computation (put it in the step's MetricsValues under the
// entry's name, e.g. rl/mismatch.cc append_values()), and one test. docs/contributing.md.
#pragma once

#include <array>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "rl/step_metrics.h"

namespace fp8rl::rl {

// How `fp8rl run`'s end-of-job summary folds a metric over the RL steps.
enum class StepSummary { kNone, kMean, kMin, kMax };

struct StepMetricDef {
  std::string_view name;     // row key; TrainStepResponse.metrics key; Prometheus name suffix
  std::string_view meaning;  // one line for docs/metrics.md
  // Help of the trainer gauge fp8rl_trainer_<name>; empty: no such gauge.
  std::string_view trainer_help = {};
  // Re-exported by the coordinator as the gauge fp8rl_rl_<name>.
  bool coordinator_gauge = false;
  StepSummary summary = StepSummary::kNone;
  // Console chart (an id of kStepCharts) and the series label; empty chart: not charted.
  std::string_view chart = {};
  std::string_view chart_label = {};
};

struct StepChartDef {
  std::string_view id;
  std::string_view title;
};

// The console's charts of trainer statistics, in display order (after the reward and validation
// charts, before the phase times: services/coordinator/console/charts.json).
inline constexpr std::array<StepChartDef, 5> kStepCharts = {{
    {"token_mult_prob_error", "Mismatch: token_mult_prob_error"},
    {"gen_kl_error", "Mismatch: gen_kl_error"},
    {"is_weights", "Importance weights (learner/sampler probability ratio)"},
    {"clipped", "Fraction clipped / masked"},
    {"loss", "Loss parts"},
}};

// Order matters only for display: Prometheus families are registered, chart series listed and
// summary lines printed in this order.
inline constexpr std::array<StepMetricDef, 13> kStepMetrics = {{
    {.name = "loss",
     .meaning = "mean total loss over the step's updates (policy + kl_beta * kl)",
     .chart = "loss",
     .chart_label = "loss"},
    {.name = "pg_loss",
     .meaning = "policy-gradient part of the loss",
     .chart = "loss",
     .chart_label = "policy-gradient loss"},
    {.name = "kl",
     .meaning = "mean k3 estimate of KL(cur || ref) over valid tokens (before kl_beta)",
     .chart = "loss",
     .chart_label = "KL"},
    {.name = "grad_norm", .meaning = "global gradient norm before clipping, mean over updates"},
    {.name = "learning_rate", .meaning = "learning rate of the step"},
    {.name = "train_tokens", .meaning = "response tokens trained on"},
    {.name = "token_mult_prob_error",
     .meaning = "mean(exp(|gen - prev|)) over valid tokens; 1 = identical",
     .trainer_help = "Last step's mean(exp(|gen - prev|)).",
     .coordinator_gauge = true,
     .summary = StepSummary::kMean,
     .chart = "token_mult_prob_error",
     .chart_label = "token_mult_prob_error"},
    {.name = "gen_kl_error",
     .meaning = "k3 estimate of KL(gen || train) per token",
     .trainer_help = "Last step's KL(gen || train) per token.",
     .coordinator_gauge = true,
     .summary = StepSummary::kMean,
     .chart = "gen_kl_error",
     .chart_label = "gen_kl_error"},
    {.name = "sampling_importance_ratio",
     .meaning = "mean IS weight after truncation (raw weight for rule none)",
     .trainer_help = "Last step's mean IS weight after truncation.",
     .coordinator_gauge = true,
     .summary = StepSummary::kMean,
     .chart = "is_weights",
     .chart_label = "mean IS weight"},
    {.name = "is_oob_ratio",
     .meaning = "fraction of tokens (sequences for seq_mask_tis) outside the IS bounds",
     .trainer_help =
         "Last step's fraction of tokens (sequences for seq_mask_tis) outside the IS bounds.",
     .coordinator_gauge = true,
     .summary = StepSummary::kMean,
     .chart = "clipped",
     .chart_label = "IS weights out of bounds"},
    {.name = "clip_fraction",
     .meaning = "fraction of valid tokens where the PPO clip is active",
     .chart = "clipped",
     .chart_label = "PPO clip fraction"},
    {.name = "probs_ratio_min",
     .meaning = "min of the PPO ratio exp(cur - prev) over the step's updates",
     .trainer_help = "Last step's min of the PPO ratio exp(cur - prev).",
     .coordinator_gauge = true,
     .summary = StepSummary::kMin,
     .chart = "is_weights",
     .chart_label = "min ratio"},
    {.name = "probs_ratio_max",
     .meaning = "max of the PPO ratio exp(cur - prev) over the step's updates",
     .trainer_help = "Last step's max of the PPO ratio exp(cur - prev).",
     .coordinator_gauge = true,
     .summary = StepSummary::kMax,
     .chart = "is_weights",
     .chart_label = "max ratio"},
}};

// The schema the services use; tests pass a longer one to show a new entry reaches every consumer.
using StepMetricSchema = std::span<const StepMetricDef>;

// OK when `values` has a value for every entry of `schema` (extra keys are allowed: the trainer
// adds its phase times); otherwise Internal naming the first missing metric.
absl::Status check_step_metric_values(const MetricsValues& values,
                                      StepMetricSchema schema = kStepMetrics);

}  // namespace fp8rl::rl
