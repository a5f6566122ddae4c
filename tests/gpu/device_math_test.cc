// The shared host/device math (kernels/device_math) and the CPU reference of the CUDA decoder
// kernels (kernels/cpu/decoder_ops) against the model's own CPU reference (model/ops.cc,
// model/sampler.cc, model/kv_cache.cc, kernels/formats.h): bit for bit, on random non-zero data
// with odd shapes. Runs everywhere (no GPU involved): this is what ties the GPU tests, which
// compare kernels with kernels/cpu/decoder_ops, to the recipe the model computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/decoder_ops.h"
#include "kernels/device_math/attention_split.h"
#include "kernels/device_math/hd.h"
#include "kernels/device_math/sampling_blocked.h"
#include "kernels/formats.h"
#include "model/kv_cache.h"
#include "model/ops.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace fp8rl::kernels {
namespace {

std::vector<float> random_vec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) {
    v = normal(gen);
    if (v == 0.0f) v = 0.25f * scale;
  }
  return x;
}

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want,
                       const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << " at " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(DeviceMathTest, Bf16AndE4m3MatchFormats) {
  for (int c = 0; c < 256; ++c) {
    const float a = dm::e4m3_to_float(static_cast<uint8_t>(c));
    const float b = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << c;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)) << c;
    }
  }
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns cover every exponent, subnormals, infinities and NaNs.
    const float x = std::bit_cast<float>(bits(gen));
    ASSERT_EQ(dm::float_to_e4m3(x), float_to_e4m3(x)) << x;
    ASSERT_EQ(dm::float_to_bf16(x), float_to_bf16(x)) << x;
    if (!std::isnan(x)) {
      ASSERT_EQ(std::bit_cast<uint32_t>(dm::round_bf16(x)), std::bit_cast<uint32_t>(round_bf16(x)));
    }
  }
}

TEST(DeviceMathTest, RmsnormMatchesModelOps) {
  for (auto [rows, h] : {std::pair<int64_t, int64_t>{3, 37}, {5, 128}, {2, 1000}}) {
    const auto x = random_vec(rows * h, 1 + h, 3.0f);
    const auto g = random_vec(h, 2 + h);
    for (bool bf16 : {false, true}) {
      std::vector<float> y(rows * h), inv(rows), y_ref(rows * h), inv_ref(rows);
      cpu::rmsnorm(x.data(), g.data(), rows, h, 1e-5f, bf16, y.data(), inv.data());
      model::ops::rmsnorm_forward(x.data(), g.data(), rows, h, 1e-5f, y_ref.data(), inv_ref.data());
      if (bf16) model::ops::round_bf16_inplace(y_ref.data(), rows * h);
      expect_bits_equal(y, y_ref, "rmsnorm y");
      expect_bits_equal(inv, inv_ref, "rmsnorm inv_rms");
    }
  }
}

TEST(DeviceMathTest, RopeMatchesModelOps) {
  const int64_t rows = 7, heads = 3, hd = 18, max_pos = 50;
  std::vector<float> cos(max_pos * hd / 2), sin(max_pos * hd / 2);
  model::ops::rope_fill(model::ops::rope_inv_freq(500000.0, hd, model::RopeScaling{}), max_pos,
                        cos.data(), sin.data());
  const std::vector<int32_t> pos = {0, 1, 2, 49, 17, 33, 5};
  const auto x = random_vec(rows * heads * hd, 11);
  for (bool bf16 : {false, true}) {
    std::vector<float> a = x, b = x;
    cpu::rope(cos.data(), sin.data(), pos.data(), rows, heads, hd, bf16, a.data());
    const model::ops::RopeTable t{hd / 2, max_pos, cos.data(), sin.data()};
    model::ops::rope_apply(t, pos.data(), rows, heads, hd, b.data(), false);
    if (bf16) model::ops::round_bf16_inplace(b.data(), rows * heads * hd);
    expect_bits_equal(a, b, "rope");
  }
}

