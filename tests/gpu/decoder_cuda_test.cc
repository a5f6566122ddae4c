// The CUDA decoder kernels (kernels/cuda/decoder_cuda.h) against their CPU reference
// (kernels/cpu/decoder_ops.h, itself tied to model/ops.cc by device_math_test.cc) on random
// non-zero data with odd shapes. Needs an sm_90 device (skips otherwise), except the argument
// checks, which run everywhere.
#include "kernels/cuda/decoder_cuda.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/decoder_ops.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/device_math/sampling_blocked.h"
#include "model/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace fp8rl::kernels::cuda {
namespace {

using testing::to_device;
using testing::to_host;

// Tolerances, with their reasons. Ops without exp/log must match bit for bit (same shared math,
// no FMA contraction, IEEE sqrt and division on both sides). Ops with exp differ because CUDA's
// expf (<= 2 ulp) and glibc's expf (< 1 ulp) round differently:
//   kExpElementwiseRel  one exp per value, then a division and two products: ~4 fp32 ulp.
//   kExpReductionRel    attention: each softmax weight carries the error of one exp and of the
//                       sum of all of them; relative to the row's largest output.
//   kLseAbs             log-sum-exp sums exp in float64 on both sides; only the final fp32
//                       rounding of log(sum) can differ: one ulp of the result.
//   kBf16FlipRel        after a bf16 rounding, a few-ulp fp32 difference flips the result by at
//                       most one bf16 ulp (up to 2^-7 of the value) when it straddles a rounding
//                       boundary.
constexpr double kExpElementwiseRel = 1e-6;
constexpr double kExpReductionRel = 2e-5;
constexpr double kLseAbs = 4e-6;
constexpr double kBf16FlipRel = 1.0 / 128.0;

class GpuDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override { FP8RL_REQUIRE_SM90(); }
};

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

void expect_same(const std::vector<float>& gpu, const std::vector<float>& cpu,
                 const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(testing::same_float(gpu[i], cpu[i]))
        << what << " at " << i << ": gpu " << gpu[i] << " cpu " << cpu[i];
  }
}

// Every |gpu - cpu| <= rel * |cpu| (elementwise) or rel * max|cpu| (row_scale).
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                  bool relative_to_max, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double max_ref = 0, worst = 0;
  for (float v : cpu) max_ref = std::max(max_ref, std::fabs(double(v)));
  ASSERT_GT(max_ref, 0.0) << what << ": all-zero reference";
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double err = std::fabs(double(gpu[i]) - double(cpu[i]));
    const double bound = rel * (relative_to_max ? max_ref : std::fabs(double(cpu[i]))) + 1e-30;
    worst = std::max(worst, err / bound);
    ASSERT_LE(err, bound) << what << " at " << i << ": gpu " << gpu[i] << " cpu " << cpu[i];
  }
  std::printf("[ decoder %s: worst error %.3f of its bound ]\n", what.c_str(), worst);
}

TEST_F(GpuDecoderTest, EmbedGatherMatchesCpuAndCountsBadIds) {
  const int64_t vocab = 53, h = 37;
  const auto table = random_vec(vocab * h, 1);
  const std::vector<int32_t> tokens = {5, 0, 52, 53, -7, 5, 17};
  const int64_t rows = static_cast<int64_t>(tokens.size());
  DeviceBuffer dt = to_device(table), dtok = to_device(tokens),
               dbad = to_device(std::vector<int32_t>{0});
  absl::StatusOr<DeviceBuffer> dx = DeviceBuffer::allocate(sizeof(float) * rows * h);
  ASSERT_TRUE(dx.ok());
  FP8RL_ASSERT_OK(embed_gather(dt.as<float>(), vocab, h, dtok.as<int32_t>(), rows, dx->as<float>(),
                               dbad.as<int32_t>(), nullptr));
  std::vector<float> cpu(rows * h);
  const int64_t bad = cpu::embed_gather(table.data(), vocab, h, tokens.data(), rows, cpu.data());
  expect_same(to_host<float>(*dx, rows * h), cpu, "embed_gather");
  EXPECT_EQ(to_host<int32_t>(dbad, 1)[0], bad);
  EXPECT_EQ(bad, 2);
}

