// The scheduler's paged-KV block budget: block arithmetic, admission by free blocks, a sample
// larger than the whole budget refused at submit, blocks returned on finish and on cancel, and
// the budget not changing which version a sample runs at.
#include "services/generation_worker/kv_block_budget.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/generation_worker/scheduler.h"
#include "tests/unit/generation_worker/test_util.h"

namespace fp8rl::generation {
namespace {

using namespace std::chrono_literals;
using testing::export_set;
using testing::prompt_for;
using testing::random_model;

TEST(KvBlockBudget, BlocksAreTheCeilingOfTokensOverTheBlockSize) {
  KvBlockBudget b(16, 10);
  EXPECT_EQ(b.blocks_for(0), 0);
  EXPECT_EQ(b.blocks_for(1), 1);
  EXPECT_EQ(b.blocks_for(16), 1);
  EXPECT_EQ(b.blocks_for(17), 2);
  EXPECT_EQ(b.blocks_for(160), 10);
  EXPECT_TRUE(b.try_reserve(7));
  EXPECT_FALSE(b.try_reserve(4));  // 3 free
  EXPECT_EQ(b.used_blocks(), 7);   // a refused reservation takes nothing
  EXPECT_TRUE(b.try_reserve(3));
  EXPECT_EQ(b.free_blocks(), 0);
  EXPECT_DOUBLE_EQ(b.usage(), 1.0);
  b.release(5);
  EXPECT_EQ(b.free_blocks(), 5);
  EXPECT_DOUBLE_EQ(b.usage(), 0.5);
  EXPECT_FALSE(b.try_reserve(-1));
  b.release_all();
  EXPECT_EQ(b.used_blocks(), 0);
}

TEST(KvBlockBudget, OptionsGiveTheBudgetInWholeBlocks) {
  SchedulerOptions o;
  o.kv_cache_tokens = 100;
  o.kv_block_size = 16;
  EXPECT_EQ(kv_budget_blocks(o), 6);  // 96 tokens: a partial block is not budgeted
  o.kv_cache_blocks = 9;              // an explicit count (the CUDA pool's) wins
  EXPECT_EQ(kv_budget_blocks(o), 9);
  EXPECT_TRUE(validate_scheduler_options(o).ok());
  o.kv_cache_blocks = 0;
  o.kv_cache_tokens = 15;
  EXPECT_EQ(validate_scheduler_options(o).code(), absl::StatusCode::kInvalidArgument);
  o.kv_cache_tokens = 100;
  o.kv_block_size = 0;
  EXPECT_EQ(validate_scheduler_options(o).code(), absl::StatusCode::kInvalidArgument);
}

// A sample whose prompt is prompt_for(n) (3 + n % 9 tokens).
SampleSpec spec(int n, int max_new_tokens) {
  SampleSpec s;
  s.sample_id = absl::StrCat("s", n);
  s.prompt = prompt_for(n);
  s.params.temperature = 1.0f;
  s.params.max_new_tokens = max_new_tokens;
  s.params.seed = static_cast<uint64_t>(100 + n);
  return s;
}

template <typename F>
bool eventually(F done, std::chrono::milliseconds timeout = 10000ms) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return done();
}

std::vector<SampleOutcome> take_all(GenerationRequest& r) {
  std::vector<SampleOutcome> out;
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (!r.done() && std::chrono::steady_clock::now() < end) {
    for (SampleOutcome& o : r.take(20ms)) out.push_back(std::move(o));
  }
  for (SampleOutcome& o : r.take(0ms)) out.push_back(std::move(o));
  return out;
}

class SchedulerBlocksTest : public ::testing::Test {
 protected:
  // 8 blocks of 16 tokens.
  void start(int64_t blocks = 8) {
    SchedulerOptions o;
    o.kv_block_size = 16;
    o.kv_cache_tokens = 16 * blocks;
    o.batch_wait = 0ms;
    scheduler_ = std::make_unique<Scheduler>(o, nullptr);
  }
  static LoadedWeights weights(int64_t version, uint64_t seed) {
    auto m = random_model(seed);
    absl::StatusOr<LoadedWeights> w =
        load_weights(export_set(*m, model::WeightFormat::kFP8, version), {});
    EXPECT_TRUE(w.ok()) << w.status();
    return std::move(*w);
  }
  void install(int64_t version, uint64_t seed) {
    ASSERT_TRUE(scheduler_->install(weights(version, seed)).ok());
  }
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerBlocksTest, AdmitsByFreeBlocksAndReturnsThemOnFinish) {
  start(8);
  install(1, 61);
  EXPECT_EQ(scheduler_->snapshot().kv_blocks_total, 8);
  // prompt_for(1) has 4 tokens: 4 + 40 = 44 tokens = 3 blocks each. Two fit (6 of 8), the third
  // waits for a finished one although 2 blocks are free.
  auto a = scheduler_->submit({spec(1, 40), spec(10, 40), spec(19, 40)}, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(eventually([&] { return scheduler_->snapshot().steps >= 2; }));
  Scheduler::Snapshot s = scheduler_->snapshot();
  EXPECT_EQ(s.running_samples, 2);
  EXPECT_EQ(s.queued_samples, 1);
  EXPECT_EQ(s.kv_blocks_used, 6);
  EXPECT_DOUBLE_EQ(s.kv_cache_usage, 6.0 / 8.0);
  // A small sample (4 + 12 = 16 tokens: 1 block) waits too: admission is in queue order.
  auto b = scheduler_->submit({spec(28, 12)}, 0);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(eventually([&] { return scheduler_->snapshot().steps >= 4; }));
  EXPECT_EQ(scheduler_->snapshot().queued_samples, 2);
  EXPECT_EQ(scheduler_->snapshot().peak_batch_size, 2);

  EXPECT_EQ(take_all(**a).size(), 3u);
  EXPECT_EQ(take_all(**b).size(), 1u);
  EXPECT_TRUE((*a)->status().ok());
  ASSERT_TRUE(eventually([&] { return scheduler_->snapshot().running_samples == 0; }));
  s = scheduler_->snapshot();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.kv_cache_usage, 0.0);
  // After the first two finished, the third (3 blocks) and the small one (1) ran together.
  EXPECT_EQ(s.peak_batch_size, 2);
}

TEST_F(SchedulerBlocksTest, ASampleLargerThanTheBudgetIsRefusedAtSubmit) {
  start(4);  // 64 tokens
  install(1, 62);
  // prompt_for(2) has 5 tokens: 5 + 59 = 64 fits exactly; 5 + 60 = 65 needs a 5th block.
  auto fits = scheduler_->submit({spec(2, 59)}, 0);
  ASSERT_TRUE(fits.ok()) << fits.status();
  auto too_big = scheduler_->submit({spec(3, 1), spec(2, 60)}, 0);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_big.status().message(),
            "sample 's2': prompt (5 tokens) + max_new_tokens (60) needs 5 KV blocks of 16 "
            "tokens; this worker's KV budget is 4 blocks");
  // Nothing of the refused request was queued; the fitting one runs to the end.
  EXPECT_EQ(take_all(**fits).size(), 1u);
  EXPECT_EQ(scheduler_->snapshot().queued_samples, 0);
  EXPECT_EQ(scheduler_->snapshot().running_samples, 0);
}

