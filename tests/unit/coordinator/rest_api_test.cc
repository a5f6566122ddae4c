// Tests the coordinator REST API in-process on a free loopback port: bad bodies (malformed JSON,
// unknown field, wrong type, out of range, oversized) answer 400 naming the field, unknown jobs
// 404, requests beyond the admission limits 429 with Retry-After, a model.checkpoint folder that
// cannot work answers 400 naming the field, and the server keeps serving valid requests afterwards.
#include "services/coordinator/rest_api.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {
namespace {

constexpr char kValidJob[] =
    R"({"model": {"init": {"config": {"vocab_size": 300, "hidden_size": 64,
                                      "intermediate_size": 128, "num_hidden_layers": 2,
                                      "num_attention_heads": 4}, "seed": 3}},
        "task": {"name": "addition", "params": {"digits": 2}},
        "algorithm": {"steps": 4, "prompts_per_step": 3, "samples_per_prompt": 4}})";

class RestApiTest : public testing::Test {
 protected:
  void SetUp() override {
    store_ = JobStore::open(":memory:").value();
    metrics_ = CoordinatorMetrics::create(&registry_).value();
    jobs_ = std::make_unique<JobManager>(store_.get(), nullptr, nullptr, metrics_.get());
    serve();
  }

  // Serves the routes again with these limits (set while no request is served).
  void serve_with(const AdmissionLimits& limits) {
    client_.reset();
    server_.reset();
    jobs_->set_admission_limits(limits);
    serve();
  }

  void serve() {
    service::HttpServerOptions options;
    options.host = "127.0.0.1";
    options.max_body_bytes = 4096;
    server_ = std::make_unique<service::HttpServer>(options, &registry_);
    add_rest_routes(*server_, *jobs_);
    const int port = server_->start().value();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port);
  }

  // Posts and returns (status, parsed body).
  std::pair<int, nlohmann::json> post(const std::string& path, const std::string& body) {
    auto res = client_->Post(path.c_str(), body, "application/json");
    if (!res) return {0, nullptr};
    return {res->status, nlohmann::json::parse(res->body, nullptr, false)};
  }
  std::pair<int, nlohmann::json> get(const std::string& path) {
    auto res = client_->Get(path.c_str());
    if (!res) return {0, nullptr};
    return {res->status, nlohmann::json::parse(res->body, nullptr, false)};
  }
  void expect_400(const std::string& body, const std::string& needle) {
    auto [status, json] = post("/v1/jobs", body);
    EXPECT_EQ(status, 400) << body;
    ASSERT_TRUE(json.is_object() && json.contains("error")) << json;
    EXPECT_NE(json["error"].get<std::string>().find(needle), std::string::npos)
        << "error '" << json["error"] << "' should mention '" << needle << "'";
  }

  service::MetricsRegistry registry_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<service::HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(RestApiTest, BadBodiesAnswer400NamingTheField) {
  expect_400(R"({"task": {"name": "addition",)", "malformed JSON");
  expect_400("[1, 2]", "body");
  expect_400("", "body");
  std::string unknown = kValidJob;
  unknown.insert(unknown.rfind('}'), R"(, "bogus_key": 1)");
  expect_400(unknown, "bogus_key");
  std::string wrong_type = kValidJob;
  wrong_type.replace(wrong_type.find(R"("steps": 4)"), 10, R"("steps": "four")");
  expect_400(wrong_type, "algorithm.steps");
  std::string out_of_range = kValidJob;
  out_of_range.replace(out_of_range.find(R"("samples_per_prompt": 4)"), 23,
                       R"("samples_per_prompt": 1)");
  expect_400(out_of_range, "algorithm.samples_per_prompt");
  std::string oversized = kValidJob;
  oversized.insert(oversized.rfind('}'), R"(, "name": ")" + std::string(8000, 'x') + "\"");
  expect_400(oversized, "body: request body exceeds the limit of 4096 bytes");
  // Still serving, and nothing was stored.
  auto [status, list] = get("/v1/jobs");
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(list["jobs"].empty());
  // The six rejected by the route count; the oversized body never reaches it (the HTTP server
  // answers it, counted in fp8rl_http_requests_total{code="400"}).
  EXPECT_EQ(metrics_->requests_rejected->with({"rest"}).value(), 6.0);
  EXPECT_EQ(metrics_->requests_rejected->with({"grpc"}).value(), 0.0);
  EXPECT_EQ(metrics_->jobs_submitted->get().value(), 0.0);
}