TEST(DeviceMathTest, SwigluMatchesModelOps) {
  const int64_t n = 1001;
  const auto g = random_vec(n, 21, 4.0f), u = random_vec(n, 22);
  for (bool bf16 : {false, true}) {
    std::vector<float> a(n), b(n);
    cpu::swiglu(g.data(), u.data(), n, bf16, a.data());
    model::ops::swiglu_forward(g.data(), u.data(), n, b.data());
    if (bf16) model::ops::round_bf16_inplace(b.data(), n);
    expect_bits_equal(a, b, "swiglu");
  }
}

TEST(DeviceMathTest, EmbedGatherCopiesRowsAndCountsBadIds) {
  const int64_t vocab = 11, h = 9;
  const auto table = random_vec(vocab * h, 31);
  const std::vector<int32_t> tokens = {3, 0, 10, -1, 11, 3};
  std::vector<float> x(tokens.size() * h);
  EXPECT_EQ(cpu::embed_gather(table.data(), vocab, h, tokens.data(), 6, x.data()), 2);
  for (int64_t i = 0; i < h; ++i) {
    EXPECT_EQ(x[0 * h + i], table[3 * h + i]);
    EXPECT_EQ(x[2 * h + i], table[10 * h + i]);
    EXPECT_TRUE(std::isnan(x[3 * h + i]));
    EXPECT_TRUE(std::isnan(x[4 * h + i]));
  }
}

TEST(DeviceMathTest, PrefillAttentionMatchesModelOpsCausalGqa) {
  const int64_t n_heads = 6, n_kv = 2, hd = 20, group = n_heads / n_kv;
  const std::vector<int32_t> seq_start = {0, 5, 6, 19};  // lengths 5, 1, 13
  const int64_t rows = 19, qd = n_heads * hd, kvd = n_kv * hd;
  const auto q = random_vec(rows * qd, 41), k = random_vec(rows * kvd, 42),
             v = random_vec(rows * kvd, 43);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> out(rows * qd), ref(rows * qd), scores(rows);
  cpu::attention_prefill(q.data(), k.data(), v.data(), seq_start.data(), 3, n_heads, n_kv, hd,
                         scale, out.data());
  for (int64_t s = 0; s < 3; ++s) {
    for (int64_t r = seq_start[s]; r < seq_start[s + 1]; ++r) {
      for (int64_t hh = 0; hh < n_heads; ++hh) {
        const int64_t g = hh / group, r0 = seq_start[s];
        model::ops::attend_row(q.data() + r * qd + hh * hd, k.data() + r0 * kvd + g * hd, kvd,
                               v.data() + r0 * kvd + g * hd, kvd, r - r0 + 1, hd, scale,
                               scores.data(), ref.data() + r * qd + hh * hd);
      }
    }
  }
  expect_bits_equal(out, ref, "prefill attention");
}

