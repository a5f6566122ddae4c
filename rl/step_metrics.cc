// The stored form of the metrics rows (see step_metrics.h); every row key is spelled here.
#include "rl/step_metrics.h"

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
  return row;
}

}  // namespace fp8rl::rl
