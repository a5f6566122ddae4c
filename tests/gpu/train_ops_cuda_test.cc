// The CUDA training step against the CPU: every training kernel (kernels/cuda/train_cuda.h)
// against its CPU reference (kernels/cpu/train_ops.h), every training GEMM of CudaTrainOps
// (fprop / dgrad / wgrad per linear kind) against model/linear.h through CpuTrainOps, and a
// whole forward + backward (CudaTrainStep) against the CPU step (CpuTrainStep) for fp32,
// bf16 and fp8 policies with the KV fake-quantization. Skips without an sm_90 device. Each
// comparison prints "measured ... bar ..." (the H200 runs' figures: docs/results/gpu-check-*.md).
//
// Tolerances:
//   Kernels without exp (RMSNorm and RoPE backward, embedding gradient, KV fake-quantization,
//     amax, transposes, bias sums, float64 GEMMs): bit for bit (same shared math, same order,
//     --fmad=false on the device).
//   Kernels with exp (SwiGLU backward, attention backward, logit gradient): the device expf is
//     within 2 ulp of glibc's; each output is a short chain of fp32 ops on such values, ~1e-6
//     relative: calc_diff (~e^2 / 2) bar kExpCalcDiff = 1e-10.
//   Training GEMMs vs model/linear.h on the same operands (calc_diff per output):
//     fp32: double accumulation on the device vs OpenBLAS fp32 sums on the CPU (~sqrt(K) 2^-24
//       relative): ~1e-12; bar kFp32GemmCalcDiff = 1e-10.
//     bf16: the device rounds dY (dgrad) and dY, X (wgrad) to bf16 (the recipe's BF16 GEMM) where
//       the CPU keeps dY in fp32: 2^-9 relative per element, calc_diff ~(2^-9)^2 / 6 ~ 6e-7;
//       bar kBf16GemmCalcDiff = 1e-5.
//     fp8: codes and scales bit-identical (kernels/cuda quantize), only the accumulation order of
//       cuBLASLt differs: kernels/tolerances.h kCudaVsCpuGemmMaxCalcDiff (1e-5).
//   Whole step (per-token logprobs and per-tensor gradients, calc_diff): the GEMM differences
//     above, and for bf16/fp8 the rounding flips they cause downstream (model_cuda_test.cc's
//     derivation: bf16 ~1e-5, fp8 1e-3 for forward values), doubled for the backward's second
//     pass through the same chain: kStepCalcDiff = {fp32 1e-8, bf16 1e-4, fp8 5e-3}.
//   FP8 gradients with exact (not power-of-two) 1x128 scales: a last-bit change of a tile's amax
//     rescales all 128 codes of the tile in the backward's dY quantization, not one code, so a
//     gradient differs by more than the forward's flips. Measured on an H200: power-of-two
//     scales stay within kStepCalcDiffFp8 (the _mixed case), exact scales go past it while the
//     same step's logprobs agree to ~1e-4: gradient bar kStepCalcDiffFp8ExactScales = 2e-2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/cpu/train_ops.h"
#include "engine/cuda/cuda_train_ops.h"
#include "kernels/calc_diff.h"
#include "kernels/cpu/decoder_ops.h"
#include "kernels/cpu/train_ops.h"
#include "kernels/cuda/train_cuda.h"
#include "kernels/formats.h"
#include "kernels/tolerances.h"
#include "model/ops.h"
#include "model/rng.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::engine {
namespace {

namespace kc = kernels::cuda;
using kc::testing::random_matrix;
using kc::testing::same_float;
using kc::testing::to_device;
using kc::testing::to_host;

constexpr double kExpCalcDiff = 1e-10;
constexpr double kFp32GemmCalcDiff = 1e-10;
constexpr double kBf16GemmCalcDiff = 1e-5;
constexpr double kStepCalcDiffFp32 = 1e-8;
constexpr double kStepCalcDiffBf16 = 1e-4;
constexpr double kStepCalcDiffFp8 = 5e-3;
constexpr double kStepCalcDiffFp8ExactScales = 2e-2;

void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(same_float(got[i], want[i]))
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    norm += std::fabs(want[i]);
  }
  EXPECT_GT(norm, 0.0) << what << " is all zeros";
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double bar,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double norm = 0;
  for (float v : want) norm += std::fabs(v);
  ASSERT_GT(norm, 0.0) << what << " is all zeros";
  const double d = kernels::calc_diff(got, want);
  std::printf("%s: measured calc_diff %.3g bar %.3g\n", what.c_str(), d, bar);
  EXPECT_LT(d, bar) << what;
}