// The paged cache (shuffled blocks, odd block size) against contiguous K/V passed through the
// cache format's round trip (model::kv_round_trip, what the training forward applies) +
// attend_row, for every KV dtype: the same attention output, bit for bit.
TEST(DeviceMathTest, PagedKvWriteAndAttentionMatchTheRoundTrip) {
  const int64_t n_heads = 4, n_kv = 2, hd = 24, group = n_heads / n_kv, block = 3;
  const std::vector<int64_t> lens = {7, 1, 10};
  const int64_t n_seq = 3, max_blocks = 4, num_blocks = n_seq * max_blocks;
  std::vector<int32_t> table(n_seq * max_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));
  const int64_t qd = n_heads * hd, kvd = n_kv * hd;
  std::vector<int32_t> row_seq, row_pos;
  for (int64_t s = 0; s < n_seq; ++s) {
    for (int64_t p = 0; p < lens[s]; ++p) {
      row_seq.push_back(static_cast<int32_t>(s));
      row_pos.push_back(static_cast<int32_t>(p));
    }
  }
  const int64_t rows = static_cast<int64_t>(row_seq.size());
  const auto q = random_vec(rows * qd, 51), k = random_vec(rows * kvd, 52, 2.0f),
             v = random_vec(rows * kvd, 53, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float k_scale = 0.0131f, v_scale = 0.0097f;
  for (auto [dtype, mdtype] : {std::pair{dm::KvDtype::kF32, model::KvCacheDtype::kF32},
                               {dm::KvDtype::kBF16, model::KvCacheDtype::kBF16},
                               {dm::KvDtype::kFP8, model::KvCacheDtype::kFP8}}) {
    const int64_t bytes = num_blocks * block * kvd * dm::kv_elem_bytes(dtype);
    std::vector<uint8_t> kpool(bytes), vpool(bytes);
    dm::PagedKvView kv{kpool.data(), vpool.data(), dtype,      num_blocks, block,  n_kv,
                       hd,           table.data(), max_blocks, k_scale,    v_scale};
    cpu::kv_write_paged(k.data(), v.data(), rows, row_seq.data(), row_pos.data(), kv);
    std::vector<float> out(rows * qd);
    cpu::attention_paged(q.data(), rows, row_seq.data(), row_pos.data(), kv, n_heads, scale,
                         out.data());

    std::vector<float> ref(rows * qd), scores(10);
    std::vector<float> kr = k, vr = v;  // [rows, kv_heads * hd], through the cache format
    model::kv_round_trip(mdtype, kr.data(), rows * kvd, k_scale);
    model::kv_round_trip(mdtype, vr.data(), rows * kvd, v_scale);
    for (int64_t r = 0, s = 0; s < n_seq; ++s) {
      for (int64_t g = 0; g < n_kv; ++g) {
        const float* kp = kr.data() + r * kvd + g * hd;
        const float* vp = vr.data() + r * kvd + g * hd;
        for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
          for (int64_t p = 0; p < lens[s]; ++p) {
            model::ops::attend_row(q.data() + (r + p) * qd + hh * hd, kp, kvd, vp, kvd, p + 1, hd,
                                   scale, scores.data(), ref.data() + (r + p) * qd + hh * hd);
          }
        }
      }
      r += lens[s];
    }
    expect_bits_equal(out, ref, model::kv_cache_dtype_name(mdtype).data());
  }
}