TEST_F(GpuDecoderTest, RmsnormMatchesCpuBitExact) {
  for (auto [rows, h] : {std::pair<int64_t, int64_t>{1, 8}, {7, 37}, {33, 1000}, {4, 4096}}) {
    const auto x = random_vec(rows * h, 10 + h, 3.0f), g = random_vec(h, 11 + h);
    DeviceBuffer dx = to_device(x), dg = to_device(g);
    for (bool bf16 : {false, true}) {
      absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::allocate(sizeof(float) * rows * h);
      absl::StatusOr<DeviceBuffer> dinv = DeviceBuffer::allocate(sizeof(float) * rows);
      ASSERT_TRUE(dy.ok() && dinv.ok());
      FP8RL_ASSERT_OK(rmsnorm(dx.as<float>(), dg.as<float>(), rows, h, 1e-5f, bf16, dy->as<float>(),
                              dinv->as<float>(), nullptr));
      std::vector<float> y(rows * h), inv(rows);
      cpu::rmsnorm(x.data(), g.data(), rows, h, 1e-5f, bf16, y.data(), inv.data());
      const std::string what = "rmsnorm [" + std::to_string(rows) + ", " + std::to_string(h) + "]" +
                               (bf16 ? " bf16" : "");
      expect_same(to_host<float>(*dy, rows * h), y, what);
      expect_same(to_host<float>(*dinv, rows), inv, what + " inv_rms");
    }
  }
}

TEST_F(GpuDecoderTest, RopeMatchesCpuBitExact) {
  const int64_t rows = 11, heads = 5, hd = 18, max_pos = 300;
  std::vector<float> cos(max_pos * hd / 2), sin(max_pos * hd / 2);
  model::ops::rope_fill(model::ops::rope_inv_freq(500000.0, hd, model::RopeScaling{}), max_pos,
                        cos.data(), sin.data());
  std::vector<int32_t> pos(rows);
  for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>((r * 37) % max_pos);
  const auto x = random_vec(rows * heads * hd, 20);
  DeviceBuffer dcos = to_device(cos), dsin = to_device(sin), dpos = to_device(pos);
  for (bool bf16 : {false, true}) {
    DeviceBuffer dx = to_device(x);
    FP8RL_ASSERT_OK(rope(dcos.as<float>(), dsin.as<float>(), dpos.as<int32_t>(), rows, heads, hd,
                         bf16, dx.as<float>(), nullptr));
    std::vector<float> ref = x;
    cpu::rope(cos.data(), sin.data(), pos.data(), rows, heads, hd, bf16, ref.data());
    expect_same(to_host<float>(dx, x.size()), ref, bf16 ? "rope bf16" : "rope");
  }
}

TEST_F(GpuDecoderTest, SwigluMatchesCpu) {
  const int64_t n = 12345;
  const auto g = random_vec(n, 30, 4.0f), u = random_vec(n, 31);
  DeviceBuffer dg = to_device(g), du = to_device(u);
  absl::StatusOr<DeviceBuffer> da = DeviceBuffer::allocate(sizeof(float) * n);
  ASSERT_TRUE(da.ok());
  for (bool bf16 : {false, true}) {
    FP8RL_ASSERT_OK(swiglu(dg.as<float>(), du.as<float>(), n, bf16, da->as<float>(), nullptr));
    std::vector<float> ref(n);
    cpu::swiglu(g.data(), u.data(), n, bf16, ref.data());
    expect_close(to_host<float>(*da, n), ref, bf16 ? kBf16FlipRel : kExpElementwiseRel, false,
                 bf16 ? "swiglu bf16" : "swiglu");
  }
}