// model.checkpoint is read at submission: a folder that cannot work is a 400 naming the field; a
// good folder with a tokenizer is accepted (the job encodes with it).
TEST_F(RestApiTest, BadCheckpointFolderAnswers400) {
  std::string missing = kValidJob;
  // The model object of kValidJob: from its "init" to the end of "seed": 3}}.
  const size_t init_at = missing.find(R"({"init")");
  const size_t init_end = missing.find(R"("seed": 3}})", init_at) + std::strlen(R"("seed": 3}})");
  const std::string init = missing.substr(init_at, init_end - init_at);
  missing.replace(missing.find(init), init.size(), R"({"checkpoint": "/nonexistent/fp8rl/model"})");
  expect_400(missing, "model.checkpoint: /nonexistent/fp8rl/model does not exist");
  // A folder whose tokenizer has more ids than config.json's vocabulary: refused.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("fp8rl_rest_ckpt_", ::getpid());
  std::filesystem::create_directories(dir);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"config.json", R"({"vocab_size": 2})"},
      {"model.safetensors", "x"},
      {"tokenizer_config.json", R"({"eos_token": "<e>"})"},
      {"tokenizer.json",
       R"({"version": "1.0", "truncation": null, "padding": null, "normalizer": null,
           "added_tokens": [{"id": 2, "content": "<e>", "single_word": false, "lstrip": false,
                             "rstrip": false, "normalized": false, "special": true}],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
           "post_processor": null, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab": {"a": 0, "b": 1},
                     "merges": [], "byte_fallback": false, "ignore_merges": false}})"}};
  for (const auto& [name, text] : files) {
    ASSERT_TRUE(write_file_atomic((dir / name).string(), text).ok()) << name;
  }
  std::string with_tokenizer = kValidJob;
  with_tokenizer.replace(with_tokenizer.find(init), init.size(),
                         absl::StrCat(R"({"checkpoint": ")", dir.string(), R"("})"));
  expect_400(with_tokenizer, "tokenizer.json has ids up to 2 but config.json vocab_size is 2");
  EXPECT_EQ(metrics_->jobs_submitted->get().value(), 0.0);
  // The same folder with room for the tokenizer's ids: accepted.
  ASSERT_TRUE(write_file_atomic((dir / "config.json").string(), R"({"vocab_size": 3})").ok());
  auto [status, created] = post("/v1/jobs", with_tokenizer);
  EXPECT_EQ(status, 201) << created;
  std::filesystem::remove_all(dir);
  EXPECT_EQ(metrics_->jobs_submitted->get().value(), 1.0);
}