// The split-context decode order (dm::attend_row_split, the CUDA decode kernel's) against the
// serial attend_row over the paged cache, every KV dtype, contexts around the 32-position tile and
// the 8-stripe wrap (256): not bit for bit (fp32 sums reordered and rescaled), within
// kSplitVsSerialAttentionRel of the row's largest output. A context of one position is exact
// (both give v_0 times 1).
TEST(DeviceMathTest, SplitAttentionMatchesSerialWithinTolerance) {
  // Reordering n fp32 terms moves a sum by ~sqrt(n) ulp in practice; the rescale factors
  // exp(m - m') add one rounding per tile. 2e-5 of the largest output is ~160 ulp at 2^-7..1.
  constexpr double kSplitVsSerialAttentionRel = 2e-5;
  const int64_t n_heads = 4, n_kv = 2, hd = 40, block = 16;
  const std::vector<int64_t> lens = {1, 31, 32, 33, 255, 256, 257, 700};
  const int64_t n_seq = static_cast<int64_t>(lens.size()), max_blocks = 44;
  const int64_t num_blocks = n_seq * max_blocks, kvd = n_kv * hd, qd = n_heads * hd;
  std::vector<int32_t> table(n_seq * max_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(6));
  std::vector<int32_t> row_seq, row_pos, q_seq, q_pos;
  for (int64_t s = 0; s < n_seq; ++s) {
    for (int64_t p = 0; p < lens[s]; ++p) {
      row_seq.push_back(static_cast<int32_t>(s));
      row_pos.push_back(static_cast<int32_t>(p));
    }
    for (int64_t p : {int64_t{0}, lens[s] / 2, lens[s] - 1}) {  // decode rows at a few positions
      q_seq.push_back(static_cast<int32_t>(s));
      q_pos.push_back(static_cast<int32_t>(p));
    }
  }
  const int64_t rows = static_cast<int64_t>(row_seq.size());
  const int64_t qrows = static_cast<int64_t>(q_seq.size());
  const auto k = random_vec(rows * kvd, 54, 2.0f), v = random_vec(rows * kvd, 55, 2.0f);
  const auto q = random_vec(qrows * qd, 56);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (dm::KvDtype dtype : {dm::KvDtype::kF32, dm::KvDtype::kBF16, dm::KvDtype::kFP8}) {
    const int64_t bytes = num_blocks * block * kvd * dm::kv_elem_bytes(dtype);
    std::vector<uint8_t> kpool(bytes), vpool(bytes);
    dm::PagedKvView kv{kpool.data(), vpool.data(), dtype,      num_blocks, block,  n_kv,
                       hd,           table.data(), max_blocks, 0.0131f,    0.0097f};
    cpu::kv_write_paged(k.data(), v.data(), rows, row_seq.data(), row_pos.data(), kv);
    std::vector<float> serial(qrows * qd), split(qrows * qd);
    cpu::attention_paged(q.data(), qrows, q_seq.data(), q_pos.data(), kv, n_heads, scale,
                         serial.data());
    cpu::attention_paged_split(q.data(), qrows, q_seq.data(), q_pos.data(), kv, n_heads, scale,
                               split.data());
    double worst = 0;
    for (int64_t r = 0; r < qrows; ++r) {
      const float* a = split.data() + r * qd;
      const float* b = serial.data() + r * qd;
      double max_ref = 0;
      for (int64_t i = 0; i < qd; ++i) max_ref = std::max(max_ref, std::fabs(double(b[i])));
      for (int64_t i = 0; i < qd; ++i) {
        const double err = std::fabs(double(a[i]) - double(b[i]));
        worst = std::max(worst, err / (kSplitVsSerialAttentionRel * max_ref));
        if (q_pos[r] == 0) {
          ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i]))
              << "one position, row " << r << " at " << i;
        }
        ASSERT_LE(err, kSplitVsSerialAttentionRel * max_ref)
            << "dtype " << int(dtype) << " row " << r << " (position " << q_pos[r] << ") at " << i;
      }
    }
    std::printf("[ split attention dtype %d: worst error %.3f of its bound ]\n", int(dtype), worst);
  }
}

// Prefill (contiguous k, v) and paged decode in the split order are one function: for the same
// q, k, v (an fp32 cache) every row's output is bit-identical, so on the device the learner's
// prefill and the sampler's decode agree as attend_row's prefill and decode do. Against the
// serial prefill: kSplitVsSerialAttentionRel, as above.
TEST(DeviceMathTest, SplitPrefillEqualsSplitPagedAndNearSerial) {
  constexpr double kSplitVsSerialAttentionRel = 2e-5;
  const int64_t n_heads = 6, n_kv = 2, hd = 32, block = 8;
  const std::vector<int32_t> seq_start = {0, 1, 34, 334};  // lengths 1, 33, 300
  const int64_t n_seq = 3, rows = 334, qd = n_heads * hd, kvd = n_kv * hd, max_blocks = 38;
  const auto q = random_vec(rows * qd, 81), k = random_vec(rows * kvd, 82),
             v = random_vec(rows * kvd, 83);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> split(rows * qd), serial(rows * qd), paged(rows * qd);
  cpu::attention_prefill_split(q.data(), k.data(), v.data(), seq_start.data(), n_seq, n_heads, n_kv,
                               hd, scale, split.data());
  cpu::attention_prefill(q.data(), k.data(), v.data(), seq_start.data(), n_seq, n_heads, n_kv, hd,
                         scale, serial.data());
  std::vector<int32_t> table(n_seq * max_blocks), row_seq(rows), row_pos(rows);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(8));
  for (int64_t s = 0; s < n_seq; ++s) {
    for (int64_t r = seq_start[s]; r < seq_start[s + 1]; ++r) {
      row_seq[r] = static_cast<int32_t>(s);
      row_pos[r] = static_cast<int32_t>(r - seq_start[s]);
    }
  }
  std::vector<float> kpool(n_seq * max_blocks * block * kvd), vpool(kpool.size());
  dm::PagedKvView kv{kpool.data(), vpool.data(), dm::KvDtype::kF32, n_seq * max_blocks, block,
                     n_kv,         hd,           table.data(),      max_blocks,         1.0f,
                     1.0f};
  cpu::kv_write_paged(k.data(), v.data(), rows, row_seq.data(), row_pos.data(), kv);
  cpu::attention_paged_split(q.data(), rows, row_seq.data(), row_pos.data(), kv, n_heads, scale,
                             paged.data());
  expect_bits_equal(split, paged, "split prefill vs split paged");
  double max_ref = 0;
  for (float x : serial) max_ref = std::max(max_ref, std::fabs(double(x)));
  for (size_t i = 0; i < serial.size(); ++i) {
    ASSERT_LE(std::fabs(double(split[i]) - double(serial[i])), kSplitVsSerialAttentionRel * max_ref)
        << i;
  }
}

