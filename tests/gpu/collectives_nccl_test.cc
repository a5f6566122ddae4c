// The NCCL backend. On one GPU: a one-rank group still runs initialization (unique id through the
// rendezvous store, nonblocking init), all-reduce (sum, min, max of random non-zero data: with one
// rank each is the identity), reduce-scatter and all-gather of every element type (the identity
// with one rank) and teardown; a group of 2 whose rank 1 never joins times out in init. On 2 or
// more GPUs (one rank per device, threads): reduce-scatter against the sum written out here and
// all-gather bit for bit, for equal and unequal pieces, and a peer that never takes part. Skips
// without the devices a test needs.
#include "train/collectives_nccl.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

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

int device_count() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) return 0;
  return devices;
}

std::vector<float> data_of(int r, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * r + n));
  std::uniform_real_distribution<float> mag(-6.0f, 6.0f);
  std::uniform_int_distribution<int> sign(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = (sign(gen) ? 1.0f : -1.0f) * std::exp2(mag(gen));
  return v;
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

// One rank per device on threads (NCCL refuses two ranks on one device).
std::vector<std::unique_ptr<Collectives>> device_group(int size, const std::string& prefix,
                                                       int timeout_ms) {
  auto store = make_memory_store();
  std::vector<std::unique_ptr<Collectives>> groups(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      GroupOptions o;
      o.rank = r;
      o.size = size;
      o.prefix = prefix;
      o.timeout = std::chrono::milliseconds(timeout_ms);
      absl::StatusOr<std::unique_ptr<Collectives>> g = make_nccl_collectives(store, o);
      EXPECT_TRUE(g.ok()) << g.status();
      if (g.ok()) groups[static_cast<size_t>(r)] = std::move(*g);
    });
  }
  for (std::thread& t : threads) t.join();
  return groups;
}

TEST(NcclCollectives, ReduceScatterAndAllGatherAcrossDevices) {
  const int size = std::min(device_count(), 4);
  if (size < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  auto groups = device_group(size, "nccl-pieces", 60000);
  for (const auto& g : groups) ASSERT_TRUE(g);
  for (bool equal : {true, false}) {
    std::vector<int64_t> counts;
    for (int r = 0; r < size; ++r) counts.push_back(equal ? 300 : (r == 1 ? 0 : 129 + 77 * r));
    std::vector<int64_t> offsets(static_cast<size_t>(size) + 1, 0);
    for (int r = 0; r < size; ++r) offsets[r + 1] = offsets[r] + counts[r];
    const auto whole = static_cast<size_t>(offsets[size]);
    std::vector<std::vector<float>> reduced(static_cast<size_t>(size)),
        gathered(static_cast<size_t>(size));
    std::vector<std::vector<uint8_t>> codes(static_cast<size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        cudaSetDevice(r);
        const std::vector<float> in = data_of(r, whole);
        reduced[r].resize(static_cast<size_t>(counts[r]));
        EXPECT_TRUE(groups[r]->reduce_scatter(in, reduced[r], counts, "rs").ok());
        gathered[r].resize(whole);
        const std::vector<float> mine(in.begin() + offsets[r], in.begin() + offsets[r + 1]);
        EXPECT_TRUE(
            groups[r]->all_gather(std::span<const float>(mine), gathered[r], counts, "ag").ok());
        std::vector<uint8_t> c(static_cast<size_t>(counts[r]), static_cast<uint8_t>(r + 1));
        codes[r].resize(whole);
        EXPECT_TRUE(
            groups[r]->all_gather(std::span<const uint8_t>(c), codes[r], counts, "codes").ok());
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < size; ++r) {
      for (int64_t j = offsets[r]; j < offsets[r + 1]; ++j) {
        double want = 0, scale = 0;
        for (int q = 0; q < size; ++q) {
          want += data_of(q, whole)[j];
          scale += std::fabs(data_of(q, whole)[j]);
        }
        // NCCL's own summation order: within (size - 1) float roundings of the sum.
        EXPECT_NEAR(reduced[r][j - offsets[r]], want, size * 6e-8 * scale) << r << " " << j;
        for (int q = 0; q < size; ++q) {
          EXPECT_EQ(std::memcmp(&gathered[q][j], &data_of(r, whole)[j], 4), 0);
          EXPECT_EQ(codes[q][j], r + 1);
        }
      }
    }
  }
}

TEST(NcclCollectives, PeerMissingFromAReduceScatterTimesOut) {
  if (device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  auto groups = device_group(2, "nccl-hung", 2000);
  ASSERT_TRUE(groups[0] && groups[1]);
  cudaSetDevice(0);
  const std::vector<float> in = data_of(0, 1000);
  std::vector<float> out(500);
  const absl::Status s =
      groups[0]->reduce_scatter(in, out, std::vector<int64_t>{500, 500}, "grads");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("grads failed on rank 0 of 2"), std::string::npos) << s;
  EXPECT_EQ(groups[0]->all_reduce(std::span<float>(out), ReduceOp::kSum, "again").code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fp8rl::train