std::vector<int32_t> seq_start_of(const std::vector<int64_t>& lens) {
  std::vector<int32_t> s = {0};
  for (int64_t n : lens) s.push_back(s.back() + static_cast<int32_t>(n));
  return s;
}

TEST(TrainKernels, RmsnormBackwardBitExact) {
  FP8RL_REQUIRE_SM90();
  const int64_t rows = 37, h = 200;
  const std::vector<float> x = random_matrix(rows, h, 1), g = random_matrix(1, h, 2),
                           dy = random_matrix(rows, h, 3);
  std::vector<float> y(rows * h), inv(rows), dx(rows * h), dg = random_matrix(1, h, 4);
  kernels::cpu::rmsnorm(x.data(), g.data(), rows, h, 1e-5f, false, y.data(), inv.data());
  auto dx_d = to_device(dx), dg_d = to_device(dg);
  auto x_d = to_device(x), g_d = to_device(g), inv_d = to_device(inv), dy_d = to_device(dy);
  FP8RL_ASSERT_OK(kc::rmsnorm_backward(x_d.as<float>(), g_d.as<float>(), inv_d.as<float>(),
                                       dy_d.as<float>(), rows, h, dx_d.as<float>(),
                                       dg_d.as<float>(), nullptr));
  kernels::cpu::rmsnorm_backward(x.data(), g.data(), inv.data(), dy.data(), rows, h, dx.data(),
                                 dg.data());
  expect_bits(to_host<float>(dx_d, dx.size()), dx, "dx");
  expect_bits(to_host<float>(dg_d, dg.size()), dg, "dg");
}

TEST(TrainKernels, RopeInverseBitExact) {
  FP8RL_REQUIRE_SM90();
  const int64_t rows = 29, heads = 3, hd = 48, max_pos = 64;
  std::vector<float> cos(max_pos * hd / 2), sin(max_pos * hd / 2);
  model::ops::rope_fill(model::ops::rope_inv_freq(10000.0, hd, {}), max_pos, cos.data(),
                        sin.data());
  std::vector<int32_t> pos(rows);
  for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>((r * 7) % max_pos);
  std::vector<float> x = random_matrix(rows, heads * hd, 5);
  auto x_d = to_device(x), c_d = to_device(cos), s_d = to_device(sin), p_d = to_device(pos);
  FP8RL_ASSERT_OK(kc::rope_inverse(c_d.as<float>(), s_d.as<float>(), p_d.as<int32_t>(), rows, heads,
                                   hd, x_d.as<float>(), nullptr));
  kernels::cpu::rope_inverse(cos.data(), sin.data(), pos.data(), rows, heads, hd, x.data());
  expect_bits(to_host<float>(x_d, x.size()), x, "rope_inverse");
}

