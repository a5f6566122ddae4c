// Reduce-scatter and all-gather of train/collectives.h on Gloo over loopback (groups of 2, 3 and
// 4 threads) and on the one-rank group: pieces of odd and unequal sizes, an empty piece, every
// element type; the reduce-scatter's rank-order sum checked bit for bit against the same sum
// written out here, and against all_reduce with 2 ranks (where the order cannot matter); the
// bucketed reduce-scatter into shards; argument errors, a peer that never takes part, and the
// stats.
#include "train/collectives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "tests/unit/train/group_util.h"
#include "train/collectives_bucketed.h"
#include "train/shard.h"

namespace fp8rl::train {
namespace {

using test_group::make_group;
using test_group::on_ranks;
using Counts = std::vector<int64_t>;

// Rank r's whole array: random non-zero floats of mixed sign and magnitude (so the order of a
// sum changes its rounding), from seed (r, n).
std::vector<float> data_of(int r, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * r + n));
  std::uniform_real_distribution<float> mag(-6.0f, 6.0f);
  std::uniform_int_distribution<int> sign(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = (sign(gen) ? 1.0f : -1.0f) * std::exp2(mag(gen));
  return v;
}

template <typename T>
std::vector<T> codes_of(int r, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(77 + r));
  std::uniform_int_distribution<int> d(1, std::numeric_limits<T>::max());
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(d(gen));
  return v;
}

// Piece layouts per group size: odd, unequal, one empty piece, and equal pieces.
std::vector<std::vector<int64_t>> layouts(int size) {
  switch (size) {
    case 2:
      return {{517, 260}, {0, 333}, {128, 128}};
    case 3:
      return {{301, 5, 699}, {17, 0, 1}, {256, 256, 256}};
    default:
      return {{129, 1, 1000, 77}, {0, 64, 0, 63}, {97, 97, 97, 97}};
  }
}

class PiecesTest : public testing::TestWithParam<int> {};

TEST_P(PiecesTest, ReduceScatterSumsEachElementInRankOrder) {
  const int size = GetParam();
  auto groups = make_group(size, absl::StrCat("rs", size));
  for (const auto& g : groups) ASSERT_TRUE(g);
  for (const std::vector<int64_t>& counts : layouts(size)) {
    const auto whole = static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), 0ll));
    auto outs = on_ranks(size, [&](int r) {
      const std::vector<float> in = data_of(r, whole);
      std::vector<float> out(static_cast<size_t>(counts[static_cast<size_t>(r)]));
      const absl::Status s = groups[r]->reduce_scatter(in, out, counts, "grads reduce-scatter");
      EXPECT_TRUE(s.ok()) << s;
      return out;
    });
    std::vector<std::vector<float>> data;
    for (int q = 0; q < size; ++q) data.push_back(data_of(q, whole));
    int64_t offset = 0;
    for (int r = 0; r < size; ++r) {
      const auto n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
      ASSERT_EQ(outs[r].size(), n);
      for (size_t j = 0; j < n; ++j) {
        float want = data[0][static_cast<size_t>(offset) + j];
        for (int q = 1; q < size; ++q) want += data[q][static_cast<size_t>(offset) + j];
        ASSERT_EQ(std::memcmp(&outs[r][j], &want, 4), 0)
            << "rank " << r << " element " << j << ": " << outs[r][j] << " vs " << want;
      }
      offset += counts[static_cast<size_t>(r)];
    }
  }
}

