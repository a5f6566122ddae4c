// The NCCL backend. On one GPU: a one-rank group still runs initialization (unique id through the
// rendezvous store, nonblocking init), all-reduce (sum, min, max of random non-zero data: with one
// rank each is the identity), reduce-scatter and all-gather of every element type (the identity
// with one rank) and teardown; a group of 2 whose rank 1 never joins times out in init. Skips
// without a CUDA device. Groups across devices: collectives_nccl_multi_test.cc.
#include "train/collectives_nccl.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tests/gpu/nccl_test_util.h"

namespace fp8rl::train {
namespace {

using nccl_test::data_of;
using nccl_test::device_count;

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

TEST(NcclCollectives, OneRankPiecesAreTheWholeArray) {
  if (device_count() == 0) GTEST_SKIP() << "needs a CUDA device";
  GroupOptions options;
  options.prefix = "nccl-one-pieces";
  absl::StatusOr<std::unique_ptr<Collectives>> group =
      make_nccl_collectives(make_memory_store(), options);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<float> in = data_of(0, 4099);
  std::vector<float> out(4099);
  const std::vector<int64_t> counts = {4099};
  ASSERT_TRUE((*group)->reduce_scatter(in, out, counts, "rs").ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), in.size() * 4), 0);
  std::vector<float> all(4099);
  ASSERT_TRUE((*group)->all_gather(std::span<const float>(in), all, counts, "ag f32").ok());
  EXPECT_EQ(std::memcmp(all.data(), in.data(), in.size() * 4), 0);
  std::vector<uint16_t> bf16(4099), bf16_all(4099);
  std::vector<uint8_t> codes(4099), codes_all(4099);
  for (size_t i = 0; i < bf16.size(); ++i) {
    bf16[i] = static_cast<uint16_t>(0x3f80 + i);
    codes[i] = static_cast<uint8_t>(1 + i % 250);
  }
  ASSERT_TRUE((*group)->all_gather(std::span<const uint16_t>(bf16), bf16_all, counts, "bf16").ok());
  ASSERT_TRUE(
      (*group)->all_gather(std::span<const uint8_t>(codes), codes_all, counts, "codes").ok());
  EXPECT_EQ(bf16_all, bf16);
  EXPECT_EQ(codes_all, codes);
  const absl::Status bad = (*group)->reduce_scatter(in, out, std::vector<int64_t>{4098}, "rs");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
}

TEST(NcclCollectives, InitTimesOutWhenARankNeverJoins) {
  if (device_count() == 0) GTEST_SKIP() << "needs a CUDA device";
  GroupOptions options;
  options.size = 2;
  options.prefix = "nccl-lonely";
  options.timeout = std::chrono::milliseconds(3000);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Collectives>> group =
      make_nccl_collectives(make_memory_store(), options);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
  EXPECT_NE(group.status().message().find("ncclCommInitRankConfig (rank 0 of 2)"),
            std::string::npos)
      << group.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace fp8rl::train