TEST_F(RestApiTest, PathsOutsideTheRootsNestedModelConfigsAndHugeRatesAnswer400) {
  namespace fs = std::filesystem;
  const fs::path base = fs::path(testing::TempDir()) / "rest-roots";
  for (const char* d : {"data", "models", "datasets"}) fs::create_directories(base / d);
  std::ofstream(base / "datasets" / "train.jsonl") << R"({"prompt": "1+1=", "answer": "2"})"
                                                   << "\n";
  jobs_->set_path_roots(
      {(base / "data").string(), (base / "models").string(), (base / "datasets").string()});
  const std::string jsonl_task =
      R"("task": {"name": "jsonl", "params": {"train_path": "%s"}, "val_size": 1})";
  auto job_with = [&](const std::string& task, const std::string& extra) {
    std::string body = kValidJob;
    body.replace(body.find(R"("task")"),
                 body.find("},", body.find(R"("task")")) + 1 - body.find(R"("task")"), task);
    if (!extra.empty()) body.insert(body.rfind('}'), ", " + extra);
    return body;
  };
  auto jsonl = [&](const std::string& path) {
    std::string task = jsonl_task;
    task.replace(task.find("%s"), 2, path);
    return task;
  };
  // The issue's job: /etc/passwd as training data. Refused at submission, naming the field; the
  // file is never read, so none of it can appear in the answer.
  auto [status, json] = post("/v1/jobs", job_with(jsonl("/etc/passwd"), ""));
  EXPECT_EQ(status, 400);
  const std::string error = json.value("error", "");
  EXPECT_NE(error.find("task.params.train_path: '/etc/passwd' is outside --datasets-root"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find("root:"), std::string::npos) << error;
  expect_400(job_with(jsonl((base / "datasets" / ".." / "data" / "x").string()), ""),
             "task.params.train_path");
  expect_400(
      job_with(jsonl("train.jsonl"), R"("checkpoint": {"every_steps": 1, "dir": "/tmp/x/etc"})"),
      "checkpoint.dir: '/tmp/x/etc' is outside --data-root");
  // A nested inline model config is checked like a config.json file.
  std::string nested = kValidJob;
  const size_t config_at = nested.find(R"("config": {)") + 10;
  nested.replace(config_at, nested.find("}, \"seed\"") + 1 - config_at, R"({"a": {"b": {}}})");
  expect_400(nested, "model.init.config: vocab_size");
  // A learning rate of 9.2e18 is not a job that diverges: it is refused.
  std::string huge_lr = kValidJob;
  huge_lr.replace(huge_lr.find(R"("steps": 4)"), 10, R"("steps": 4, "learning_rate": 9.2e18)");
  expect_400(huge_lr, "algorithm.learning_rate: must be in (0, 1]");
  EXPECT_EQ(metrics_->jobs_submitted->get().value(), 0.0);
  // Inside the roots: accepted, stored with the resolved path.
  auto [ok_status, created] = post(
      "/v1/jobs",
      job_with(jsonl("train.jsonl"), R"("checkpoint": {"every_steps": 1, "dir": "runs/new"})"));
  ASSERT_EQ(ok_status, 201) << created;
  auto [get_status, stored] = get("/v1/jobs/" + created["id"].get<std::string>());
  ASSERT_EQ(get_status, 200);
  EXPECT_EQ(stored["config"]["task"]["params"]["train_path"],
            fs::canonical(base / "datasets" / "train.jsonl").string())
      << stored;
  EXPECT_EQ(stored["config"]["checkpoint"]["dir"],
            (fs::canonical(base / "data") / "runs" / "new").string());
  fs::remove_all(base);
}

TEST_F(RestApiTest, SubmitGetListCancelMetrics) {
  auto [status, created] = post("/v1/jobs", kValidJob);
  ASSERT_EQ(status, 201) << created;
  const std::string id = created["id"];
  EXPECT_EQ(created["state"], "QUEUED");
  auto [s2, job] = get("/v1/jobs/" + id);
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(job["total_steps"], 4);
  EXPECT_EQ(job["step"], 0);
  EXPECT_EQ(job["config"]["task"]["name"], "addition");
  EXPECT_TRUE(job["latest_metrics"].is_null());

  ASSERT_TRUE(store_->put_metrics(id, 0, {{"val_accuracy", 0.25}}).ok());
  auto [s3, metrics] = get("/v1/jobs/" + id + "/metrics");
  ASSERT_EQ(s3, 200);
  ASSERT_EQ(metrics["steps"].size(), 1u);
  EXPECT_DOUBLE_EQ(metrics["steps"][0]["metrics"]["val_accuracy"].get<double>(), 0.25);
  EXPECT_EQ(get("/v1/jobs/" + id).second["latest_metrics"]["step"], 0);

  auto [s4, cancelled] = post("/v1/jobs/" + id + ":cancel", "");
  ASSERT_EQ(s4, 200);
  EXPECT_EQ(cancelled["state"], "CANCELLED");
  EXPECT_EQ(post("/v1/jobs/" + id + ":cancel", "").first, 200);  // already cancelled: same
  EXPECT_EQ(get("/v1/jobs?state=CANCELLED").second["jobs"].size(), 1u);
  EXPECT_EQ(get("/v1/jobs?state=BOGUS").first, 400);

  EXPECT_EQ(get("/v1/jobs/job-missing").first, 404);
  EXPECT_EQ(get("/v1/jobs/job-missing/metrics").first, 404);
  EXPECT_EQ(post("/v1/jobs/job-missing:cancel", "").first, 404);
  EXPECT_EQ(get("/healthz").first, 200);
  auto res = client_->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("fp8rl_coordinator_jobs{state=\"cancelled\"} 1"), std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("fp8rl_http_requests_total{code=\"404\"}"), std::string::npos);
  // One job accepted; one bad filter rejected (404s are not rejections).
  EXPECT_NE(res->body.find("fp8rl_coordinator_jobs_submitted_total 1\n"), std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("fp8rl_coordinator_requests_rejected_total{api=\"rest\"} 1\n"),
            std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("fp8rl_build_info{service=\"coordinator\"} 1\n"), std::string::npos);
}

