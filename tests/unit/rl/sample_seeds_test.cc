// Tests of rl/sample_seeds.h: pinned values (a change would re-seed every job and break resumed
// runs), no repeated seed over a grid of steps, prompts and samples, and validation seeds apart
// from rollout seeds.
#include "rl/sample_seeds.h"

#include <set>

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

TEST(SampleSeeds, ArePinned) {
  EXPECT_EQ(sample_seed(42, 1, 0, 0), 0x3e4a12d70b0af178ull);
  EXPECT_EQ(sample_seed(1, 7, 3, 5), 0x69f731ab27382180ull);
  EXPECT_EQ(validation_sample_seed(1, 0, 0), 0xc8550039cfd8257aull);
  EXPECT_EQ(validation_sample_seed(1, 2, 2), 0xec48fbe2e67b10e3ull);
  EXPECT_EQ(validation_sample_seed(9, 3, 4), sample_seed(9, -4, 4, 0));
}

TEST(SampleSeeds, NeverRepeatWithinAJob) {
  std::set<uint64_t> rollout, validation;
  for (int64_t step = 0; step <= 20; ++step) {
    for (int64_t p = 0; p < 16; ++p) {
      validation.insert(validation_sample_seed(3, step, p));
      if (step == 0) continue;
      for (int64_t g = 0; g < 8; ++g) rollout.insert(sample_seed(3, step, p, g));
    }
  }
  EXPECT_EQ(rollout.size(), 20u * 16u * 8u);
  EXPECT_EQ(validation.size(), 21u * 16u);
  for (uint64_t seed : validation) EXPECT_FALSE(rollout.contains(seed));
  EXPECT_NE(sample_seed(3, 1, 0, 0), sample_seed(4, 1, 0, 0));  // the job seed matters
}

}  // namespace
}  // namespace fp8rl::rl
