// Tests of rl/staleness.h: which samples a train step uses and which it regenerates, the
// staleness histogram, the generation gate, and the errors.
#include "rl/staleness.h"

#include <vector>

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

TEST(Staleness, UsesSamplesAtMostKBehindAndRegeneratesOlderOnes) {
  // Trained version 10, K = 2: versions 10, 9, 8 are used, 7 and 5 are regenerated.
  const std::vector<int64_t> versions = {10, 9, 7, 8, 10, 5, 9};
  absl::StatusOr<StalenessVerdict> v = apply_staleness_bound(versions, 10, 2);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->used, (std::vector<size_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(v->regenerate, (std::vector<size_t>{2, 5}));
  EXPECT_EQ(v->histogram, (std::map<int64_t, int64_t>{{0, 2}, {1, 2}, {2, 1}}));
  EXPECT_EQ(v->max_used, 2);
}

TEST(Staleness, KZeroUsesOnlyTheTrainedVersion) {
  const std::vector<int64_t> versions = {4, 3, 4};
  absl::StatusOr<StalenessVerdict> v = apply_staleness_bound(versions, 4, 0);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->used, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(v->regenerate, (std::vector<size_t>{1}));
  EXPECT_EQ(v->histogram, (std::map<int64_t, int64_t>{{0, 2}}));
  EXPECT_EQ(v->max_used, 0);
}

TEST(Staleness, RejectsANegativeBoundAndVersionsFromTheFuture) {
  const std::vector<int64_t> versions = {3, 6};
  EXPECT_EQ(apply_staleness_bound(versions, 5, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<StalenessVerdict> v = apply_staleness_bound(versions, 5, 2);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("sample 1"), std::string_view::npos) << v.status();
}

TEST(Staleness, GateLetsStepSStartOnceStepSMinus1MinusKIsPublished) {
  EXPECT_EQ(staleness_gate_step(5, 0), 4);  // synchronous: the previous step's version
  EXPECT_EQ(staleness_gate_step(5, 1), 3);
  EXPECT_EQ(staleness_gate_step(5, 2), 2);
  EXPECT_EQ(staleness_gate_step(1, 2), -2);  // before the run's first step: its first version
}

}  // namespace
}  // namespace fp8rl::rl