// tree_sum32 is the xor butterfly: with one non-zero term the sum is that term, and it adds
// pairs at distance 16 first.
TEST(DeviceMathTest, TreeSum32IsTheButterfly) {
  float v[32] = {};
  v[7] = 3.5f;
  EXPECT_EQ(dm::tree_sum32<float>(v), 3.5f);
  for (int i = 0; i < 32; ++i) v[i] = 0.0f;
  v[0] = 1.0f;
  v[8] = v[16] = v[24] = 0x1.0p-24f;
  // Butterfly: (1 + 2^-24) rounds to 1, (2^-24 + 2^-24) = 2^-23, 1 + 2^-23 is exact. In index
  // order every 2^-24 would be lost against 1.
  EXPECT_EQ(dm::tree_sum32<float>(v), 1.0f + 0x1.0p-23f);
}

TEST(DeviceMathTest, LogSoftmaxMatchesModelOps) {
  const int64_t rows = 3, vocab = 1013;
  const auto z = random_vec(rows * vocab, 61, 5.0f);
  const std::vector<int32_t> targets = {0, 512, 1012};
  for (float inv_t : {1.0f, 1.0f / 0.7f}) {
    std::vector<float> lse(rows), lp(rows);
    cpu::log_softmax(z.data(), rows, vocab, inv_t, targets.data(), lse.data(), lp.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float ref = model::ops::logsumexp_scaled(z.data() + r * vocab, vocab, inv_t);
      EXPECT_EQ(std::bit_cast<uint32_t>(lse[r]), std::bit_cast<uint32_t>(ref)) << r;
      EXPECT_EQ(lp[r], z[r * vocab + targets[r]] * inv_t - ref) << r;
    }
  }
}

// The block-parallel order of log-sum-exp (the CUDA block kernels') against the serial one:
// float64 sums in another order, so the fp32 lse is the same except when log(sum) lies within a
// float64 rounding of an fp32 rounding boundary; at most one fp32 ulp apart in any case.
TEST(DeviceMathTest, LogSumExpBlockedMatchesSerial) {
  int64_t rows = 0, equal = 0;
  for (int64_t vocab : {1, 7, 255, 256, 257, 1013, 32011}) {
    const auto z = random_vec(20 * vocab, 62 + uint32_t(vocab), 5.0f);
    for (int64_t r = 0; r < 20; ++r) {
      for (float inv_t : {1.0f, 1.0f / 0.7f}) {
        const float a = dm::logsumexp_scaled_blocked(z.data() + r * vocab, vocab, inv_t);
        const float b = dm::logsumexp_scaled(z.data() + r * vocab, vocab, inv_t);
        ASSERT_LE(std::fabs(double(a) - double(b)), std::fabs(std::nextafter(b, INFINITY) - b))
            << "vocab " << vocab << " row " << r;
        ++rows;
        equal += std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
      }
    }
  }
  std::printf("[ blocked lse: %ld of %ld rows bit-equal to the serial lse ]\n", long(equal),
              long(rows));
  EXPECT_GE(equal, rows * 99 / 100);
}