TEST(TrainKernels, SwigluBackwardAndLogitGradient) {
  FP8RL_REQUIRE_SM90();
  const int64_t n = 5000;
  const std::vector<float> g = random_matrix(1, n, 6), u = random_matrix(1, n, 7),
                           da = random_matrix(1, n, 8);
  std::vector<float> dg(n), du(n);
  auto g_d = to_device(g), u_d = to_device(u), da_d = to_device(da), dg_d = to_device(dg),
       du_d = to_device(du);
  FP8RL_ASSERT_OK(kc::swiglu_backward(g_d.as<float>(), u_d.as<float>(), da_d.as<float>(), n,
                                      dg_d.as<float>(), du_d.as<float>(), nullptr));
  kernels::cpu::swiglu_backward(g.data(), u.data(), da.data(), n, dg.data(), du.data());
  expect_close(to_host<float>(dg_d, n), dg, kExpCalcDiff, "swiglu dg");
  expect_close(to_host<float>(du_d, n), du, kExpCalcDiff, "swiglu du");

  const int64_t rows = 9, vocab = 300;
  std::vector<float> z = random_matrix(rows, vocab, 9), lse(rows), lp(rows),
                     dlogp = random_matrix(1, rows, 10);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 31) % vocab);
  const float inv_t = 1.0f / 0.7f;
  kernels::cpu::log_softmax(z.data(), rows, vocab, inv_t, targets.data(), lse.data(), lp.data());
  auto z_d = to_device(z), t_d = to_device(targets), l_d = to_device(lse), d_d = to_device(dlogp);
  FP8RL_ASSERT_OK(kc::head_dlogits(z_d.as<float>(), rows, vocab, inv_t, t_d.as<int32_t>(),
                                   l_d.as<float>(), d_d.as<float>(), nullptr));
  kernels::cpu::head_dlogits(z.data(), rows, vocab, inv_t, targets.data(), lse.data(),
                             dlogp.data());
  expect_close(to_host<float>(z_d, z.size()), z, kExpCalcDiff, "head_dlogits");
}

TEST(TrainKernels, AttentionBackwardPackedGqa) {
  FP8RL_REQUIRE_SM90();
  const std::vector<int64_t> lens = {5, 1, 34};
  const std::vector<int32_t> starts = seq_start_of(lens);
  const int64_t rows = starts.back(), nh = 4, nkv = 2, hd = 32, qd = nh * hd, kvd = nkv * hd;
  std::vector<int32_t> row_seq;
  for (size_t s = 0; s < lens.size(); ++s) row_seq.insert(row_seq.end(), lens[s], int32_t(s));
  auto scaled = [](std::vector<float> v, float s) {
    for (float& x : v) x *= s;
    return v;
  };
  // Small q, k so the softmax is not one-hot; outliers stay in.
  const std::vector<float> q = scaled(random_matrix(rows, qd, 11), 0.05f),
                           k = scaled(random_matrix(rows, kvd, 12), 0.05f),
                           v = random_matrix(rows, kvd, 13), dout = random_matrix(rows, qd, 14);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> stats(rows * nh * 3), dq(rows * qd), dk(rows * kvd), dv(rows * kvd);
  kernels::cpu::attention_prefill_backward(q.data(), k.data(), v.data(), dout.data(), starts.data(),
                                           3, nh, nkv, hd, scale, stats.data(), dq.data(),
                                           dk.data(), dv.data());
  auto q_d = to_device(q), k_d = to_device(k), v_d = to_device(v), o_d = to_device(dout),
       s_d = to_device(starts), rs_d = to_device(row_seq), st_d = to_device(stats),
       dq_d = to_device(dq), dk_d = to_device(dk), dv_d = to_device(dv);
  FP8RL_ASSERT_OK(kc::attention_backward(
      q_d.as<float>(), k_d.as<float>(), v_d.as<float>(), o_d.as<float>(), s_d.as<int32_t>(),
      rs_d.as<int32_t>(), rows, nh, nkv, hd, scale, st_d.as<float>(), dq_d.as<float>(),
      dk_d.as<float>(), dv_d.as<float>(), nullptr));
  expect_close(to_host<float>(dq_d, dq.size()), dq, kExpCalcDiff, "attention dq");
  expect_close(to_host<float>(dk_d, dk.size()), dk, kExpCalcDiff, "attention dk");
  expect_close(to_host<float>(dv_d, dv.size()), dv, kExpCalcDiff, "attention dv");
}