TEST_F(SchedulerBlocksTest, CancelReturnsBlocksToTheQueue) {
  start(6);
  install(1, 63);
  // 4 + 60 = 64 tokens: 4 blocks; the second sample (4 blocks) cannot join.
  auto a = scheduler_->submit({spec(1, 60)}, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(eventually([&] { return scheduler_->snapshot().steps >= 1; }));
  auto b = scheduler_->submit({spec(10, 60)}, 0);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(eventually([&] { return scheduler_->snapshot().steps >= 3; }));
  EXPECT_EQ(scheduler_->snapshot().kv_blocks_used, 4);
  EXPECT_EQ(scheduler_->snapshot().queued_samples, 1);
  scheduler_->cancel(**a);
  // b gets a's blocks within a step, long before a's 60 tokens would have ended.
  ASSERT_TRUE(eventually([&] {
    const Scheduler::Snapshot s = scheduler_->snapshot();
    return s.running_samples == 1 && s.queued_samples == 0;
  }));
  EXPECT_LT(scheduler_->snapshot().steps, 55);
  EXPECT_EQ(scheduler_->snapshot().kv_blocks_used, 4);
  EXPECT_EQ(take_all(**b).size(), 1u);
  ASSERT_TRUE(eventually([&] { return scheduler_->snapshot().running_samples == 0; }));
  EXPECT_EQ(scheduler_->snapshot().kv_blocks_used, 0);
  EXPECT_EQ(scheduler_->snapshot().cancelled_samples, 1);
  EXPECT_EQ((*a)->status().code(), absl::StatusCode::kCancelled);
}

TEST_F(SchedulerBlocksTest, WaitingForBlocksDoesNotMixVersions) {
  start(16);
  install(1, 64);
  LoadedWeights v2 = weights(2, 65);
  // a holds 13 of 16 blocks (4 + 200 tokens); b (4 + 60: 4 blocks) waits for them. A new version
  // arrives meanwhile: a finishes at 1, and b, admitted only after the swap, runs wholly at 2.
  auto a = scheduler_->submit({spec(1, 200)}, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(eventually([&] { return scheduler_->snapshot().steps >= 1; }));
  auto b = scheduler_->submit({spec(10, 60)}, 0);
  ASSERT_TRUE(b.ok());
  std::thread installer([&] { EXPECT_TRUE(scheduler_->install(std::move(v2)).ok()); });
  const std::vector<SampleOutcome> a_out = take_all(**a);
  const std::vector<SampleOutcome> b_out = take_all(**b);
  installer.join();
  ASSERT_EQ(a_out.size(), 1u);
  ASSERT_EQ(b_out.size(), 1u);
  EXPECT_EQ(a_out[0].weight_version, 1);
  EXPECT_EQ(b_out[0].weight_version, 2);
  EXPECT_EQ(a_out[0].tokens.size(), 200u);
  EXPECT_EQ(scheduler_->snapshot().kv_blocks_used, 0);
}

}  // namespace
}  // namespace fp8rl::generation
