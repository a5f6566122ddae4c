// Tests the bounded retry of refused job-store writes: a refusal that clears is retried through,
// one that does not fails naming the record with the store's reason, other errors and a stop end
// the retries at once, and every refused try is counted.
#include "services/coordinator/store_retry.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status refused() {
  return absl::UnavailableError(
      "job store: disk I/O error (nothing was written): Read-only file system");
}

TEST(StoreRetry, RetriesARefusalThatClears) {
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  std::mt19937 rng(7);
  const int refusals = 1 + static_cast<int>(rng() % 3);  // 1..3
  int calls = 0;
  StoreRetry retry;
  retry.wait = std::chrono::seconds(10);
  retry.metrics = metrics.get();
  const absl::Status s = retry_store_write("metrics_row", "the metrics row of step 3", retry, [&] {
    return ++calls <= refusals ? refused() : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, refusals + 1);
  EXPECT_EQ(metrics->store_write_failures->with({"metrics_row"}).value(), refusals);
  EXPECT_EQ(metrics->store_write_failures->with({"state"}).value(), 0.0);
}

TEST(StoreRetry, GivesUpNamingTheRecordAndTheReason) {
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  int calls = 0;
  StoreRetry retry;
  retry.wait = std::chrono::milliseconds(450);
  retry.metrics = metrics.get();
  const auto start = Clock::now();
  const absl::Status s = retry_store_write("step", "the progress of step 12", retry, [&] {
    ++calls;
    return refused();
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(std::string(s.message())
                  .starts_with("job store: cannot record the progress of step 12 (refused "))
      << s;
  EXPECT_NE(s.message().find("): disk I/O error (nothing was written): Read-only file system"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find(absl::StrCat("refused ", calls, " times")), std::string::npos) << s;
  // 100 + 200 ms of pauses fit in 450 ms and the next (400 ms) would not: three tries, two when
  // a loaded machine oversleeps.
  EXPECT_GE(calls, 2);
  EXPECT_LE(calls, 3);
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(metrics->store_write_failures->with({"step"}).value(), calls);
}

TEST(StoreRetry, OtherErrorsAndSuccessReturnAtOnce) {
  int calls = 0;
  StoreRetry retry;
  const absl::Status s = retry_store_write("state", "the end of job 'j'", retry, [&] {
    ++calls;
    return absl::InternalError("job store: constraint failed");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "job store: constraint failed");
  EXPECT_EQ(calls, 1);
}

TEST(StoreRetry, AStopOrNoWaitEndsAfterOneTry) {
  int calls = 0;
  StoreRetry stopped;
  stopped.wait = std::chrono::seconds(10);
  stopped.stop = [] { return true; };
  absl::Status s = retry_store_write("checkpoint", "the checkpoint of step 6", stopped, [&] {
    ++calls;
    return refused();
  });
  EXPECT_EQ(s, refused());  // the store's own error, unchanged
  EXPECT_EQ(calls, 1);
  StoreRetry once;
  once.wait = std::chrono::milliseconds(0);
  s = retry_store_write("checkpoint", "the checkpoint of step 6", once, [&] {
    ++calls;
    return refused();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cannot record the checkpoint of step 6 (refused 1 time in"),
            std::string::npos)
      << s;
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace fp8rl::coordinator