// A job stored past submission (an older store, a hand-edited row) is checked against the roots
// again when it starts: it fails naming the field, before any file is opened and without a
// cluster call (this JobManager has no cluster).
TEST_F(RestApiTest, AStoredJobThatEscapesTheRootsFailsWhenItStarts) {
  namespace fs = std::filesystem;
  const fs::path base = fs::path(testing::TempDir()) / "start-roots";
  for (const char* d : {"data", "models", "datasets"}) fs::create_directories(base / d);
  fs::remove(base / "datasets" / "link");
  fs::create_directory_symlink("/etc", base / "datasets" / "link");
  jobs_->set_path_roots(
      {(base / "data").string(), (base / "models").string(), (base / "datasets").string()});
  std::vector<std::string> ids;
  for (const std::string& path :
       {std::string("/etc/passwd"), (base / "datasets" / ".." / ".." / "x.jsonl").string(),
        (base / "datasets" / "link" / "passwd").string()}) {
    std::string config = kValidJob;
    const size_t task = config.find(R"("task")");
    config.replace(task, config.find("},", task) + 1 - task,
                   absl::StrCat(R"("task": {"name": "jsonl", "params": {"train_path": ")", path,
                                R"("}, "val_size": 1})"));
    absl::StatusOr<JobRecord> job = store_->create_job(config, 4);
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id);
  }
  jobs_->start();
  for (const std::string& id : ids) {
    JobRecord job;
    for (int i = 0; i < 500; ++i) {
      job = jobs_->get(id).value();
      if (job.state == JobState::kFailed || job.state == JobState::kSucceeded) break;
      usleep(10'000);
    }
    EXPECT_EQ(job.state, JobState::kFailed) << id;
    EXPECT_NE(job.error.find("task.params.train_path"), std::string::npos) << job.error;
    EXPECT_NE(job.error.find("--datasets-root"), std::string::npos) << job.error;
    EXPECT_EQ(job.error.find("root:"), std::string::npos) << job.error;  // no file contents
  }
  jobs_->stop();
}

// Beyond --max-queued-jobs a submission answers 429 with Retry-After (rounded up to whole
// seconds), names the flag, is counted and stores nothing; once a queued job leaves the queue a
// submission is accepted again.
TEST_F(RestApiTest, FullQueueAnswers429WithRetryAfter) {
  AdmissionLimits limits;
  limits.max_queued_jobs = 2;
  limits.retry_after = std::chrono::milliseconds(1500);
  serve_with(limits);
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    auto [status, created] = post("/v1/jobs", kValidJob);
    ASSERT_EQ(status, 201) << created;
    ids.push_back(created["id"]);
  }
  auto res = client_->Post("/v1/jobs", kValidJob, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(res->get_header_value("Retry-After"), "2");
  const nlohmann::json body = nlohmann::json::parse(res->body, nullptr, false);
  ASSERT_TRUE(body.contains("error")) << res->body;
  EXPECT_NE(body["error"].get<std::string>().find("2 jobs queued (limit 2, --max-queued-jobs)"),
            std::string::npos)
      << body;
  EXPECT_EQ(metrics_->requests_refused->with({"queue_full"}).value(), 1.0);
  EXPECT_EQ(metrics_->requests_rejected->with({"rest"}).value(), 0.0);  // not a bad request
  EXPECT_EQ(metrics_->jobs_submitted->get().value(), 2.0);
  auto [list_status, list] = get("/v1/jobs");
  EXPECT_EQ(list_status, 200);
  EXPECT_EQ(list["jobs"].size(), 2u);
  // Reads are not limited by the queue.
  EXPECT_EQ(get(absl::StrCat("/v1/jobs/", ids[0])).first, 200);
  auto [cancel_status, cancelled] = post(absl::StrCat("/v1/jobs/", ids[0], ":cancel"), "");
  EXPECT_EQ(cancel_status, 200) << cancelled;
  EXPECT_EQ(post("/v1/jobs", kValidJob).first, 201);
}