TEST_P(PiecesTest, AllGatherMovesEveryTypeBitForBitToEveryRank) {
  const int size = GetParam();
  auto groups = make_group(size, absl::StrCat("ag", size));
  for (const auto& g : groups) ASSERT_TRUE(g);
  for (const std::vector<int64_t>& counts : layouts(size)) {
    const auto whole = static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), 0ll));
    std::vector<int64_t> offsets(static_cast<size_t>(size) + 1, 0);
    for (int r = 0; r < size; ++r) offsets[r + 1] = offsets[r] + counts[r];
    // Rank r's piece of each type: the slice [offsets[r], offsets[r + 1]) of its own array, so the
    // gathered output must equal piece r of rank r's array at every offset.
    auto piece = [&](const auto& all, int r) {
      using T = typename std::decay_t<decltype(all)>::value_type;
      return std::vector<T>(all.begin() + offsets[r], all.begin() + offsets[r + 1]);
    };
    struct Out {
      std::vector<float> f;
      std::vector<uint16_t> bf16;
      std::vector<uint8_t> e4m3;
    };
    auto outs = on_ranks(size, [&](int r) {
      Out o{std::vector<float>(whole), std::vector<uint16_t>(whole), std::vector<uint8_t>(whole)};
      const std::vector<float> f = piece(data_of(r, whole), r);
      const std::vector<uint16_t> h = piece(codes_of<uint16_t>(r, whole), r);
      const std::vector<uint8_t> c = piece(codes_of<uint8_t>(r, whole), r);
      EXPECT_TRUE(groups[r]->all_gather(std::span<const float>(f), o.f, counts, "master").ok());
      EXPECT_TRUE(groups[r]->all_gather(std::span<const uint16_t>(h), o.bf16, counts, "bf16").ok());
      EXPECT_TRUE(groups[r]->all_gather(std::span<const uint8_t>(c), o.e4m3, counts, "codes").ok());
      return o;
    });
    Out want{std::vector<float>(whole), std::vector<uint16_t>(whole), std::vector<uint8_t>(whole)};
    for (int r = 0; r < size; ++r) {
      for (int64_t j = offsets[r]; j < offsets[r + 1]; ++j) {
        want.f[j] = data_of(r, whole)[j];
        want.bf16[j] = codes_of<uint16_t>(r, whole)[j];
        want.e4m3[j] = codes_of<uint8_t>(r, whole)[j];
      }
    }
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(std::memcmp(outs[r].f.data(), want.f.data(), whole * 4), 0) << "rank " << r;
      EXPECT_EQ(outs[r].bf16, want.bf16) << "rank " << r;
      EXPECT_EQ(outs[r].e4m3, want.e4m3) << "rank " << r;
    }
  }
}

// Bucketed reduce-scatter into block-aligned shards (BucketedAllReduce::begin_scatter): every
// rank's shard equals the rank-order sum bit for bit whatever the bucket size (buckets smaller
// than a shard, straddling shard ends, larger than the array), the buckets launched as a backward
// would report final gradients from the end; with 2 ranks it equals the bucketed all-reduce's
// values bit for bit.
TEST_P(PiecesTest, BucketedReduceScatterGivesEachRankItsShardWhateverTheBuckets) {
  const int size = GetParam();
  auto groups = make_group(size, absl::StrCat("brs", size));
  for (const auto& g : groups) ASSERT_TRUE(g);
  constexpr int64_t kN = 2049;
  ShardLayout layout;
  layout.bounds = size == 2   ? std::vector<int64_t>{0, 1280, kN}
                  : size == 3 ? std::vector<int64_t>{0, 700, 701, kN}
                              : std::vector<int64_t>{0, 0, 900, 1500, kN};  // rank 0 owns nothing
  for (int64_t bucket : {5, 64, 333, 2049, 5000}) {
    SCOPED_TRACE(absl::StrCat(size, " ranks, bucket ", bucket));
    auto shards = on_ranks(size, [&](int r) {
      const std::vector<float> grads = data_of(r, kN);
      std::vector<float> shard(static_cast<size_t>(layout.size(r)));
      BucketedAllReduce reducer(groups[r].get(), bucket);
      reducer.begin_scatter(grads, layout, shard, "grads");
      reducer.final_from(kN - 100);
      reducer.final_from(kN / 2);
      const absl::Status s = reducer.finish();
      EXPECT_TRUE(s.ok()) << s;
      return shard;
    });
    std::vector<std::vector<float>> data;
    for (int q = 0; q < size; ++q) data.push_back(data_of(q, kN));
    for (int r = 0; r < size; ++r) {
      for (int64_t j = layout.begin(r); j < layout.end(r); ++j) {
        float want = data[0][j];
        for (int q = 1; q < size; ++q) want += data[q][j];
        ASSERT_EQ(std::memcmp(&shards[r][j - layout.begin(r)], &want, 4), 0)
            << "rank " << r << " element " << j;
      }
    }
    if (size != 2) continue;
    auto reduced = on_ranks(size, [&](int r) {
      std::vector<float> grads = data_of(r, kN);
      BucketedAllReduce reducer(groups[r].get(), bucket);
      reducer.begin(grads, "grads");
      EXPECT_TRUE(reducer.finish().ok());
      return grads;
    });
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(std::memcmp(shards[r].data(), reduced[r].data() + layout.begin(r),
                            static_cast<size_t>(layout.size(r)) * 4),
                0);
    }
  }
}