TEST(TrainKernels, EmbeddingKvQuantAmaxTransposeSumsGemmsBitExact) {
  FP8RL_REQUIRE_SM90();
  // Embedding gradient with repeated tokens.
  const int64_t rows = 40, h = 96, vocab = 12;
  std::vector<int32_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((r * r) % vocab);
  const std::vector<float> dx = random_matrix(rows, h, 15);
  std::vector<float> de = random_matrix(vocab, h, 16);
  auto dx_d = to_device(dx), t_d = to_device(tokens), de_d = to_device(de);
  FP8RL_ASSERT_OK(
      kc::embed_backward(dx_d.as<float>(), t_d.as<int32_t>(), rows, h, de_d.as<float>(), nullptr));
  kernels::cpu::embed_backward(dx.data(), tokens.data(), rows, h, de.data());
  expect_bits(to_host<float>(de_d, de.size()), de, "embed_backward");
  // KV fake-quantization (fp8 with a scale, bf16) and per-sequence amax.
  for (auto dtype : {kernels::dm::KvDtype::kFP8, kernels::dm::KvDtype::kBF16}) {
    std::vector<float> x = random_matrix(rows, h, 17);
    auto x_d = to_device(x);
    FP8RL_ASSERT_OK(kc::kv_fake_quant(x_d.as<float>(), rows * h, dtype, 0.37f, nullptr));
    kernels::cpu::kv_fake_quant(x.data(), rows * h, dtype, 0.37f);
    expect_bits(to_host<float>(x_d, x.size()), x, "kv_fake_quant");
  }
  const std::vector<int32_t> starts = seq_start_of({3, 1, 36});
  std::vector<float> amax(3);
  auto s_d = to_device(starts), amax_d = to_device(amax);
  FP8RL_ASSERT_OK(
      kc::seq_amax(dx_d.as<float>(), h, s_d.as<int32_t>(), 3, amax_d.as<float>(), nullptr));
  kernels::cpu::seq_amax(dx.data(), h, starts.data(), 3, amax.data());
  expect_bits(to_host<float>(amax_d, 3), amax, "seq_amax");
  // Transpose with zero padding, bias sums.
  const int64_t ld = 48;
  auto t_out = to_device(std::vector<float>(h * ld, 1.0f));
  FP8RL_ASSERT_OK(
      kc::transpose_pad(dx_d.as<float>(), rows, h, ld, t_out.as<float>(), nullptr, nullptr));
  const std::vector<float> t = to_host<float>(t_out, h * ld);
  for (int64_t c = 0; c < h; ++c) {
    for (int64_t r = 0; r < ld; ++r) {
      ASSERT_TRUE(same_float(t[c * ld + r], r < rows ? dx[r * h + c] : 0.0f)) << c << "," << r;
    }
  }
  std::vector<float> sums = random_matrix(1, h, 18);
  auto sums_d = to_device(sums);
  FP8RL_ASSERT_OK(kc::column_sum(dx_d.as<float>(), rows, h, sums_d.as<float>(), nullptr));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < h; ++c) sums[c] += dx[r * h + c];
  }
  expect_bits(to_host<float>(sums_d, h), sums, "column_sum");
  // Float64-accumulated GEMMs: the host loop in the same order gives the same bits.
  const int64_t m = 13, n = 24, kk = 40;
  const std::vector<float> a = random_matrix(m, kk, 19), b = random_matrix(n, kk, 20),
                           bn = random_matrix(kk, n, 21), at = random_matrix(kk, m, 22);
  std::vector<float> y_nt(m * n), y_nn(m * n), y_tn = random_matrix(m, n, 23);
  auto a_d = to_device(a), b_d = to_device(b), bn_d = to_device(bn), at_d = to_device(at),
       ynt_d = to_device(y_nt), ynn_d = to_device(y_nn), ytn_d = to_device(y_tn);
  FP8RL_ASSERT_OK(kc::gemm_nt_f64acc(a_d.as<float>(), b_d.as<float>(), ynt_d.as<float>(), m, n, kk,
                                     false, nullptr));
  FP8RL_ASSERT_OK(
      kc::gemm_nn_f64acc(a_d.as<float>(), bn_d.as<float>(), ynn_d.as<float>(), m, n, kk, nullptr));
  FP8RL_ASSERT_OK(
      kc::gemm_tn_f64acc(at_d.as<float>(), bn_d.as<float>(), ytn_d.as<float>(), m, n, kk, nullptr));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double nt = 0, nn = 0, tn = 0;
      for (int64_t i = 0; i < kk; ++i) {
        nt += static_cast<double>(a[r * kk + i]) * b[c * kk + i];
        nn += static_cast<double>(a[r * kk + i]) * bn[i * n + c];
        tn += static_cast<double>(at[i * m + r]) * bn[i * n + c];
      }
      y_nt[r * n + c] = static_cast<float>(nt);
      y_nn[r * n + c] = static_cast<float>(nn);
      y_tn[r * n + c] += static_cast<float>(tn);
    }
  }
  expect_bits(to_host<float>(ynt_d, m * n), y_nt, "gemm_nt_f64acc");
  expect_bits(to_host<float>(ynn_d, m * n), y_nn, "gemm_nn_f64acc");
  expect_bits(to_host<float>(ytn_d, m * n), y_tn, "gemm_tn_f64acc");
  // Bad input is refused before any launch, naming the argument.
  absl::Status st =
      kc::transpose_pad(dx_d.as<float>(), rows, h, rows - 1, t_out.as<float>(), nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ld"), std::string::npos) << st;
}

