// Tests of the shared thread pool: coverage, nesting, concurrency and error propagation.
#include "common/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

namespace fp8rl {
namespace {

TEST(ParallelFor, VisitsEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 7, 100, 12345}) {
    for (int64_t grain : {1, 3, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(
          n,
          [&](int64_t begin, int64_t end) {
            ASSERT_LT(begin, end);
            for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          },
          grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << grain;
    }
  }
}

TEST(ParallelFor, RespectsGrainAndEmptyRange) {
  ThreadPool pool(3);
  std::atomic<int> calls{0};
  pool.parallel_for(0, [&](int64_t, int64_t) { calls++; });
  EXPECT_EQ(calls.load(), 0);
  pool.parallel_for(
      1000,
      [&](int64_t begin, int64_t end) {
        calls++;
        if (end != 1000) {
          EXPECT_GE(end - begin, 400);
        }
      },
      400);
  EXPECT_LE(calls.load(), 3);
}

TEST(ParallelFor, ComputesASumLikeASerialLoop) {
  std::vector<double> x(100000);
  std::iota(x.begin(), x.end(), 1.0);
  std::vector<double> partial(x.size());
  parallel_for(static_cast<int64_t>(x.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) partial[i] = x[i] * x[i];
  });
  const double want = 1e5 * (1e5 + 1) * (2e5 + 1) / 6;
  EXPECT_EQ(std::accumulate(partial.begin(), partial.end(), 0.0), want);
}

TEST(ParallelFor, NestedCallsRunInlineWithoutDeadlock) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(64 * 64);
  pool.parallel_for(64, [&](int64_t b0, int64_t e0) {
    for (int64_t i = b0; i < e0; ++i) {
      pool.parallel_for(64, [&](int64_t b1, int64_t e1) {
        for (int64_t j = b1; j < e1; ++j) hits[i * 64 + j]++;
      });
    }
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ParallelFor, ConcurrentCallersAreAllServed) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(6, 0);
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      std::vector<int64_t> v(5000);
      for (int rep = 0; rep < 20; ++rep) {
        pool.parallel_for(5000, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) v[i] = i + t;
        });
      }
      sums[t] = std::accumulate(v.begin(), v.end(), int64_t{0});
    });
  }
  for (auto& c : callers) c.join();
  for (int t = 0; t < 6; ++t) EXPECT_EQ(sums[t], 4999LL * 5000 / 2 + 5000LL * t);
}

TEST(ParallelFor, RethrowsTheFirstExceptionAndStaysUsable) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.parallel_for(1000,
                                 [&](int64_t b, int64_t e) {
                                   if (b <= 500 && 500 < e) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> total{0};
  pool.parallel_for(1000, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 1000);
}

TEST(ParallelFor, DefaultThreadsHonoursTheEnvironment) {
  EXPECT_GE(default_num_threads(), 1);
  EXPECT_GE(global_thread_pool().num_threads(), 1);
  ThreadPool single(1);
  int64_t seen = 0;
  single.parallel_for(10, [&](int64_t b, int64_t e) { seen += e - b; });
  EXPECT_EQ(seen, 10);
}

}  // namespace
}  // namespace fp8rl