TEST(BucketedReduceScatter, LayoutThatDoesNotFitIsInvalidOnEveryRank) {
  auto groups = make_group(2, "brs-bad");
  ASSERT_TRUE(groups[0] && groups[1]);
  ShardLayout layout;
  layout.bounds = {0, 10, 30};  // covers 30 elements; the array has 40
  auto statuses = on_ranks(2, [&](int r) {
    const std::vector<float> grads = data_of(r, 40);
    std::vector<float> shard(static_cast<size_t>(layout.size(r)));
    BucketedAllReduce reducer(groups[r].get(), 8);
    reducer.begin_scatter(grads, layout, shard, "grads");
    return reducer.finish();
  });
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("grads: the shard layout (2 ranks over 30 elements) does not fit"),
              std::string::npos)
        << s;
  }
  // Nothing was sent: the group still works.
  auto sums = on_ranks(2, [&](int r) {
    std::vector<float> v = {2.0f * static_cast<float>(r + 1)};
    EXPECT_TRUE(groups[r]->all_reduce(std::span<float>(v), ReduceOp::kSum, "after").ok());
    return v[0];
  });
  EXPECT_EQ(sums[1], 6.0f);
}

INSTANTIATE_TEST_SUITE_P(Ranks, PiecesTest, testing::Values(2, 3, 4));

TEST(GlooCollectives, TwoRankReduceScatterPlusAllGatherEqualsAllReduce) {
  auto groups = make_group(2, "rs-vs-ar");
  ASSERT_TRUE(groups[0] && groups[1]);
  const std::vector<int64_t> counts = {1234, 567};
  auto outs = on_ranks(2, [&](int r) {
    std::vector<float> reduced = data_of(r, 1801);
    EXPECT_TRUE(groups[r]->all_reduce(std::span<float>(reduced), ReduceOp::kSum, "ar").ok());
    const std::vector<float> in = data_of(r, 1801);
    std::vector<float> mine(static_cast<size_t>(counts[r])), gathered(1801);
    EXPECT_TRUE(groups[r]->reduce_scatter(in, mine, counts, "rs").ok());
    EXPECT_TRUE(groups[r]->all_gather(std::span<const float>(mine), gathered, counts, "ag").ok());
    return std::make_pair(reduced, gathered);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(std::memcmp(outs[r].first.data(), outs[r].second.data(), 1801 * 4), 0);
  }
}

TEST(GlooCollectives, PieceArgumentErrorsNameTheOperation) {
  auto groups = make_group(2, "bad-pieces");
  ASSERT_TRUE(groups[0] && groups[1]);
  std::vector<float> in(10, 1.0f), out(4);
  struct Case {
    std::vector<int64_t> counts;
    std::vector<float>* output;
    const char* message;
  };
  std::vector<float> out6(6);
  // Checked before anything is sent, so one rank alone sees them.
  const Case cases[] = {
      {{10}, &out, "grads: counts needs one entry per rank (2), got 1"},
      {{12, -2}, &out, "grads: counts[1] = -2 < 0"},
      {{4, 5}, &out, "grads: the whole array has 10 elements, counts sum to 9"},
      {{4, 6}, &out6, "grads: rank 0's piece has 6 elements, counts[0] = 4"},
  };
  for (const Case& c : cases) {
    const absl::Status s = groups[0]->reduce_scatter(in, *c.output, c.counts, "grads");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), c.message);
  }
  std::vector<uint8_t> codes(3), all(10);
  const absl::Status s =
      groups[1]->all_gather(std::span<const uint8_t>(codes), all, Counts{4, 6}, "codes");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "codes: rank 1's piece has 3 elements, counts[1] = 6");
  // The group is still usable after argument errors.
  auto sums = on_ranks(2, [&](int r) {
    std::vector<float> v = {1.0f + static_cast<float>(r)};
    EXPECT_TRUE(groups[r]->all_reduce(std::span<float>(v), ReduceOp::kSum, "after").ok());
    return v[0];
  });
  EXPECT_EQ(sums[0], 3.0f);
}

