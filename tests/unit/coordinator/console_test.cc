// Tests what the web console relies on, in-process on a free loopback port: the console's files
// are served from the binary; GET answers carry an ETag and a matching If-None-Match gets 304;
// GET /v1/jobs/{id}/metrics?max_points=N thins a 10,000-step history per metric (first and last
// kept, sparse metrics kept whole, values unchanged); POST /v1/jobs takes YAML and names the field
// of a bad value.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "nlohmann/json.hpp"
#include "services/coordinator/console/assets.h"
#include "services/coordinator/console/chart_list.h"
#include "services/coordinator/console/console_routes.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/metrics_downsample.h"
#include "services/coordinator/rest_api.h"

namespace fp8rl::coordinator {
namespace {

constexpr char kValidYaml[] = R"(name: yaml-job
model:
  init:
    config: {vocab_size: 300, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
             num_attention_heads: 4}
    seed: 3
task:
  name: addition
  params:
    digits: 2
algorithm:
  steps: 4
  prompts_per_step: 3
  samples_per_prompt: 4
)";

class ConsoleTest : public testing::Test {
 protected:
  void SetUp() override {
    store_ = JobStore::open(":memory:").value();
    metrics_ = CoordinatorMetrics::create(&registry_).value();
    jobs_ = std::make_unique<JobManager>(store_.get(), nullptr, nullptr, metrics_.get());
    service::HttpServerOptions options;
    options.host = "127.0.0.1";
    server_ = std::make_unique<service::HttpServer>(options, &registry_);
    add_rest_routes(*server_, *jobs_);
    console::add_console_routes(*server_);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->start().value());
  }

  service::MetricsRegistry registry_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<service::HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ConsoleTest, ServesTheEmbeddedFiles) {
  auto page = client_->Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("/console/console.js"), std::string::npos);
  for (const char* name : {"console.js", "console.css", "charts.json", "index.html"}) {
    auto res = client_->Get((std::string("/console/") + name).c_str());
    ASSERT_TRUE(res) << name;
    EXPECT_EQ(res->status, 200) << name;
    const console::EmbeddedFile* file = console::find_embedded_file(name);
    ASSERT_NE(file, nullptr) << name;
    // charts.json is served with the step metrics' charts filled in (chart_list.h).
    EXPECT_EQ(res->body, std::string(name) == "charts.json" ? console::chart_list_json().value()
                                                            : std::string(file->body))
        << name;
    EXPECT_GT(res->body.size(), 100u) << name;
  }
  auto missing = client_->Get("/console/nope.js");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_NE(missing->body.find("nope.js"), std::string::npos);
}

TEST_F(ConsoleTest, ChartListIsValidJsonWithKnownFields) {
  const nlohmann::json spec = nlohmann::json::parse(console::chart_list_json().value());
  ASSERT_TRUE(spec["charts"].is_array());
  EXPECT_GE(spec["charts"].size(), 8u);
  std::set<std::string> ids;
  for (const auto& chart : spec["charts"]) {
    EXPECT_TRUE(ids.insert(chart["id"].get<std::string>()).second) << "duplicate id";
    ASSERT_FALSE(chart["series"].empty());
    for (const auto& s : chart["series"]) {
      EXPECT_FALSE(s["key"].get<std::string>().empty());
      EXPECT_FALSE(s["label"].get<std::string>().empty());
    }
  }
  EXPECT_FALSE(spec["palette"].empty());
}