// Both prefill kernels against the CPU reference of their order (simple: attend_row; tiled:
// dm::attend_row_split), head_dim 40 and 128, 4-row query tiles inside one sequence, straddling
// two or three, and a partial last tile; the tiled prefill also bit for bit against the split
// paged kernel over an fp32 cache holding the same k, v (the same operations per row: the
// learner's prefill and the sampler's decode agree exactly on the device).
TEST_F(GpuDecoderTest, PrefillAttentionMatchesCpuCausalGqa) {
  for (int64_t hd : {int64_t{40}, int64_t{128}}) {
    const int64_t n_heads = 8, n_kv = 2;
    const std::vector<int32_t> seq_start = {0, 1, 18, 19, 83, 383};  // lengths 1, 17, 1, 64, 300
    const int64_t n_seq = 5, rows = 383, qd = n_heads * hd, kvd = n_kv * hd;
    const auto q = random_vec(rows * qd, 40), k = random_vec(rows * kvd, 41),
               v = random_vec(rows * kvd, 42);
    const float scale = 1.0f / std::sqrt(float(hd));
    DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), ds = to_device(seq_start);
    ASSERT_TRUE(attention_prefill_uses_split(dk.as<float>(), dv.as<float>(), rows, n_heads, hd,
                                             DecoderKernels::kFast));
    std::vector<float> split_out;
    for (DecoderKernels kernels : {DecoderKernels::kSimple, DecoderKernels::kFast}) {
      const bool split = kernels == DecoderKernels::kFast;
      const std::string what = std::string("prefill attention hd ") + std::to_string(hd) +
                               (split ? " tiled kernel" : " simple kernel");
      absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::allocate(sizeof(float) * rows * qd);
      ASSERT_TRUE(dout.ok());
      FP8RL_ASSERT_OK(attention_prefill(dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                        ds.as<int32_t>(), n_seq, rows, n_heads, n_kv, hd, scale,
                                        dout->as<float>(), nullptr, kernels));
      std::vector<float> ref(rows * qd);
      if (split) {
        cpu::attention_prefill_split(q.data(), k.data(), v.data(), seq_start.data(), n_seq, n_heads,
                                     n_kv, hd, scale, ref.data());
      } else {
        cpu::attention_prefill(q.data(), k.data(), v.data(), seq_start.data(), n_seq, n_heads, n_kv,
                               hd, scale, ref.data());
      }
      std::vector<float> got = to_host<float>(*dout, rows * qd);
      expect_close(got, ref, kExpReductionRel, true, what);
      if (split) split_out = std::move(got);
    }

    // The same k, v in an fp32 paged cache (one block per 16 positions, in order).
    const int64_t block = 16, max_blocks = 19, num_blocks = n_seq * max_blocks;
    std::vector<int32_t> table(num_blocks), row_seq(rows), row_pos(rows);
    std::iota(table.begin(), table.end(), 0);
    for (int64_t s = 0; s < n_seq; ++s) {
      for (int64_t r = seq_start[s]; r < seq_start[s + 1]; ++r) {
        row_seq[r] = int32_t(s);
        row_pos[r] = int32_t(r - seq_start[s]);
      }
    }
    DeviceBuffer dt = to_device(table), dseq = to_device(row_seq), dpos = to_device(row_pos),
                 dkp = to_device(std::vector<float>(num_blocks * block * kvd, 0.0f)),
                 dvp = to_device(std::vector<float>(num_blocks * block * kvd, 0.0f));
    dm::PagedKvView dkv{dkp.data(), dvp.data(),       dm::KvDtype::kF32, num_blocks, block, n_kv,
                        hd,         dt.as<int32_t>(), max_blocks,        1.0f,       1.0f};
    FP8RL_ASSERT_OK(kv_write_paged(dk.as<float>(), dv.as<float>(), rows, dseq.as<int32_t>(),
                                   dpos.as<int32_t>(), dkv, nullptr));
    absl::StatusOr<DeviceBuffer> dpaged = DeviceBuffer::allocate(sizeof(float) * rows * qd);
    ASSERT_TRUE(dpaged.ok());
    FP8RL_ASSERT_OK(attention_paged(dq.as<float>(), rows, dseq.as<int32_t>(), dpos.as<int32_t>(),
                                    dkv, n_heads, scale, dpaged->as<float>(), nullptr,
                                    DecoderKernels::kFast));
    expect_same(to_host<float>(*dpaged, rows * qd), split_out,
                "tiled prefill vs split paged hd " + std::to_string(hd));
  }
}

