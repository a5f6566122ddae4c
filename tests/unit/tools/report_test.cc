// Tests `fp8rl report`'s writer on a random, non-zero history: every SVG point carries the step
// and value of the row it came from, a stacked chart draws cumulative heights, summary.md holds
// the held-out accuracy per evaluated step and links the charts written, and --out errors leave
// nothing behind.
#include "tools/fp8rl/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "common/fs.h"
#include "tests/unit/common/temp_dir.h"

namespace fp8rl::cli {
namespace {

struct SvgPoint {
  std::string key;
  int64_t step;
  double value;
  double cy;
};

std::vector<SvgPoint> svg_points(const std::string& svg) {
  static const std::regex circle(
      R"re(<circle data-key="([^"]+)" data-step="(-?\d+)" data-value="([^"]+)" cx="[^"]+" cy="([^"]+)")re");
  std::vector<SvgPoint> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), circle); it != std::sregex_iterator();
       ++it) {
    out.push_back({(*it)[1], std::stoll((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
  }
  return out;
}

ReportJob random_job(int64_t steps) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.1, 2.0);
  ReportJob job;
  job.id = "job-123-abc";
  job.state = "SUCCEEDED";
  job.step = steps;
  job.total_steps = steps;
  job.created_unix_ms = 1764680000000;
  job.updated_unix_ms = 1764680061500;
  job.config_json = R"({"name": "demo", "algorithm": {"steps": 30}})";
  job.rows.push_back({0, {{"val_accuracy", u(rng) / 2}}});
  for (int64_t step = 1; step <= steps; ++step) {
    ReportRow row{step, {}};
    for (const char* key : {"reward_mean", "token_mult_prob_error", "gen_kl_error", "loss",
                            "time_generate_seconds", "time_train_seconds", "time_sync_seconds"}) {
      row.values[key] = u(rng);
    }
    if (step % 10 == 0) row.values["val_accuracy"] = u(rng) / 2;
    job.rows.push_back(row);
  }
  return job;
}

TEST(Report, ChartPointsMatchTheRows) {
  const ReportJob job = random_job(30);
  testing_util::TempDir tmp;
  const std::string out = tmp.file("report");
  ASSERT_TRUE(write_report(job, out).ok());
  const ChartList charts = console_charts().value();
  int charts_checked = 0;
  for (const ChartSpec& chart : charts.charts) {
    const std::string path = out + "/" + chart.id + ".svg";
    std::vector<SvgPoint> points;
    if (std::filesystem::exists(path)) points = svg_points(read_text_file(path).value());
    int64_t expected = 0;
    for (const ReportRow& row : job.rows) {
      for (const ChartSeries& s : chart.series) expected += row.values.count(s.key);
    }
    EXPECT_EQ(static_cast<int64_t>(points.size()), expected) << chart.id;
    EXPECT_EQ(std::filesystem::exists(path), expected > 0) << chart.id;
    for (const SvgPoint& p : points) {
      const ReportRow& row = job.rows.at(static_cast<size_t>(p.step));
      ASSERT_EQ(row.step, p.step);
      EXPECT_EQ(p.value, row.values.at(p.key)) << chart.id << " " << p.key << " step " << p.step;
    }
    if (expected > 0) ++charts_checked;
  }
  EXPECT_GE(charts_checked, 5);

  // Stacked time chart: at each step a later series sits higher (smaller cy) than an earlier one.
  const std::vector<SvgPoint> time = svg_points(read_text_file(out + "/time.svg").value());
  std::map<int64_t, std::vector<double>> cy_by_step;
  for (const SvgPoint& p : time) cy_by_step[p.step].push_back(p.cy);
  ASSERT_EQ(cy_by_step.size(), 30u);
  for (const auto& [step, cys] : cy_by_step) {
    ASSERT_EQ(cys.size(), 3u);
    EXPECT_GT(cys[0], cys[1]) << step;
    EXPECT_GT(cys[1], cys[2]) << step;
  }
}

TEST(Report, SummaryHasAccuracyPerEvaluatedStepAndLinksCharts) {
  const ReportJob job = random_job(30);
  testing_util::TempDir tmp;
  ASSERT_TRUE(write_report(job, tmp.file("r")).ok());
  const std::string md = read_text_file(tmp.file("r") + "/summary.md").value();
  EXPECT_NE(md.find("# Job job-123-abc"), std::string::npos);
  EXPECT_NE(md.find("| state | SUCCEEDED |"), std::string::npos);
  EXPECT_NE(md.find("| duration | 61.5 s |"), std::string::npos);
  for (int64_t step : {0, 10, 20, 30}) {
    const double v = job.rows[static_cast<size_t>(step)].values.at("val_accuracy");
    char cell[64];
    std::snprintf(cell, sizeof(cell), " | %.4g |", v);
    EXPECT_NE(md.find(std::to_string(step) + (step == 0 ? " (before RL)" : "") + cell),
              std::string::npos)
        << "step " << step << "\n"
        << md;
  }
  EXPECT_NE(md.find("](reward.svg)"), std::string::npos);
  EXPECT_EQ(md.find("](is_weights.svg)"), std::string::npos);  // no IS metrics in this history
  EXPECT_NE(md.find("\"name\": \"demo\""), std::string::npos);
}

TEST(Report, OutErrorsLeaveNothingBehind) {
  const ReportJob job = random_job(3);
  testing_util::TempDir tmp;
  // A non-empty folder that is not an earlier report is refused and kept as it was.
  std::filesystem::create_directories(tmp.file("precious"));
  ASSERT_TRUE(write_file_atomic(tmp.file("precious") + "/notes.txt", "keep me").ok());
  absl::Status s = write_report(job, tmp.file("precious"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--out"), std::string::npos);
  EXPECT_EQ(read_text_file(tmp.file("precious") + "/notes.txt").value(), "keep me");
  // A file in the way, or a missing parent.
  ASSERT_TRUE(write_file_atomic(tmp.file("file"), "x").ok());
  EXPECT_EQ(write_report(job, tmp.file("file")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(write_report(job, tmp.file("missing/report")).code(),
            absl::StatusCode::kInvalidArgument);
  // An earlier report is replaced.
  ASSERT_TRUE(write_report(job, tmp.file("again")).ok());
  ASSERT_TRUE(write_report(random_job(30), tmp.file("again")).ok());
  EXPECT_NE(read_text_file(tmp.file("again") + "/summary.md").value().find("| steps | 30 / 30 |"),
            std::string::npos);
  std::vector<std::string> entries = tmp.entries();
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"again", "file", "precious"}));
}

}  // namespace
}  // namespace fp8rl::cli
