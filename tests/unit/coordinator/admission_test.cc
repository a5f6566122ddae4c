// Tests the job API's admission control without a server: slots are counted and given back by
// tickets (moves included), the retry hint survives the status it rides on, and the rollout token
// bound saturates instead of overflowing.
#include "services/coordinator/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "services/coordinator/coordinator_metrics.h"

namespace fp8rl::coordinator {
namespace {

TEST(AdmissionControl, TicketsHoldAndReturnSlots) {
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  AdmissionLimits limits;
  limits.max_inflight_requests = 3;
  limits.retry_after = std::chrono::milliseconds(250);
  AdmissionControl admission(limits, metrics.get());
  std::vector<AdmissionControl::Ticket> held(3);
  for (auto& t : held) ASSERT_TRUE(admission.enter("test", &t).ok());
  AdmissionControl::Ticket refused;
  const absl::Status s = admission.enter("test", &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(retry_after_of(s).has_value());
  EXPECT_EQ(retry_after_of(s)->count(), 250);
  EXPECT_EQ(metrics->requests_refused->with({"inflight"}).value(), 1.0);
  // A moved ticket holds one slot, not two; a moved-from one holds none.
  AdmissionControl::Ticket moved = std::move(held[0]);
  held[0].release();
  EXPECT_EQ(admission.inflight(), 3);
  moved = std::move(held[1]);  // gives back the slot `moved` held
  EXPECT_EQ(admission.inflight(), 2);
  held.clear();
  moved.release();
  EXPECT_EQ(admission.inflight(), 0);
}

// Many threads entering and leaving at once never exceed the limit and leave nothing held.
TEST(AdmissionControl, ConcurrentCallersNeverExceedTheLimit) {
  AdmissionLimits limits;
  limits.max_inflight_requests = 4;
  AdmissionControl admission(limits);
  std::atomic<int64_t> admitted{0}, refused{0}, peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        AdmissionControl::Ticket ticket;
        if (!admission.enter("test", &ticket).ok()) {
          ++refused;
          continue;
        }
        ++admitted;
        int64_t now = admission.inflight(), seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted + refused, 16000);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_LE(peak.load(), 4);
  EXPECT_EQ(admission.inflight(), 0);
}

TEST(AdmissionControl, ZeroMeansNoLimit) {
  AdmissionLimits limits;
  limits.max_inflight_requests = 0;
  limits.max_queued_jobs = 0;
  limits.max_job_tokens = 0;
  AdmissionControl admission(limits);
  std::vector<AdmissionControl::Ticket> held(100);
  for (auto& t : held) EXPECT_TRUE(admission.enter("test", &t).ok());
  EXPECT_TRUE(admission.check_queue(1'000'000).ok());
  rl::JobConfig config;
  config.algorithm.steps = 1'000'000;
  EXPECT_TRUE(admission.check_tokens(config).ok());
}

TEST(AdmissionControl, QueueLimitRefusesAtTheLimit) {
  AdmissionLimits limits;
  limits.max_queued_jobs = 5;
  AdmissionControl admission(limits);
  EXPECT_TRUE(admission.check_queue(4).ok());
  const absl::Status s = admission.check_queue(5);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("5 jobs queued (limit 5, --max-queued-jobs)"), std::string::npos) << s;
  EXPECT_TRUE(retry_after_of(s).has_value());
}

TEST(RolloutTokenBound, MultipliesAndSaturates) {
  rl::JobConfig config;
  config.algorithm.steps = 7;
  config.algorithm.prompts_per_step = 5;
  config.algorithm.samples_per_prompt = 3;
  config.algorithm.max_new_tokens = 11;
  EXPECT_EQ(rollout_token_bound(config), 7 * 5 * 3 * 11);
  config.algorithm.steps = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_EQ(rollout_token_bound(config), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(check_token_cap(config, 1000).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RetryAfter, OnlyOverloadErrorsCarryAHint) {
  EXPECT_FALSE(retry_after_of(absl::ResourceExhaustedError("x")).has_value());
  EXPECT_FALSE(retry_after_of(absl::InvalidArgumentError("x")).has_value());
  EXPECT_EQ(retry_after_of(overloaded_error("busy", std::chrono::milliseconds(1234)))->count(),
            1234);
}

}  // namespace
}  // namespace fp8rl::coordinator