// ---- Model-level: the training GEMMs and the whole step ----

struct StepCase {
  model::Precision linear;
  model::KvCacheDtype kv;
  bool qwen3;
  bool mixed;  // fp8 with layer 0 in bf16 and power-of-two scales
};

std::string step_name(const StepCase& c) {
  return std::string(precision_name(c.linear)) + "_kv_" + std::string(precision_name(c.kv)) +
         (c.qwen3 ? "_qwen3" : "_qwen2") + (c.mixed ? "_mixed" : "");
}

std::unique_ptr<model::Model> make_model(const StepCase& c) {
  model::PrecisionPolicy policy;
  policy.linear = c.linear;
  policy.kv_cache = c.kv;
  if (c.mixed) {
    policy.bf16_first_layers = 1;
    policy.pow2_scales = true;
  }
  // Widths meet cuBLASLt's FP8 rules in all three training GEMMs (multiples of 16).
  const model::ModelConfig config =
      c.qwen3 ? model::testing::make_qwen3_config(160, 128, 256, 2, 4, 2, 48, true)
              : model::testing::make_config(160, 128, 256, 2, 4, 2, false, /*qwen2=*/true);
  auto m = model::Model::Init(config, policy, 5, 0.05f);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  model::testing::randomize(**m, 11);
  if (c.kv == model::KvCacheDtype::kFP8) {
    model::KvScales s = (*m)->kv_scales();
    for (auto& k : s.k) k = 0.03f;
    for (auto& v : s.v) v = 0.02f;
    EXPECT_TRUE((*m)->set_kv_scales(s).ok());
  }
  return *std::move(m);
}

double gemm_bar(model::Precision p) {
  return p == model::Precision::kF32    ? kFp32GemmCalcDiff
         : p == model::Precision::kBF16 ? kBf16GemmCalcDiff
                                        : kernels::kCudaVsCpuGemmMaxCalcDiff;
}

class TrainOpsCudaTest : public ::testing::TestWithParam<StepCase> {};