// Paged KV: writes must store the same bytes as the CPU (fp32, bf16, fp8 codes); attention over
// shuffled blocks must match the CPU reference of the kernel that ran: the simple kernel against
// cpu::attention_paged (attend_row's order), the split-context kernel against
// cpu::attention_paged_split (the same order, dm::attend_row_split), both within kExpReductionRel
// (exp's rounding). Contexts of 1 position, around the 16-position cache block and the 32-position
// tile, and past the 8-warp stripe wrap (256); head_dim 64, 128 and 40 (lanes with one or two
// dims, a partial second pass); query rows at every position of the short sequences (chunked
// prefill) and at a few positions of the long ones.
void check_paged_kv(int64_t hd) {
  const int64_t n_heads = 12, n_kv = 4, block = 16;
  const std::vector<int64_t> lens = {1, 15, 16, 17, 100, 257, 700};
  const int64_t n_seq = int64_t(lens.size()), max_blocks = 44, num_blocks = n_seq * max_blocks + 3;
  std::vector<int32_t> table(n_seq * max_blocks);
  std::iota(table.begin(), table.end(), 3);
  std::shuffle(table.begin(), table.end(), std::mt19937(9));
  std::vector<int32_t> row_seq, row_pos, q_seq, q_pos;
  for (int64_t s = 0; s < n_seq; ++s) {
    for (int64_t p = 0; p < lens[s]; ++p) {
      row_seq.push_back(int32_t(s));
      row_pos.push_back(int32_t(p));
      if (lens[s] <= 100 || p == 0 || p == 31 || p == 32 || p == 255 || p == 256 ||
          p >= lens[s] - 2) {
        q_seq.push_back(int32_t(s));
        q_pos.push_back(int32_t(p));
      }
    }
  }
  const int64_t rows = int64_t(row_seq.size()), qrows = int64_t(q_seq.size());
  const int64_t qd = n_heads * hd, kvd = n_kv * hd;
  const auto q = random_vec(qrows * qd, 50), k = random_vec(rows * kvd, 51, 2.0f),
             v = random_vec(rows * kvd, 52, 2.0f);
  const float scale = 1.0f / std::sqrt(float(hd));
  DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dt = to_device(table),
               dseq = to_device(row_seq), dpos = to_device(row_pos), dqseq = to_device(q_seq),
               dqpos = to_device(q_pos);
  for (dm::KvDtype dtype : {dm::KvDtype::kF32, dm::KvDtype::kBF16, dm::KvDtype::kFP8}) {
    const std::string what =
        "paged kv hd " + std::to_string(hd) + " dtype " + std::to_string(int(dtype));
    const size_t bytes = size_t(num_blocks * block * kvd * dm::kv_elem_bytes(dtype));
    DeviceBuffer dkp = to_device(std::vector<uint8_t>(bytes, 0)),
                 dvp = to_device(std::vector<uint8_t>(bytes, 0));
    dm::PagedKvView dkv{dkp.data(), dvp.data(),       dtype,      num_blocks, block,  n_kv,
                        hd,         dt.as<int32_t>(), max_blocks, 0.0131f,    0.0097f};
    FP8RL_ASSERT_OK(kv_write_paged(dk.as<float>(), dv.as<float>(), rows, dseq.as<int32_t>(),
                                   dpos.as<int32_t>(), dkv, nullptr));
    std::vector<uint8_t> kpool(bytes, 0), vpool(bytes, 0);
    dm::PagedKvView hkv = dkv;
    hkv.k_pool = kpool.data();
    hkv.v_pool = vpool.data();
    hkv.block_table = table.data();
    cpu::kv_write_paged(k.data(), v.data(), rows, row_seq.data(), row_pos.data(), hkv);
    ASSERT_EQ(to_host<uint8_t>(dkp, bytes), kpool) << what << ": K pool bytes";
    ASSERT_EQ(to_host<uint8_t>(dvp, bytes), vpool) << what << ": V pool bytes";

    ASSERT_TRUE(attention_paged_uses_split(dkv, qrows, n_heads, DecoderKernels::kFast)) << what;
    ASSERT_FALSE(attention_paged_uses_split(dkv, qrows, n_heads, DecoderKernels::kSimple)) << what;
    for (DecoderKernels kernels : {DecoderKernels::kSimple, DecoderKernels::kFast}) {
      const bool split = kernels == DecoderKernels::kFast;
      absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::allocate(sizeof(float) * qrows * qd);
      ASSERT_TRUE(dout.ok());
      FP8RL_ASSERT_OK(attention_paged(dq.as<float>(), qrows, dqseq.as<int32_t>(),
                                      dqpos.as<int32_t>(), dkv, n_heads, scale, dout->as<float>(),
                                      nullptr, kernels));
      std::vector<float> ref(qrows * qd);
      if (split) {
        cpu::attention_paged_split(q.data(), qrows, q_seq.data(), q_pos.data(), hkv, n_heads, scale,
                                   ref.data());
      } else {
        cpu::attention_paged(q.data(), qrows, q_seq.data(), q_pos.data(), hkv, n_heads, scale,
                             ref.data());
      }
      const std::vector<float> got = to_host<float>(*dout, qrows * qd);
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != ref[i];
      std::printf("[ decoder %s %s: %zu of %zu outputs not bit-equal ]\n", what.c_str(),
                  split ? "split" : "simple", differ, got.size());
      expect_close(got, ref, kExpReductionRel, true,
                   what + (split ? " split kernel" : " simple kernel"));
    }
  }
}