TEST_F(ConsoleTest, GetAnswersCarryAnEtagAndAMatchGets304) {
  auto first = client_->Get("/v1/jobs");
  ASSERT_TRUE(first);
  const std::string etag = first->get_header_value("ETag");
  ASSERT_FALSE(etag.empty());
  EXPECT_EQ(etag, service::body_etag(first->body));

  auto same = client_->Get("/v1/jobs", {{"If-None-Match", etag}});
  ASSERT_TRUE(same);
  EXPECT_EQ(same->status, 304);
  EXPECT_TRUE(same->body.empty());
  auto listed = client_->Get("/v1/jobs", {{"If-None-Match", "\"other\", W/" + etag}});
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->status, 304);

  const std::string id = jobs_->submit_text(kValidYaml).value().id;
  auto changed = client_->Get("/v1/jobs", {{"If-None-Match", etag}});
  ASSERT_TRUE(changed);
  EXPECT_EQ(changed->status, 200);
  EXPECT_NE(changed->get_header_value("ETag"), etag);
  EXPECT_NE(changed->body.find(id), std::string::npos);

  // Errors carry no tag and never answer 304.
  auto missing = client_->Get("/v1/jobs/job-nope", {{"If-None-Match", "*"}});
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_FALSE(missing->has_header("ETag"));
}

TEST_F(ConsoleTest, LongHistoryIsThinnedPerMetric) {
  const std::string id = jobs_->submit_text(kValidYaml).value().id;
  // 10,000 RL steps of random non-zero values, plus row 0; val_accuracy on row 0 and every 50th.
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> uniform(0.05, 1.0);
  std::map<int64_t, std::map<std::string, double>> stored;
  for (int64_t step = 0; step <= 10000; ++step) {
    std::map<std::string, double> values;
    if (step > 0) {
      values["reward_mean"] = uniform(rng);
      values["token_mult_prob_error"] = uniform(rng) * 1e-2;
    }
    if (step % 50 == 0) values["val_accuracy"] = uniform(rng);
    ASSERT_TRUE(store_->put_metrics(id, step, values).ok());
    stored[step] = values;
  }
  auto res = client_->Get(("/v1/jobs/" + id + "/metrics?max_points=500").c_str());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const nlohmann::json body = nlohmann::json::parse(res->body);
  EXPECT_EQ(body["recorded_rows"], 10001);
  std::map<std::string, std::vector<int64_t>> steps_of;
  int64_t last_step = -1;
  for (const auto& row : body["steps"]) {
    const int64_t step = row["step"];
    EXPECT_GT(step, last_step) << "rows out of order";
    last_step = step;
    for (const auto& [key, value] : row["metrics"].items()) {
      steps_of[key].push_back(step);
      EXPECT_EQ(value.get<double>(), stored.at(step).at(key)) << key << " at " << step;
    }
  }
  for (const char* key : {"reward_mean", "token_mult_prob_error"}) {
    ASSERT_EQ(steps_of[key].size(), 500u) << key;
    EXPECT_EQ(steps_of[key].front(), 1) << key;
    EXPECT_EQ(steps_of[key].back(), 10000) << key;
    // Evenly spaced: every gap is 20 or 21 steps (9,999 / 499 = 20.04).
    for (size_t i = 1; i < steps_of[key].size(); ++i) {
      const int64_t gap = steps_of[key][i] - steps_of[key][i - 1];
      EXPECT_TRUE(gap == 20 || gap == 21) << key << " gap " << gap << " at " << i;
    }
  }
  EXPECT_EQ(steps_of["val_accuracy"].size(), 201u);  // under the limit: every point, row 0 too
  EXPECT_EQ(steps_of["val_accuracy"].front(), 0);
  // Dense metrics share their picks, so the answer has few rows beyond max_points.
  EXPECT_LE(body["steps"].size(), 500u + 201u);

  auto full = client_->Get(("/v1/jobs/" + id + "/metrics").c_str());
  ASSERT_TRUE(full);
  EXPECT_EQ(nlohmann::json::parse(full->body)["steps"].size(), 10001u);
  EXPECT_FALSE(nlohmann::json::parse(full->body).contains("recorded_rows"));
}

