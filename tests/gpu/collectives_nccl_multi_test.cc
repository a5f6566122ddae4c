// The NCCL backend across 2 to 4 GPUs, one rank per device on threads (NCCL refuses two ranks on
// one device): reduce-scatter against the sum written out here (within NCCL's own summation
// order) and all-gather of floats and E4M3 codes bit for bit, for equal pieces
// (ncclReduceScatter / ncclAllGather) and unequal ones with an empty piece (grouped ncclReduce /
// ncclBroadcast), and a peer that never takes part (DEADLINE_EXCEEDED, then FAILED_PRECONDITION).
// A separate binary from collectives_nccl_test.cc so a one-GPU machine runs that one without
// skips; this one skips with fewer than 2 devices.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "tests/gpu/nccl_test_util.h"
#include "train/collectives_nccl.h"

namespace fp8rl::train {
namespace {

using nccl_test::data_of;
using nccl_test::device_count;

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
