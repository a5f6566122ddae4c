// Tests the SQLite job store: lifecycle, metrics rows, and that jobs survive a reopen (restart),
// with RUNNING jobs marked for resumption.
#include "services/coordinator/job_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

namespace fp8rl::coordinator {
namespace {

std::string temp_db(const char* name) {
  const std::string path = testing::TempDir() + "/" + name + ".db";
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  return path;
}

TEST(JobStore, SurvivesRestartAndMarksRunningForResume) {
  const std::string path = temp_db("restart");
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> dist(0.1, 0.9);
  std::string running_id, done_id, queued_id;
  std::map<std::string, double> step2;
  {
    auto store = JobStore::open(path).value();
    running_id = store->create_job(R"({"name":"a"})", 20).value().id;
    done_id = store->create_job(R"({"name":"b"})", 5).value().id;
    queued_id = store->create_job(R"({"name":"c"})", 7).value().id;
    ASSERT_TRUE(store->set_state(running_id, JobState::kRunning).ok());
    ASSERT_TRUE(store->set_step(running_id, 2).ok());
    ASSERT_TRUE(store->set_checkpoint(running_id, "/ckpt/step-2", 2).ok());
    ASSERT_TRUE(store->put_metrics(running_id, 0, {{"val_accuracy", dist(rng)}}).ok());
    step2 = {{"reward_mean", dist(rng)}, {"token_mult_prob_error", 1.0 + dist(rng)}};
    ASSERT_TRUE(store->put_metrics(running_id, 2, step2).ok());
    ASSERT_TRUE(store->put_metrics(running_id, 1, {{"reward_mean", dist(rng)}}).ok());
    ASSERT_TRUE(store->set_state(done_id, JobState::kFailed, "trainer died").ok());
    EXPECT_FALSE(store->get_job(running_id)->resume);
  }
  auto store = JobStore::open(path).value();
  const JobRecord running = store->get_job(running_id).value();
  EXPECT_EQ(running.state, JobState::kRunning);
  EXPECT_TRUE(running.resume);
  EXPECT_EQ(running.step, 2);
  EXPECT_EQ(running.total_steps, 20);
  EXPECT_EQ(running.checkpoint, "/ckpt/step-2");
  EXPECT_EQ(running.checkpoint_step, 2);
  EXPECT_EQ(running.config_json, R"({"name":"a"})");
  const JobRecord failed = store->get_job(done_id).value();
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.error, "trainer died");
  EXPECT_FALSE(failed.resume);

  const auto rows = store->get_metrics(running_id).value();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].step, 0);
  EXPECT_EQ(rows[2].step, 2);
  EXPECT_DOUBLE_EQ(rows[2].values.at("reward_mean"), step2["reward_mean"]);
  EXPECT_DOUBLE_EQ(rows[2].values.at("token_mult_prob_error"), step2["token_mult_prob_error"]);
  EXPECT_EQ(store->latest_metrics(running_id).value()->step, 2);

  // The resumable RUNNING job comes before the older-or-newer QUEUED one.
  EXPECT_EQ(store->next_runnable().value()->id, running_id);
  ASSERT_TRUE(store->set_state(running_id, JobState::kSucceeded).ok());
  EXPECT_EQ(store->next_runnable().value()->id, queued_id);
  const auto counts = store->count_by_state().value();
  EXPECT_EQ(counts.at(JobState::kSucceeded), 1);
  EXPECT_EQ(counts.at(JobState::kQueued), 1);
  EXPECT_EQ(counts.at(JobState::kFailed), 1);
  EXPECT_EQ(counts.at(JobState::kRunning), 0);
}

TEST(JobStore, CancelAndErrors) {
  auto store = JobStore::open(":memory:").value();
  const std::string a = store->create_job("{}", 3).value().id;
  const std::string b = store->create_job("{}", 3).value().id;
  EXPECT_NE(a, b);
  EXPECT_EQ(store->cancel_if_queued(a).value().state, JobState::kCancelled);
  EXPECT_EQ(store->get_job(a)->error, "cancelled by user");
  ASSERT_TRUE(store->set_state(b, JobState::kRunning).ok());
  EXPECT_EQ(store->cancel_if_queued(b).value().state, JobState::kRunning);
  ASSERT_TRUE(store->set_state(b, JobState::kSucceeded).ok());
  EXPECT_EQ(store->cancel_if_queued(b).status().code(), absl::StatusCode::kFailedPrecondition);
  const auto missing = store->get_job("job-nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("job-nope"), std::string::npos);
  EXPECT_EQ(store->set_step("job-nope", 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->list_jobs(JobState::kCancelled, 0)->size(), 1u);
  EXPECT_EQ(store->list_jobs(std::nullopt, 1)->size(), 1u);
  EXPECT_EQ(store->list_jobs(std::nullopt, 0)->size(), 2u);
  EXPECT_FALSE(JobStore::open("/nonexistent-dir/x/jobs.db").ok());
}

}  // namespace
TEST(JobStore, DeleteMetricsAfterKeepsEarlierRowsAndOtherJobs) {
  auto store = JobStore::open(":memory:").value();
  const JobRecord a = store->create_job("{}", 5).value();
  const JobRecord b = store->create_job("{}", 5).value();
  for (int64_t step = 0; step <= 4; ++step) {
    ASSERT_TRUE(store->put_metrics(a.id, step, {{"reward_mean", 0.1 * (step + 1)}}).ok());
    ASSERT_TRUE(store->put_metrics(b.id, step, {{"reward_mean", 0.2 * (step + 1)}}).ok());
  }
  ASSERT_TRUE(store->delete_metrics_after(a.id, 2).ok());
  auto rows = store->get_metrics(a.id).value();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows.back().step, 2);
  EXPECT_DOUBLE_EQ(rows.back().values.at("reward_mean"), 0.3);
  EXPECT_EQ(store->get_metrics(b.id).value().size(), 5u);
  ASSERT_TRUE(store->delete_metrics_after(b.id, -1).ok());
  EXPECT_TRUE(store->get_metrics(b.id).value().empty());
}

}  // namespace fp8rl::coordinator
