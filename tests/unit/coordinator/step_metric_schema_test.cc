// The step-metric schema (rl/step_metric_schema.h) is the one definition: a metric added only to
// the table reaches the trainer's answer, the coordinator's row, both /metrics texts and the
// console's chart list; peers that predate TrainStepResponse.metrics still interoperate; the
// service's schema is the one docs/metrics.md lists and the pre-schema chart list.
#include "rl/step_metric_schema.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/service/metrics.h"
#include "nlohmann/json.hpp"
#include "proto/step_metrics_proto.h"
#include "services/coordinator/console/chart_list.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/trainer_worker/trainer_metrics.h"

namespace fp8rl {
namespace {

// Random non-zero values (integers for train_tokens, whose fixed field is int64) for `schema`.
rl::MetricsValues random_values(rl::StepMetricSchema schema, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.25, 4.0);
  rl::MetricsValues values;
  for (const rl::StepMetricDef& m : schema) {
    values[std::string(m.name)] = m.name == "train_tokens" ? std::floor(100 * u(rng)) : u(rng);
  }
  return values;
}

// The Prometheus sample line of an unlabelled gauge, as prometheus-cpp prints it.
std::string sample_line(const std::string& family, double value) {
  std::ostringstream out;
  out.precision(17);
  out << family << " " << value;
  return out.str();
}

TEST(StepMetricSchema, MetricAddedOnlyToTheTableReachesRowMetricsAndConsole) {
  std::vector<rl::StepMetricDef> schema(rl::kStepMetrics.begin(), rl::kStepMetrics.end());
  schema.push_back({.name = "test_only_drift",
                    .meaning = "a metric that exists only in this test",
                    .trainer_help = "Test-only drift of the last step.",
                    .coordinator_gauge = true,
                    .summary = rl::StepSummary::kMean,
                    .chart = "loss",
                    .chart_label = "test-only drift"});
  // The computation: the trainer puts every metric in its values by name.
  const rl::MetricsValues values = random_values(schema, 7);
  ASSERT_TRUE(rl::check_step_metric_values(values, schema).ok());
  const double drift = values.at("test_only_drift");

  // Trainer: the answer and its /metrics.
  v1::TrainStepResponse response;
  step_metrics_to_proto(values, &response);
  service::MetricsRegistry trainer_registry;
  absl::StatusOr<std::unique_ptr<trainer::TrainerMetrics>> trainer_metrics =
      trainer::TrainerMetrics::create(&trainer_registry, schema);
  ASSERT_TRUE(trainer_metrics.ok()) << trainer_metrics.status();
  (*trainer_metrics)->record_step(values);
  const std::string trainer_text = trainer_registry.render();
  EXPECT_NE(trainer_text.find("# HELP fp8rl_trainer_test_only_drift Test-only drift of the last "
                              "step.\n# TYPE fp8rl_trainer_test_only_drift gauge\n"),
            std::string::npos)
      << trainer_text;
  EXPECT_NE(trainer_text.find(sample_line("fp8rl_trainer_test_only_drift", drift)),
            std::string::npos)
      << trainer_text;

  // Coordinator: the row (over the wire) and its /metrics.
  rl::StepMetrics step;
  step.trainer = step_metrics_from_proto(response);
  const rl::MetricsValues row = rl::to_row(step);
  ASSERT_TRUE(row.contains("test_only_drift"));
  EXPECT_EQ(row.at("test_only_drift"), drift);
  service::MetricsRegistry coordinator_registry;
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorMetrics>> coordinator_metrics =
      coordinator::CoordinatorMetrics::create(&coordinator_registry, schema);
  ASSERT_TRUE(coordinator_metrics.ok()) << coordinator_metrics.status();
  (*coordinator_metrics)->record_step_metrics(row);
  const std::string coordinator_text = coordinator_registry.render();
  EXPECT_NE(coordinator_text.find(sample_line("fp8rl_rl_test_only_drift", drift)),
            std::string::npos)
      << coordinator_text;

  // Console: a series of the loss chart, after the schema's own series of that chart.
  absl::StatusOr<std::string> charts = console::chart_list_json(schema);
  ASSERT_TRUE(charts.ok()) << charts.status();
  const nlohmann::json spec = nlohmann::json::parse(*charts);
  std::vector<std::string> loss_series;
  for (const auto& chart : spec["charts"]) {
    if (chart["id"] != "loss") continue;
    for (const auto& s : chart["series"]) loss_series.push_back(s["key"].get<std::string>());
    EXPECT_EQ(chart["series"].back()["label"], "test-only drift");
  }
  EXPECT_EQ(loss_series, (std::vector<std::string>{"loss", "pg_loss", "kl", "test_only_drift"}));

  // Without the entry, the same values do not make a gauge (the table decides, not the values).
  service::MetricsRegistry plain_registry;
  auto plain = coordinator::CoordinatorMetrics::create(&plain_registry);
  ASSERT_TRUE(plain.ok());
  (*plain)->record_step_metrics(row);
  EXPECT_EQ(plain_registry.render().find("test_only_drift"), std::string::npos);
}

// The row keys and values a TrainStep answer gave before the schema (13 fixed fields, read one by
// one): a new trainer's answer and an old trainer's answer (fixed fields only) give both.
TEST(StepMetricSchema, OldAndNewPeersExchangeTheSameValues) {
  const rl::MetricsValues values = random_values(rl::kStepMetrics, 11);
  v1::TrainStepResponse response;
  step_metrics_to_proto(values, &response);
  // An old coordinator reads the fixed fields.
  EXPECT_EQ(response.loss(), values.at("loss"));
  EXPECT_EQ(response.pg_loss(), values.at("pg_loss"));
  EXPECT_EQ(response.kl(), values.at("kl"));
  EXPECT_EQ(response.grad_norm(), values.at("grad_norm"));
  EXPECT_EQ(response.learning_rate(), values.at("learning_rate"));
  EXPECT_EQ(response.clip_fraction(), values.at("clip_fraction"));
  EXPECT_EQ(static_cast<double>(response.tokens()), values.at("train_tokens"));
  EXPECT_EQ(response.mismatch().token_mult_prob_error(), values.at("token_mult_prob_error"));
  EXPECT_EQ(response.mismatch().gen_kl_error(), values.at("gen_kl_error"));
  EXPECT_EQ(response.mismatch().sampling_importance_ratio(),
            values.at("sampling_importance_ratio"));
  EXPECT_EQ(response.mismatch().is_oob_ratio(), values.at("is_oob_ratio"));
  EXPECT_EQ(response.mismatch().probs_ratio_min(), values.at("probs_ratio_min"));
  EXPECT_EQ(response.mismatch().probs_ratio_max(), values.at("probs_ratio_max"));
  EXPECT_EQ(step_metrics_from_proto(response), values);
  // A new coordinator reads an old trainer's answer (no map).
  v1::TrainStepResponse old = response;
  old.clear_metrics();
  EXPECT_EQ(step_metrics_from_proto(old), values);
}

TEST(StepMetricSchema, ChartListKeepsThePreSchemaOrder) {
  absl::StatusOr<std::string> charts = console::chart_list_json();
  ASSERT_TRUE(charts.ok()) << charts.status();
  const nlohmann::json spec = nlohmann::json::parse(*charts);
  std::vector<std::string> ids;
  for (const auto& chart : spec["charts"]) ids.push_back(chart["id"].get<std::string>());
  EXPECT_EQ(ids,
            (std::vector<std::string>{"reward", "val_accuracy", "token_mult_prob_error",
                                      "gen_kl_error", "is_weights", "clipped", "loss", "time"}));
  std::vector<std::string> clipped;
  for (const auto& chart : spec["charts"]) {
    if (chart["id"] != "clipped") continue;
    for (const auto& s : chart["series"]) clipped.push_back(s["key"].get<std::string>());
  }
  EXPECT_EQ(clipped, (std::vector<std::string>{"is_oob_ratio", "clip_fraction"}));
}

// docs/metrics.md lists each gauge the schema makes, with its help text for the trainer's.
TEST(StepMetricSchema, MetricsDocListsEverySchemaGauge) {
  std::ifstream in(std::string(FP8RL_TEST_SOURCE_DIR) + "/docs/metrics.md");
  ASSERT_TRUE(in) << "docs/metrics.md";
  std::stringstream doc;
  doc << in.rdbuf();
  const std::string text = doc.str();
  // Markdown tables escape the pipe.
  auto md = [](std::string_view s) { return absl::StrReplaceAll(std::string(s), {{"|", "\\|"}}); };
  for (const rl::StepMetricDef& m : rl::kStepMetrics) {
    if (!m.trainer_help.empty()) {
      EXPECT_NE(text.find(absl::StrCat("| fp8rl_trainer_", std::string(m.name), " | gauge | | ",
                                       md(m.trainer_help), " |")),
                std::string::npos)
          << m.name;
    }
    if (m.coordinator_gauge) {
      EXPECT_NE(text.find(absl::StrCat("| fp8rl_rl_", std::string(m.name), " | gauge |")),
                std::string::npos)
          << m.name;
    }
    EXPECT_NE(text.find(absl::StrCat("| `", std::string(m.name), "` | ", md(m.meaning), " |")),
              std::string::npos)
        << m.name;
  }
}

}  // namespace
}  // namespace fp8rl
