// The NCCL backend on one GPU: a one-rank group still runs initialization (unique id through the
// rendezvous store), all-reduce on the device (sum, min, max of random non-zero data: with one
// rank each is the identity) and teardown. Skips without a CUDA device.
#include "train/collectives_nccl.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>

namespace fp8rl::train {
namespace {

TEST(NcclCollectives, OneRankGroupInitReduceTeardown) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  GroupOptions options;
  options.prefix = "nccl-one";
  absl::StatusOr<std::unique_ptr<Collectives>> group =
      make_nccl_collectives(make_memory_store(), options);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->rank(), 0);
  EXPECT_EQ((*group)->size(), 1);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> v(5000);
  for (float& x : v) x = d(gen);
  const std::vector<float> want = v;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    ASSERT_TRUE((*group)->all_reduce(std::span<float>(v), op, "test").ok());
    EXPECT_EQ(v, want);
  }
  std::vector<int64_t> ids = {7, -3};
  ASSERT_TRUE((*group)->all_reduce(std::span<int64_t>(ids), ReduceOp::kSum, "ids").ok());
  EXPECT_EQ(ids, (std::vector<int64_t>{7, -3}));
  EXPECT_EQ((*group)->stats().calls, 4);
  EXPECT_EQ((*group)->stats().bytes, 3 * 5000 * 4 + 16);
  group->reset();  // teardown
}

}  // namespace
}  // namespace fp8rl::train
