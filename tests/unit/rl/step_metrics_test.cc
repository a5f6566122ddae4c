// Tests of rl/step_metrics.h: the exact keys and values of row 0 and of an RL step's row (the
// stored and served form users read), with and without the optional parts.
#include "rl/step_metrics.h"

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

TEST(StepMetrics, StartRowKeys) {
  StartMetrics m;
  m.val_accuracy = 0.375;
  m.validate_seconds = 1.5;
  m.weight_version = 3;
  EXPECT_EQ(to_row(m),
            (MetricsValues{
                {"val_accuracy", 0.375}, {"time_validate_seconds", 1.5}, {"weight_version", 3.0}}));
  m.sft = StartMetrics::Sft{0.71, 12.25};
  EXPECT_EQ(to_row(m), (MetricsValues{{"sft_loss", 0.71},
                                      {"time_sft_seconds", 12.25},
                                      {"val_accuracy", 0.375},
                                      {"time_validate_seconds", 1.5},
                                      {"weight_version", 3.0}}));
}

TEST(StepMetrics, StepRowKeys) {
  StepMetrics m;
  m.generate_seconds = 2.5;
  m.redispatched_samples = 7;
  m.reward_mean = 0.4;
  m.reward_std = 0.3;
  m.train_accuracy = 0.35;
  m.response_length_mean = 4.25;
  m.score_seconds = 0.125;
  m.trainer = {{"loss", 0.9}, {"gen_kl_error", 2e-4}, {"reward_mean", -1.0}};
  m.train_seconds = 3.5;
  m.weight_version = 6;
  m.publish_seconds = 0.75;
  m.sync_seconds = 0.0625;
  m.step_seconds = 7.5;
  const MetricsValues plain = {{"time_generate_seconds", 2.5},
                               {"redispatched_samples", 7.0},
                               {"reward_mean", 0.4},  // the loop's value wins over the trainer's
                               {"reward_std", 0.3},
                               {"train_accuracy", 0.35},
                               {"response_length_mean", 4.25},
                               {"time_score_seconds", 0.125},
                               {"loss", 0.9},
                               {"gen_kl_error", 2e-4},
                               {"time_train_seconds", 3.5},
                               {"weight_version", 6.0},
                               {"time_publish_seconds", 0.75},
                               {"time_sync_seconds", 0.0625},
                               {"time_step_seconds", 7.5}};
  EXPECT_EQ(to_row(m), plain);
  m.validation = StepMetrics::Validation{0.5, 1.25};
  m.checkpoint_seconds = 0.375;
  MetricsValues full = plain;
  full["val_accuracy"] = 0.5;
  full["time_validate_seconds"] = 1.25;
  full["time_checkpoint_seconds"] = 0.375;
  EXPECT_EQ(to_row(m), full);
  // Asynchronous RL adds its keys; every bucket 0..K is present, empty ones as 0.
  StepMetrics::Async a;
  a.max_staleness = 2;
  a.staleness_histogram = {{0, 3}, {2, 5}};
  a.staleness_max = 2;
  a.staleness_mean = 1.25;
  a.regenerated_samples = 4;
  a.trainer_idle_seconds = 0.5;
  a.generation_idle_seconds = 1.5;
  m.async = a;
  MetricsValues async = full;
  async["max_staleness"] = 2.0;
  async["samples_staleness_0"] = 3.0;
  async["samples_staleness_1"] = 0.0;
  async["samples_staleness_2"] = 5.0;
  async["staleness_max"] = 2.0;
  async["staleness_mean"] = 1.25;
  async["stale_regenerated_samples"] = 4.0;
  async["trainer_idle_seconds"] = 0.5;
  async["generation_idle_seconds"] = 1.5;
  EXPECT_EQ(to_row(m), async);
}

}  // namespace
}  // namespace fp8rl::rl