// fprop, dgrad, wgrad (+ bias gradient) of every linear of layer 1 and lm_head: CudaTrainOps vs
// CpuTrainOps (model/linear.h) on the same random operands, 45 rows (padding exercised).
TEST_P(TrainOpsCudaTest, TrainingGemmsMatchTheCpu) {
  FP8RL_REQUIRE_SM90();
  std::unique_ptr<model::Model> model = make_model(GetParam());
  ASSERT_NE(model, nullptr);
  auto dev = CudaTrainOps::Create(*model);
  ASSERT_TRUE(dev.ok()) << dev.status();
  CudaTrainOps& ops = **dev;
  CpuTrainOps host(*model);
  const int64_t rows = 45, padded = train_padded_rows(rows);
  for (int64_t j = -1; j < 7; ++j) {
    const int64_t layer = j < 0 ? -1 : 1;
    const model::LinearWeight& w = j < 0 ? model->lm_head_weight() : model->layer_linear(1, j);
    std::vector<float> x = random_matrix(rows, w.in, 30 + j),
                       dy = random_matrix(rows, w.out, 40 + j);
    if (w.precision != model::Precision::kF32) {
      for (float& v : x) v = kernels::round_bf16(v);  // linear inputs are bf16-valued there
    }
    std::vector<float> dw = random_matrix(w.out, w.in, 50 + j),
                       db = random_matrix(1, w.out, 60 + j);
    std::vector<float> y(rows * w.out), dx(rows * w.in);
    const std::string what = absl::StrCat(step_name(GetParam()), " linear ", j);
    ASSERT_TRUE(host.linear(layer, j, x.data(), rows, nullptr, y.data()).ok());
    std::vector<float> dw_ref = dw, db_ref = db;
    ASSERT_TRUE(host.linear_backward(layer, j, x.data(), dy.data(), rows, dx.data(), dw_ref.data(),
                                     db_ref.data())
                    .ok());
    // Device operands with padding rows (zero), as the step's buffers hold them.
    std::vector<float> xp(padded * w.in, 0.0f), dyp(padded * w.out, 0.0f);
    std::copy(x.begin(), x.end(), xp.begin());
    std::copy(dy.begin(), dy.end(), dyp.begin());
    auto x_d = to_device(xp), dy_d = to_device(dyp), dw_d = to_device(dw), db_d = to_device(db),
         y_d = to_device(std::vector<float>(padded * w.out)),
         dx_d = to_device(std::vector<float>(padded * w.in));
    FP8RL_ASSERT_OK(ops.linear(layer, j, x_d.as<float>(), rows, nullptr, y_d.as<float>()));
    FP8RL_ASSERT_OK(ops.linear_backward(layer, j, x_d.as<float>(), dy_d.as<float>(), rows,
                                        dx_d.as<float>(), dw_d.as<float>(), db_d.as<float>()));
    FP8RL_ASSERT_OK(ops.synchronize());
    std::vector<float> y_got = to_host<float>(y_d, rows * w.out),
                       dx_got = to_host<float>(dx_d, rows * w.in);
    const double bar = gemm_bar(w.precision);
    expect_close(y_got, y, bar, what + " fprop");
    expect_close(dx_got, dx, bar, what + " dgrad");
    // wgrad: compare the increments (the accumulated array starts from the same values).
    std::vector<float> got = to_host<float>(dw_d, dw.size()), inc_got(dw.size()), inc(dw.size());
    for (size_t i = 0; i < dw.size(); ++i) {
      inc_got[i] = got[i] - dw[i];
      inc[i] = dw_ref[i] - dw[i];
    }
    expect_close(inc_got, inc, bar, what + " wgrad");
    expect_bits(to_host<float>(db_d, db.size()), db_ref, "bias gradient");
  }
}