// Beyond --max-inflight-requests every job API route answers 429 at once; a freed slot lets the
// next request through. The slots are held here directly, so the test does not depend on timing.
TEST_F(RestApiTest, BusyApiAnswers429UntilASlotIsFree) {
  AdmissionLimits limits;
  limits.max_inflight_requests = 2;
  serve_with(limits);
  AdmissionControl::Ticket a, b;
  ASSERT_TRUE(jobs_->admission().enter("test", &a).ok());
  ASSERT_TRUE(jobs_->admission().enter("test", &b).ok());
  EXPECT_EQ(jobs_->admission().inflight(), 2);
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/jobs"}, {"POST", "/v1/jobs"}, {"GET", "/v1/jobs/job-x"}}) {
    auto res = method == "GET" ? client_->Get(path.c_str())
                               : client_->Post(path.c_str(), kValidJob, "application/json");
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 429) << method << " " << path;
    EXPECT_EQ(res->get_header_value("Retry-After"), "1") << path;
    EXPECT_NE(res->body.find("2 job API requests in progress (limit 2, --max-inflight-requests)"),
              std::string::npos)
        << res->body;
  }
  EXPECT_EQ(metrics_->requests_refused->with({"inflight"}).value(), 3.0);
  EXPECT_EQ(metrics_->jobs_submitted->get().value(), 0.0);
  // Health and metrics are not job API calls.
  EXPECT_EQ(client_->Get("/metrics")->status, 200);
  b.release();
  EXPECT_EQ(get("/v1/jobs").first, 200);
  EXPECT_EQ(jobs_->admission().inflight(), 1);  // the request's own slot was given back
}

// A job whose rollouts may generate more tokens than --max-job-tokens is a 400 naming the fields
// and the cap; one exactly at the cap is accepted.
TEST_F(RestApiTest, JobOverTheTokenCapAnswers400) {
  // kValidJob: 4 steps x 3 prompts x 4 samples x 16 new tokens (the default) = 768.
  AdmissionLimits limits;
  limits.max_job_tokens = 767;
  serve_with(limits);
  expect_400(kValidJob,
             "algorithm.steps x prompts_per_step x samples_per_prompt x max_new_tokens: the "
             "job's rollouts may generate 4 x 3 x 4 x 16 = 768 tokens, over the per-job cap of "
             "767 (--max-job-tokens)");
  EXPECT_EQ(metrics_->requests_refused->with({"token_quota"}).value(), 1.0);
  EXPECT_EQ(metrics_->requests_rejected->with({"rest"}).value(), 1.0);
  limits.max_job_tokens = 768;
  serve_with(limits);
  EXPECT_EQ(post("/v1/jobs", kValidJob).first, 201);
}

// A job queued under a higher cap (or none) fails when it starts under a lower one, with the
// reason in its error, before any cluster call (this JobManager has no cluster).
TEST_F(RestApiTest, AQueuedJobOverALoweredTokenCapFailsWhenItStarts) {
  auto [status, created] = post("/v1/jobs", kValidJob);
  ASSERT_EQ(status, 201) << created;
  const std::string id = created["id"];
  AdmissionLimits limits;
  limits.max_job_tokens = 100;
  serve_with(limits);
  jobs_->start();
  JobRecord job;
  for (int i = 0; i < 500; ++i) {
    job = jobs_->get(id).value();
    if (is_terminal(job.state)) break;
    usleep(10'000);
  }
  jobs_->stop();
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_NE(job.error.find("token quota: algorithm.steps x prompts_per_step"), std::string::npos)
      << job.error;
  EXPECT_NE(job.error.find("768 tokens, over the per-job cap of 100"), std::string::npos)
      << job.error;
}

}  // namespace
}  // namespace fp8rl::coordinator