TEST_F(GpuDecoderTest, PagedKvWriteAndAttentionMatchCpu) {
  for (int64_t hd : {64, 128, 40}) {
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    check_paged_kv(hd);
    if (HasFatalFailure()) return;
  }
}

// Shapes the split kernel does not take run the simple one (and still match attend_row).
TEST_F(GpuDecoderTest, PagedAttentionFallsBackForUnsupportedHeadDim) {
  const int64_t n_heads = 2, n_kv = 1, hd = 18, block = 4, len = 9;  // 18 % 8 != 0
  std::vector<int32_t> table = {2, 0, 1}, row_seq(len, 0), row_pos(len);
  std::iota(row_pos.begin(), row_pos.end(), 0);
  const auto q = random_vec(len * n_heads * hd, 57), k = random_vec(len * hd, 58),
             v = random_vec(len * hd, 59);
  DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dt = to_device(table),
               dseq = to_device(row_seq), dpos = to_device(row_pos),
               dkp = to_device(std::vector<float>(3 * block * hd, 0.0f)),
               dvp = to_device(std::vector<float>(3 * block * hd, 0.0f));
  dm::PagedKvView dkv{dkp.data(), dvp.data(), dm::KvDtype::kF32, 3, block,
                      n_kv,       hd,         dt.as<int32_t>(),  3, 1.0f,
                      1.0f};
  EXPECT_FALSE(attention_paged_uses_split(dkv, len, n_heads, DecoderKernels::kFast));
  FP8RL_ASSERT_OK(kv_write_paged(dk.as<float>(), dv.as<float>(), len, dseq.as<int32_t>(),
                                 dpos.as<int32_t>(), dkv, nullptr));
  absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::allocate(sizeof(float) * len * n_heads * hd);
  ASSERT_TRUE(dout.ok());
  FP8RL_ASSERT_OK(attention_paged(dq.as<float>(), len, dseq.as<int32_t>(), dpos.as<int32_t>(), dkv,
                                  n_heads, 0.3f, dout->as<float>(), nullptr,
                                  DecoderKernels::kFast));
  std::vector<float> kp(3 * block * hd), vp(3 * block * hd), ref(len * n_heads * hd);
  dm::PagedKvView hkv = dkv;
  hkv.k_pool = kp.data();
  hkv.v_pool = vp.data();
  hkv.block_table = table.data();
  cpu::kv_write_paged(k.data(), v.data(), len, row_seq.data(), row_pos.data(), hkv);
  cpu::attention_paged(q.data(), len, row_seq.data(), row_pos.data(), hkv, n_heads, 0.3f,
                       ref.data());
  expect_close(to_host<float>(*dout, len * n_heads * hd), ref, kExpReductionRel, true,
               "paged attention hd 18 (simple fallback)");
}