// A whole forward + backward on three packed sequences against the CPU step (CpuTrainStep).
TEST_P(TrainOpsCudaTest, WholeStepMatchesModelBackward) {
  FP8RL_REQUIRE_SM90();
  const StepCase c = GetParam();
  std::unique_ptr<model::Model> model = make_model(c);
  ASSERT_NE(model, nullptr);
  model::Rng rng(3);
  model::TokenBatch batch;
  for (int64_t n : {9, 2, 71}) batch.push_back(model::testing::random_tokens(rng, n, 160));
  const float temperature = 0.7f;
  engine::CpuTrainStep ctx;
  model::KvCalibrator ref_cal(2), cal(2);
  auto ref = ctx.forward(*model, batch, {.temperature = temperature, .calibrator = &ref_cal});
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto step = CudaTrainStep::Create(*model);
  ASSERT_TRUE(step.ok()) << step.status();
  auto got = (*step)->forward(*model, batch, {.temperature = temperature, .calibrator = &cal});
  ASSERT_TRUE(got.ok()) << got.status();
  const double bar = c.linear == model::Precision::kF32    ? kStepCalcDiffFp32
                     : c.linear == model::Precision::kBF16 ? kStepCalcDiffBf16
                                                           : kStepCalcDiffFp8;
  std::vector<float> lp_got, lp_ref;
  for (size_t s = 0; s < batch.size(); ++s) {
    lp_got.insert(lp_got.end(), (*got)[s].begin(), (*got)[s].end());
    lp_ref.insert(lp_ref.end(), (*ref)[s].begin(), (*ref)[s].end());
  }
  expect_close(lp_got, lp_ref, bar, step_name(c) + " logprobs");
  expect_close(cal.k_records()[1], ref_cal.k_records()[1], bar, "k amax records");

  model::TokenValues dlogp(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    dlogp[s].resize(batch[s].size() - 1);
    for (float& v : dlogp[s]) v = static_cast<float>(rng.normal());
  }
  std::vector<float> ref_grads(model->num_params(), 0.0f), grads;
  ASSERT_TRUE(ctx.backward(*model, dlogp, ref_grads.data()).ok());
  FP8RL_ASSERT_OK((*step)->backward(*model, dlogp));
  FP8RL_ASSERT_OK((*step)->download_grads(&grads));
  // Activation recomputation on the device: the same numbers bit for bit.
  auto re = CudaTrainStep::Create(*model);
  ASSERT_TRUE(re.ok()) << re.status();
  auto re_lp =
      (*re)->forward(*model, batch, {.temperature = temperature, .recompute_layers = true});
  ASSERT_TRUE(re_lp.ok()) << re_lp.status();
  for (size_t s = 0; s < batch.size(); ++s)
    expect_bits((*re_lp)[s], (*got)[s], "recompute logprobs");
  std::vector<float> re_grads;
  FP8RL_ASSERT_OK((*re)->backward(*model, dlogp));
  FP8RL_ASSERT_OK((*re)->download_grads(&re_grads));
  expect_bits(re_grads, grads, "recompute gradients");
  for (const model::ParamInfo& info : model->layout().params()) {
    const std::vector<float> a(grads.begin() + info.offset,
                               grads.begin() + info.offset + info.numel),
        b(ref_grads.begin() + info.offset, ref_grads.begin() + info.offset + info.numel);
    const double grad_bar =
        c.linear == model::Precision::kFP8 && !c.mixed ? kStepCalcDiffFp8ExactScales : bar;
    expect_close(a, b, grad_bar, step_name(c) + " grad " + info.name);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, TrainOpsCudaTest,
    ::testing::Values(StepCase{model::Precision::kF32, model::KvCacheDtype::kF32, false, false},
                      StepCase{model::Precision::kF32, model::KvCacheDtype::kFP8, true, false},
                      StepCase{model::Precision::kBF16, model::KvCacheDtype::kBF16, false, false},
                      StepCase{model::Precision::kFP8, model::KvCacheDtype::kFP8, false, false},
                      StepCase{model::Precision::kFP8, model::KvCacheDtype::kFP8, true, true}),
    [](const auto& info) { return step_name(info.param); });

// What the model asks of the device is refused before the device is touched (runs everywhere):
// MoE, and FP8 linears whose widths cuBLASLt's training GEMMs cannot take.
TEST(TrainOpsCuda, RefusesMoeAndFp8ShapesBeforeTheDevice) {
  model::PrecisionPolicy fp8;
  fp8.linear = model::Precision::kFP8;
  auto moe = model::Model::Init(
      model::testing::make_qwen3_moe_config(64, 64, 128, 1, 2, 1, 32, false, 4, 2, 32, true), fp8,
      1);
  ASSERT_TRUE(moe.ok()) << moe.status();
  absl::Status st = CudaTrainOps::Create(**moe).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("MoE"), std::string::npos) << st;
  // intermediate 200: gate/up out and down in are not multiples of 16.
  auto odd = model::Model::Init(model::testing::make_config(64, 64, 200, 1, 2, 1, true), fp8, 1);
  ASSERT_TRUE(odd.ok()) << odd.status();
  st = CudaTrainOps::Create(**odd).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("layer 0 linear 4: FP8 training on CUDA needs in and out multiples "
                              "of 16, got [200, 64]"),
            std::string::npos)
      << st;
}

// Without a device the ops refuse to start (the skip path of every test above).
TEST(TrainOpsCuda, CreateNeedsAnSm90Device) {
  model::PrecisionPolicy policy;
  auto m = model::Model::Init(model::testing::make_config(64, 64, 128, 1, 2, 1, true), policy, 1);
  ASSERT_TRUE(m.ok());
  auto ops = CudaTrainOps::Create(**m);
  if (kc::require_sm90().ok()) {
    EXPECT_TRUE(ops.ok()) << ops.status();
  } else {
    EXPECT_EQ(ops.status().code(), absl::StatusCode::kFailedPrecondition) << ops.status();
  }
}

}  // namespace
}  // namespace fp8rl::engine