// The block-parallel sampling order against sample_row, every mode and vocabularies smaller than,
// equal to and larger than the 256 chunks (empty chunks, partial last chunk): the same tokens,
// logprobs within one fp32 ulp of lse, the same stream positions.
TEST(DeviceMathTest, SamplingBlockedMatchesSerial) {
  struct Mode {
    float t, p;
    int64_t k;
  };
  for (int64_t vocab : {5, 100, 256, 517, 4099}) {
    auto z = random_vec(vocab, 72 + uint32_t(vocab), 3.0f);
    z[vocab / 2] = z[vocab - 1] = 9.0f;  // a tie at the top
    for (Mode m : {Mode{0.0f, 1.0f, 0}, Mode{1.0f, 1.0f, 0}, Mode{0.7f, 1.0f, 0},
                   Mode{0.8f, 0.9f, 0}, Mode{1.3f, 1.0f, 5}}) {
      const dm::SampleParams dp{m.t, m.p, m.k};
      dm::RngState a = dm::rng_seed(99), b = dm::rng_seed(99);
      std::vector<int32_t> sa(vocab), sb(vocab);
      for (int i = 0; i < 300; ++i) {
        const dm::SampleResult x = dm::sample_row_blocked(z.data(), vocab, dp, a, sa.data());
        const dm::SampleResult y = dm::sample_row(z.data(), vocab, dp, b, sb.data());
        ASSERT_EQ(x.token, y.token) << "vocab " << vocab << " T=" << m.t << " draw " << i;
        const double ulp = 1e-6 * std::max(1.0, std::fabs(double(y.full_logprob)));
        ASSERT_NEAR(x.logprob, y.logprob, ulp) << "draw " << i;
        ASSERT_NEAR(x.full_logprob, y.full_logprob, ulp) << "draw " << i;
      }
      ASSERT_EQ(dm::rng_next(a), dm::rng_next(b)) << "the streams advanced differently";
    }
  }
}

TEST(DeviceMathTest, RngMatchesModelRng) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, model::derive_seed(7, 3)}) {
    model::Rng ref(seed);
    dm::RngState st = dm::rng_seed(seed);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(dm::rng_next(st), ref.next()) << seed << " " << i;
    EXPECT_EQ(dm::rng_uniform(st), ref.uniform());
  }
}

// Every sampling mode, many draws per mode: same tokens, same logprobs, same stream position as
// model::Sampler.
TEST(DeviceMathTest, SamplingMatchesModelSampler) {
  const int64_t vocab = 517;
  auto z = random_vec(vocab, 71, 3.0f);
  z[100] = z[200] = z[300] = 9.0f;  // ties at the top exercise the id tie-break
  struct Mode {
    float t, p;
    int64_t k;
  };
  for (Mode m : {Mode{0.0f, 1.0f, 0}, Mode{1.0f, 1.0f, 0}, Mode{0.8f, 0.9f, 0}, Mode{1.3f, 1.0f, 5},
                 Mode{0.6f, 0.5f, 20}, Mode{1.0f, 0.05f, 0}, Mode{1.0f, 1.0f, vocab + 3}}) {
    model::SamplingParams mp;
    mp.temperature = m.t;
    mp.top_p = m.p;
    mp.top_k = m.k;
    const dm::SampleParams dp{m.t, m.p, m.k};
    model::Sampler sampler;
    model::Rng rng(1234);
    dm::RngState st = dm::rng_seed(1234);
    std::vector<int32_t> scratch(vocab);
    for (int i = 0; i < 300; ++i) {
      float lp = 0, full = 0;
      const int32_t tok = sampler.sample(z.data(), vocab, mp, rng, &lp, &full);
      dm::SampleResult res;
      cpu::sample(z.data(), 1, vocab, &dp, &st, scratch.data(), &res);
      ASSERT_EQ(res.token, tok) << "T=" << m.t << " p=" << m.p << " k=" << m.k << " draw " << i;
      ASSERT_EQ(res.logprob, lp) << "draw " << i;
      ASSERT_EQ(res.full_logprob, full) << "draw " << i;
    }
    EXPECT_EQ(dm::rng_next(st), rng.next()) << "the streams advanced differently";
  }
}

}  // namespace
}  // namespace fp8rl::kernels