// Both kernels against the serial CPU reference, the block kernel also against its own order
// (dm::logsumexp_scaled_blocked); vocabularies below, at and above the block's 256 threads.
TEST_F(GpuDecoderTest, LogSoftmaxMatchesCpu) {
  for (int64_t vocab : {int64_t{100}, int64_t{256}, int64_t{32011}}) {
    const int64_t rows = 9;
    const auto z = random_vec(rows * vocab, 60 + uint32_t(vocab), 4.0f);
    std::vector<int32_t> targets(rows);
    for (int64_t r = 0; r < rows; ++r) targets[r] = int32_t((r * 7919) % vocab);
    DeviceBuffer dz = to_device(z), dtg = to_device(targets);
    for (DecoderKernels kernels : {DecoderKernels::kSimple, DecoderKernels::kFast}) {
      for (float inv_t : {1.0f, 1.0f / 0.7f}) {
        absl::StatusOr<DeviceBuffer> dl = DeviceBuffer::allocate(sizeof(float) * rows);
        absl::StatusOr<DeviceBuffer> dlp = DeviceBuffer::allocate(sizeof(float) * rows);
        ASSERT_TRUE(dl.ok() && dlp.ok());
        FP8RL_ASSERT_OK(log_softmax(dz.as<float>(), rows, vocab, inv_t, dtg.as<int32_t>(),
                                    dl->as<float>(), dlp->as<float>(), nullptr, kernels));
        std::vector<float> lse(rows), lp(rows);
        cpu::log_softmax(z.data(), rows, vocab, inv_t, targets.data(), lse.data(), lp.data());
        const std::vector<float> glse = to_host<float>(*dl, rows), glp = to_host<float>(*dlp, rows);
        for (int64_t r = 0; r < rows; ++r) {
          const double tol = kLseAbs * std::max(1.0f, std::fabs(lse[r]));
          EXPECT_NEAR(glse[r], lse[r], tol) << "vocab " << vocab << " row " << r;
          EXPECT_NEAR(glp[r], lp[r], tol) << "vocab " << vocab << " row " << r;
          if (kernels == DecoderKernels::kFast) {
            const float blocked = dm::logsumexp_scaled_blocked(z.data() + r * vocab, vocab, inv_t);
            EXPECT_NEAR(glse[r], blocked, tol) << "vocab " << vocab << " row " << r;
          }
        }
      }
    }
  }
}

// Many rows, each with its own parameters and seed, several steps (the streams advance), both
// kernels: the same tokens as the serial CPU sampler (and, for the block kernel, as its own
// order dm::sample_row_blocked) and logprobs within a float64-sum rounding.
TEST_F(GpuDecoderTest, SamplingMatchesCpuTokensAndLogprobs) {
  const int64_t rows = 48, steps = 4;
  for (int64_t vocab : {int64_t{2053}, int64_t{100}}) {
    for (DecoderKernels kernels : {DecoderKernels::kSimple, DecoderKernels::kFast}) {
      const bool fast = kernels == DecoderKernels::kFast;
      SCOPED_TRACE(std::string(fast ? "block kernel" : "simple kernel") + " vocab " +
                   std::to_string(vocab));
      std::vector<dm::SampleParams> params(rows);
      std::vector<dm::RngState> rng(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const float temps[] = {0.0f, 1.0f, 0.7f, 1.3f};
        const float tops[] = {1.0f, 0.9f, 0.5f, 1.0f};
        const int64_t ks[] = {0, 0, 20, 7};
        params[r] = dm::SampleParams{temps[r % 4], tops[(r / 4) % 4], ks[(r / 16) % 3]};
        rng[r] = dm::rng_seed(1000 + uint64_t(r));
      }
      std::vector<dm::RngState> cpu_rng = rng, blocked_rng = rng;
      DeviceBuffer dp = to_device(params), dr = to_device(rng),
                   dscr = to_device(std::vector<int32_t>(rows * vocab, 0)),
                   dout = to_device(std::vector<dm::SampleResult>(rows));
      std::vector<int32_t> scratch(rows * vocab);
      int64_t mismatches = 0;
      for (int64_t step = 0; step < steps; ++step) {
        auto z = random_vec(rows * vocab, 70 + uint32_t(step), 3.0f);
        z[5] = z[6] = 12.0f;  // a tie at the top of row 0
        DeviceBuffer dz = to_device(z);
        FP8RL_ASSERT_OK(sample(dz.as<float>(), rows, vocab, dp.as<dm::SampleParams>(),
                               dr.as<dm::RngState>(), dscr.as<int32_t>(),
                               dout.as<dm::SampleResult>(), nullptr, kernels));
        std::vector<dm::SampleResult> ref(rows);
        cpu::sample(z.data(), rows, vocab, params.data(), cpu_rng.data(), scratch.data(),
                    ref.data());
        const auto got = to_host<dm::SampleResult>(dout, rows);
        for (int64_t r = 0; r < rows; ++r) {
          const dm::SampleResult blocked = dm::sample_row_blocked(
              z.data() + r * vocab, vocab, params[r], blocked_rng[r], scratch.data() + r * vocab);
          if (got[r].token != ref[r].token || (fast && got[r].token != blocked.token)) {
            ++mismatches;
            std::printf("[ decoder sampling: step %ld row %ld token gpu %d cpu %d blocked %d ]\n",
                        long(step), long(r), got[r].token, ref[r].token, blocked.token);
            continue;
          }
          EXPECT_NEAR(got[r].logprob, ref[r].logprob, kLseAbs * 16)
              << "step " << step << " row " << r;
          EXPECT_NEAR(got[r].full_logprob, ref[r].full_logprob, kLseAbs * 16) << r;
        }
      }
      EXPECT_EQ(mismatches, 0);
      const auto rng_after = to_host<dm::RngState>(dr, rows);
      for (int64_t r = 0; r < rows; ++r) {
        for (int i = 0; i < 4; ++i) EXPECT_EQ(rng_after[r].s[i], cpu_rng[r].s[i]) << "row " << r;
      }
    }
  }
}

