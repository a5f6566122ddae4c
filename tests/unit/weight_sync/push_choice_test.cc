// The per-worker choice of full or delta pushes: probes a delta first, then follows the measured
// costs, re-probing the other kind after PushChooser::kReprobeAfter choices in a row.
#include "services/weight_sync/push_choice.h"

#include <gtest/gtest.h>

#include <vector>

namespace fp8rl::weight_sync {
namespace {

std::vector<PushKind> choices(PushChooser& c, int n) {
  std::vector<PushKind> out;
  for (int i = 0; i < n; ++i) out.push_back(c.choose().kind);
  return out;
}

TEST(PushChooser, ProbesThenFollowsTheCheaperKindAndReprobes) {
  PushChooser c;
  // Nothing measured: a delta, marked as a probe.
  PushChooser::Choice first = c.choose();
  EXPECT_EQ(first.kind, PushKind::kDelta);
  EXPECT_TRUE(first.probe);
  c.observed(PushKind::kDelta, 0.9, 100);  // 9 ms per byte
  // A delta measured, no full push yet: full, as a probe.
  PushChooser::Choice second = c.choose();
  EXPECT_EQ(second.kind, PushKind::kFull);
  EXPECT_TRUE(second.probe);
  c.observed(PushKind::kFull, 0.5, 100);
  ASSERT_TRUE(c.seconds_per_byte(PushKind::kFull).has_value());
  EXPECT_DOUBLE_EQ(*c.seconds_per_byte(PushKind::kFull), 0.005);
  // Full is cheaper: 1 (the probe) + 7 more fulls make kReprobeAfter in a row, then one delta.
  const std::vector<PushKind> next = choices(c, PushChooser::kReprobeAfter);
  for (int i = 0; i < PushChooser::kReprobeAfter - 1; ++i) {
    EXPECT_EQ(next[i], PushKind::kFull) << i;
  }
  EXPECT_EQ(next.back(), PushKind::kDelta);
  // The re-probe found deltas cheap now (the link got slower): the estimate moves halfway,
  // 0.5 x 9 + 0.5 x 1 = 5 ms per byte, equal to full's, so full stays.
  c.observed(PushKind::kDelta, 0.1, 100);
  EXPECT_DOUBLE_EQ(*c.seconds_per_byte(PushKind::kDelta), 0.005);
  EXPECT_EQ(c.choose().kind, PushKind::kFull);
  c.observed(PushKind::kDelta, 0.1, 100);  // 3 ms per byte: now cheaper
  const PushChooser::Choice after = c.choose();
  EXPECT_EQ(after.kind, PushKind::kDelta);
  EXPECT_FALSE(after.probe);
}

TEST(PushChooser, CostsAreComparedPerFullVersionByte) {
  PushChooser c;
  c.choose();
  // A delta of a 1000-byte version took 2 s; a full push of a 100-byte version 1 s: per byte
  // the delta (2 ms) beats full (10 ms), although its seconds are larger.
  c.observed(PushKind::kDelta, 2.0, 1000);
  c.choose();
  c.observed(PushKind::kFull, 1.0, 100);
  EXPECT_EQ(c.choose().kind, PushKind::kDelta);
  // Nonsense observations are ignored.
  c.observed(PushKind::kFull, -1.0, 100);
  c.observed(PushKind::kFull, 1.0, 0);
  EXPECT_DOUBLE_EQ(*c.seconds_per_byte(PushKind::kFull), 0.01);
}

}  // namespace
}  // namespace fp8rl::weight_sync
