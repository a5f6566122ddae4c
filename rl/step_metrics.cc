// The stored form of the metrics rows (see step_metrics.h); every row key is spelled here.
#include "rl/step_metrics.h"

#include <string>

namespace fp8rl::rl {

MetricsValues to_row(const StartMetrics& m) {
  MetricsValues row;
  if (m.sft) {
    row["sft_loss"] = m.sft->loss;
    row["time_sft_seconds"] = m.sft->seconds;
  }
  row["val_accuracy"] = m.val_accuracy;
  row["time_validate_seconds"] = m.validate_seconds;
  row["weight_version"] = static_cast<double>(m.weight_version);
  return row;
}

MetricsValues to_row(const StepMetrics& m) {
  MetricsValues row = m.trainer;
  row["time_generate_seconds"] = m.generate_seconds;
  row["redispatched_samples"] = static_cast<double>(m.redispatched_samples);
  row["reward_mean"] = m.reward_mean;
  row["reward_std"] = m.reward_std;
  row["train_accuracy"] = m.train_accuracy;
  row["response_length_mean"] = m.response_length_mean;
  row["time_score_seconds"] = m.score_seconds;
  row["time_train_seconds"] = m.train_seconds;
  row["weight_version"] = static_cast<double>(m.weight_version);
  row["time_publish_seconds"] = m.publish_seconds;
  row["time_sync_seconds"] = m.sync_seconds;
  if (m.validation) {
    row["val_accuracy"] = m.validation->accuracy;
    row["time_validate_seconds"] = m.validation->seconds;
  }
  if (m.checkpoint_seconds) row["time_checkpoint_seconds"] = *m.checkpoint_seconds;
  row["time_step_seconds"] = m.step_seconds;
  if (m.async) {
    row["max_staleness"] = static_cast<double>(m.async->max_staleness);
    for (int64_t k = 0; k <= m.async->max_staleness; ++k) {
      auto it = m.async->staleness_histogram.find(k);
      const int64_t n = it == m.async->staleness_histogram.end() ? 0 : it->second;
      row["samples_staleness_" + std::to_string(k)] = static_cast<double>(n);
    }
    row["staleness_max"] = static_cast<double>(m.async->staleness_max);
    row["staleness_mean"] = m.async->staleness_mean;
    row["stale_regenerated_samples"] = static_cast<double>(m.async->regenerated_samples);
    row["trainer_idle_seconds"] = m.async->trainer_idle_seconds;
    row["generation_idle_seconds"] = m.async->generation_idle_seconds;
  }
  return row;
}

}  // namespace fp8rl::rl