TEST(GlooCollectives, PeerMissingFromAReduceScatterTimesOutNamingIt) {
  auto groups = make_group(2, "rs-hung", 800);
  ASSERT_TRUE(groups[0] && groups[1]);
  const std::vector<float> in = data_of(0, 300);
  std::vector<float> out(100);
  const absl::Status s =
      groups[0]->reduce_scatter(in, out, Counts{100, 200}, "grads reduce-scatter");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("grads reduce-scatter failed on rank 0 of 2"), std::string::npos) << s;
  std::vector<float> all(300);
  const absl::Status again = groups[0]->all_gather(std::span<const float>(out), all,
                                                   Counts{100, 200}, "weights all-gather");
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_NE(again.message().find("weights all-gather"), std::string::npos) << again;
}

TEST(GlooCollectives, PeerMissingFromAnAllGatherTimesOut) {
  auto groups = make_group(3, "ag-hung", 800);
  ASSERT_TRUE(groups[0] && groups[1] && groups[2]);
  const std::vector<uint16_t> mine = codes_of<uint16_t>(2, 5);
  std::vector<uint16_t> all(15);
  const absl::Status s = groups[2]->all_gather(std::span<const uint16_t>(mine), all,
                                               Counts{5, 5, 5}, "bf16 all-gather");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("bf16 all-gather failed on rank 2 of 3"), std::string::npos) << s;
}

TEST(GlooCollectives, StatsCountReduceScatterInputAndAllGatherOutputBytes) {
  auto groups = make_group(3, "rs-stats");
  for (const auto& g : groups) ASSERT_TRUE(g);
  const std::vector<int64_t> counts = {3, 4, 5};
  on_ranks(3, [&](int r) {
    const std::vector<float> in = data_of(r, 12);
    std::vector<float> out(static_cast<size_t>(counts[r]));
    EXPECT_TRUE(groups[r]->reduce_scatter(in, out, counts, "rs").ok());
    std::vector<uint8_t> codes(static_cast<size_t>(counts[r]), 9), all(12);
    EXPECT_TRUE(groups[r]->all_gather(std::span<const uint8_t>(codes), all, counts, "ag").ok());
    return 0;
  });
  EXPECT_EQ(groups[1]->stats().calls, 2);
  EXPECT_EQ(groups[1]->stats().bytes, 12 * 4 + 12);
}

TEST(SingleRankCollectives, PiecesAreTheWholeArray) {
  std::unique_ptr<Collectives> one = make_single_rank_collectives();
  const std::vector<float> in = data_of(0, 33);
  std::vector<float> out(33);
  ASSERT_TRUE(one->reduce_scatter(in, out, Counts{33}, "rs").ok());
  EXPECT_EQ(out, in);
  std::vector<uint8_t> codes = codes_of<uint8_t>(0, 9), all(9);
  ASSERT_TRUE(one->all_gather(std::span<const uint8_t>(codes), all, Counts{9}, "ag").ok());
  EXPECT_EQ(all, codes);
  const absl::Status s = one->reduce_scatter(in, out, Counts{32}, "rs");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace fp8rl::train