TEST_F(ConsoleTest, MetricsEtagChangesWithEveryRowChange) {
  const std::string id = jobs_->submit_text(kValidYaml).value().id;
  const std::string path = "/v1/jobs/" + id + "/metrics?max_points=50";
  ASSERT_TRUE(store_->put_metrics(id, 0, {{"val_accuracy", 0.25}}).ok());
  ASSERT_TRUE(store_->put_metrics(id, 1, {{"reward_mean", 0.5}}).ok());
  auto first = client_->Get(path.c_str());
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200);
  std::string etag = first->get_header_value("ETag");
  ASSERT_FALSE(etag.empty());
  auto same = client_->Get(path.c_str(), {{"If-None-Match", etag}});
  ASSERT_TRUE(same);
  EXPECT_EQ(same->status, 304);
  EXPECT_TRUE(same->body.empty());
  EXPECT_EQ(same->get_header_value("ETag"), etag);
  // Another max_points is another answer.
  auto other = client_->Get(("/v1/jobs/" + id + "/metrics").c_str(), {{"If-None-Match", etag}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200);

  // A new row, a replaced row (same step, recorded later) and removed rows each change the tag.
  const std::vector<std::function<void()>> changes = {
      [&] {
        ASSERT_TRUE(store_->put_metrics(id, 2, {{"reward_mean", 0.75}}).ok());
      },
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        ASSERT_TRUE(store_->put_metrics(id, 2, {{"reward_mean", 0.875}}).ok());
      },
      [&] { ASSERT_TRUE(store_->delete_metrics_after(id, 0).ok()); },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    changes[i]();
    auto res = client_->Get(path.c_str(), {{"If-None-Match", etag}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << "change " << i;
    EXPECT_NE(res->get_header_value("ETag"), etag) << "change " << i;
    etag = res->get_header_value("ETag");
  }
  auto missing = client_->Get("/v1/jobs/job-nope/metrics", {{"If-None-Match", "*"}});
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(ConsoleTest, BadMaxPointsIsRejectedNamingTheParameter) {
  const std::string id = jobs_->submit_text(kValidYaml).value().id;
  for (const char* bad : {"1", "-5", "many"}) {
    auto res = client_->Get(("/v1/jobs/" + id + "/metrics?max_points=" + bad).c_str());
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << bad;
    EXPECT_NE(res->body.find("max_points"), std::string::npos) << res->body;
  }
}

TEST(DownsampleMetrics, ShortHistoryComesBackUnchanged) {
  std::vector<MetricsRow> rows = {{0, {{"val_accuracy", 0.25}}, 10},
                                  {1, {{"reward_mean", 0.5}, {"loss", 0.75}}, 20}};
  const std::vector<MetricsRow> out = downsample_metrics(rows, 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].values, rows[1].values);
  EXPECT_EQ(out[1].recorded_ms, 20);
}

TEST_F(ConsoleTest, YamlSubmitAndItsFieldErrors) {
  auto ok = client_->Post("/v1/jobs", kValidYaml, "application/yaml");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 201) << ok->body;
  EXPECT_EQ(nlohmann::json::parse(ok->body)["state"], "QUEUED");

  std::string bad = kValidYaml;
  bad.replace(bad.find("samples_per_prompt: 4"), 21, "samples_per_prompt: 1");
  auto res = client_->Post("/v1/jobs", bad, "application/yaml; charset=utf-8");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  const std::string error = nlohmann::json::parse(res->body)["error"];
  EXPECT_EQ(error.rfind("algorithm.samples_per_prompt", 0), 0u) << error;

  auto empty = client_->Post("/v1/jobs", "  \n", "text/yaml");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->status, 400);
  EXPECT_NE(empty->body.find("body"), std::string::npos);

  // Without a YAML content type the body must still be a JSON object.
  auto json_only = client_->Post("/v1/jobs", kValidYaml, "application/json");
  ASSERT_TRUE(json_only);
  EXPECT_EQ(json_only->status, 400);
}

}  // namespace
}  // namespace fp8rl::coordinator
