// Payload buffers of evicted versions are handed to the next upload with their allocation (the
// same memory, no new pages), the smallest that fits, and only up to the pool's limit.
#include "services/weight_sync/payload_pool.h"

#include <gtest/gtest.h>

#include <string>

namespace fp8rl::weight_sync {
namespace {

std::string filled(size_t n) { return std::string(n, 'x'); }

TEST(PayloadPool, HandsBackTheSameAllocationWhenItFits) {
  PayloadPool pool(1);
  EXPECT_EQ(pool.take(100).capacity(), std::string().capacity());  // nothing to reuse yet
  std::string a = filled(1 << 20);
  const char* memory = a.data();
  pool.give(std::move(a));
  EXPECT_EQ(pool.spares(), 1u);
  EXPECT_EQ(pool.take(2 << 20).capacity(), std::string().capacity());  // too small: not used
  std::string b = pool.take(1 << 20);
  EXPECT_EQ(b.data(), memory);
  EXPECT_TRUE(b.empty());
  EXPECT_GE(b.capacity(), size_t{1} << 20);
  EXPECT_EQ(pool.reused(), 1u);
  EXPECT_EQ(pool.spares(), 0u);
}

TEST(PayloadPool, KeepsTheLargestUpToItsLimitAndTakesTheSmallestThatFits) {
  PayloadPool pool(2);
  pool.give(filled(1000));
  pool.give(filled(3000));
  pool.give(filled(2000));  // full: replaces the 1000-byte one
  EXPECT_EQ(pool.spares(), 2u);
  EXPECT_LT(pool.take(500).capacity(), 3000u);  // the 2000-byte one
  EXPECT_GE(pool.take(2500).capacity(), 3000u);
  EXPECT_EQ(pool.spares(), 0u);
  pool.set_max_spares(0);
  pool.give(filled(1000));
  EXPECT_EQ(pool.spares(), 0u);
}

}  // namespace
}  // namespace fp8rl::weight_sync