// Which paged-attention kernel runs is decided on the host: runs without a GPU.
TEST(GpuDecoderArgsTest, SplitAttentionOnlyForShapesItSupports) {
  alignas(16) static uint8_t pool[64];
  const int32_t* ids = reinterpret_cast<const int32_t*>(0x3000);
  dm::PagedKvView kv{pool, pool, dm::KvDtype::kFP8, 4, 16, 2, 128, ids, 2, 1.0f, 1.0f};
  EXPECT_TRUE(attention_paged_uses_split(kv, 8, 4, DecoderKernels::kFast));
  EXPECT_FALSE(attention_paged_uses_split(kv, 8, 4, DecoderKernels::kSimple));
  kv.head_dim = 18;  // not a multiple of 8
  EXPECT_FALSE(attention_paged_uses_split(kv, 8, 4, DecoderKernels::kFast));
  kv.head_dim = 264;  // above dm::kSplitMaxHeadDim
  EXPECT_FALSE(attention_paged_uses_split(kv, 8, 4, DecoderKernels::kFast));
  kv.head_dim = 64;
  kv.v_pool = pool + 8;  // not 16-byte aligned
  EXPECT_FALSE(attention_paged_uses_split(kv, 8, 4, DecoderKernels::kFast));
  kv.v_pool = pool;
  EXPECT_FALSE(attention_paged_uses_split(kv, int64_t{1} << 30, 4, DecoderKernels::kFast));
  EXPECT_TRUE(attention_paged_uses_split(kv, 8, 4, DecoderKernels::kFast));
}

TEST(GpuDecoderArgsTest, BadArgumentsNameTheField) {
  // Checked on the host before any launch, so these run without a GPU.
  const float* f = reinterpret_cast<const float*>(0x1000);
  float* out = reinterpret_cast<float*>(0x2000);
  const int32_t* ids = reinterpret_cast<const int32_t*>(0x3000);
  absl::Status st = rmsnorm(f, f, 0, 16, 1e-5f, false, out, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rows"), std::string::npos) << st;
  st = rmsnorm(f, nullptr, 2, 16, 1e-5f, false, out, nullptr, nullptr);
  EXPECT_NE(st.message().find("g is null"), std::string::npos) << st;
  st = attention_prefill(f, f, f, ids, 1, 4, 6, 4, 8, 1.0f, out, nullptr);
  EXPECT_NE(st.message().find("n_heads (6) must be a multiple of n_kv (4)"), std::string::npos)
      << st;
  st = rope(f, f, ids, 3, 2, 7, false, out, nullptr);
  EXPECT_NE(st.message().find("head_dim must be even"), std::string::npos) << st;
  dm::PagedKvView kv{out, out, dm::KvDtype::kFP8, 4, 16, 2, 8, ids, 2, 0.0f, 1.0f};
  st = kv_write_paged(f, f, 3, ids, ids, kv, nullptr);
  EXPECT_NE(st.message().find("kv.k_scale"), std::string::npos) << st;
  st = log_softmax(f, 2, 10, 1.0f, ids, nullptr, nullptr, nullptr);
  EXPECT_NE(st.message().find("targets and target_logprob"), std::string::npos) << st;
  st = sample(f, 2, 10, nullptr, nullptr, nullptr, nullptr, nullptr);
  EXPECT_NE(st.message().find("params is null"), std::string::npos) << st;
}

}  // namespace
}  // namespace fp8rl::kernels::cuda
