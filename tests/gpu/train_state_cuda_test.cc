// DeviceTrainState on the CUDA device against the CPU trainer (model::AdamW, Model::refresh,
// Model::export_weights(kFP8), KvCalibrator): a few AdamW steps, the 128x128 re-quantization, the
// published weight set, the KV calibration records, and the optimizer kernels' own properties
// (fixed-order grad norm within its derived bound of the CPU's, amax skipping NaN). Skips without
// an sm_90 device.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/train_state.h"
#include "kernels/cuda/optim_cuda.h"
#include "model/optimizer.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/engine/train_state_shard_check.h"
#include "tests/unit/engine/train_state_test_util.h"

namespace fp8rl::engine {
namespace {

namespace kc = kernels::cuda;
using kc::testing::same_float;

const model::AdamWConfig& kAdamW = model::testing::kTrainStateAdamW;
using model::testing::random_grads;

// Relative bound on |norm_gpu - norm_cpu| / norm_cpu for n non-negative exact terms summed in two
// orders (kernels/cuda/optim_cuda.h), plus the final sqrt roundings.
double norm_bound(int64_t n) { return static_cast<double>(n) * std::ldexp(1.0, -53) + 1e-15; }

int64_t count_differing(const std::vector<float>& a, const float* b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; ++i) d += !same_float(a[i], b[i]);
  return d;
}

TEST(TrainStateCuda, AdamWStepsRequantAndExportMatchTheCpuTrainer) {
  FP8RL_REQUIRE_SM90();
  const model::PrecisionPolicy policy{
      .linear = model::Precision::kFP8, .kv_cache = model::Precision::kFP8, .bf16_first_layers = 1};
  auto made = model::Model::Init(model::testing::train_state_config(), policy, 11);
  ASSERT_TRUE(made.ok());
  model::Model& cpu = **made;
  model::testing::randomize(cpu, 5);
  cpu.refresh();
  auto dev = make_cuda_train_device();
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto st = DeviceTrainState::Create(
      cpu, {.adamw = kAdamW, .keep_bf16_copy = true, .keep_transposed = true}, *std::move(dev));
  ASSERT_TRUE(st.ok()) << st.status();
  DeviceTrainState& s = **st;
  model::AdamW opt(cpu, kAdamW);
  const int64_t n = cpu.num_params();
  model::testing::TempDir dir;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g = random_grads(n, 100 + step);
    ASSERT_TRUE(s.device().upload(s.grads(), g.data(), 4 * n).ok());
    auto want = opt.step(cpu, g.data(), 0.75f);
    auto got = s.step(0.75f);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    EXPECT_EQ(want->lr, got->lr);
    EXPECT_EQ(want->clipped, got->clipped);
    EXPECT_LE(std::fabs(got->grad_norm - want->grad_norm), norm_bound(n) * want->grad_norm);
    std::printf("step %d: grad norm cpu %.17g cuda %.17g\n", step, want->grad_norm, got->grad_norm);
    const bool same_clip = kernels::dm::clip_factor(want->grad_norm, kAdamW.max_grad_norm) ==
                           kernels::dm::clip_factor(got->grad_norm, kAdamW.max_grad_norm);
    ASSERT_TRUE(same_clip) << "the two norms straddle an fp32 rounding of the clip factor; the "
                              "comparison below would then be within 1 ulp instead of exact";
    // Same clip factor: every element runs the same fp32 operations (adamw.h, --fmad=false).
    EXPECT_EQ(count_differing(*s.download(s.master()), cpu.params().data(), n), 0);
    EXPECT_EQ(count_differing(*s.download(s.grads()), g.data(), n), 0);
    ASSERT_TRUE(opt.save_state(dir / "opt.safetensors").ok());
    auto cs = model::load_adamw_state(dir / "opt.safetensors", n);
    ASSERT_TRUE(cs.ok());
    EXPECT_EQ(count_differing(*s.download(s.exp_avg()), cs->m.data(), n), 0);
    EXPECT_EQ(count_differing(*s.download(s.exp_avg_sq()), cs->v.data(), n), 0);
    // Re-quantized working copies, bit for bit: codes and scales, and the transposes.
    for (const Fp8Weight& w : s.fp8_weights()) {
      const model::ParamInfo& p = cpu.layout().params()[w.param];
      const float* master = cpu.params().data() + p.offset;
      const model::LinearWeight* lw = nullptr;
      for (int64_t l = 0; l < 3; ++l) {
        for (int64_t j = 0; j < 7; ++j) {
          if (cpu.layer_linear(l, j).master == master) lw = &cpu.layer_linear(l, j);
        }
      }
      ASSERT_NE(lw, nullptr) << p.name;
      auto q = s.device().download_block128(w.codes, w.scales, w.rows, w.cols);
      auto qt = s.device().download_block128(w.t_codes, w.t_scales, w.cols, w.rows);
      ASSERT_TRUE(q.ok() && qt.ok());
      EXPECT_TRUE(q->data == lw->q.data && q->scale_inv == lw->q.scale_inv) << p.name;
      EXPECT_TRUE(qt->data == lw->qt.data && qt->scale_inv == lw->qt.scale_inv) << p.name;
    }
    auto want_set = cpu.export_weights(model::WeightFormat::kFP8, step);
    auto got_set = s.export_fp8(step);
    ASSERT_TRUE(want_set.ok() && got_set.ok()) << got_set.status();
    ASSERT_EQ(want_set->tensors.size(), got_set->tensors.size());
    for (size_t i = 0; i < want_set->tensors.size(); ++i) {
      EXPECT_EQ(want_set->tensors[i].name, got_set->tensors[i].name);
      EXPECT_EQ(want_set->tensors[i].dtype, got_set->tensors[i].dtype);
      EXPECT_TRUE(want_set->tensors[i].bytes == got_set->tensors[i].bytes)
          << want_set->tensors[i].name;
    }
    // BF16 export: rounded on the device, bf16 bits only to the host.
    auto want_bf16 = cpu.export_weights(model::WeightFormat::kBF16, step);
    auto got_bf16 = s.export_bf16(step);
    ASSERT_TRUE(want_bf16.ok() && got_bf16.ok()) << got_bf16.status();
    ASSERT_EQ(want_bf16->tensors.size(), got_bf16->tensors.size());
    for (size_t i = 0; i < want_bf16->tensors.size(); ++i) {
      EXPECT_EQ(want_bf16->tensors[i].name, got_bf16->tensors[i].name);
      EXPECT_TRUE(want_bf16->tensors[i].bytes == got_bf16->tensors[i].bytes)
          << want_bf16->tensors[i].name;
    }
  }
  EXPECT_EQ(s.fp8_weights().size(), 2u * 7u);
}

// ZeRO-2 on the CUDA state: the shard's steps (the adamw kernel, norm given), the working streams
// encoded on the device (quantized block rows, bf16 rounding), install_working (scales to the
// GEMM layout, transposes) and the exports equal the CPU trainer sharded the same way, bit for
// bit (the same check runs on the host mirror in tests/unit/engine/train_state_test.cc).
TEST(TrainStateCuda, ShardStepEncodeInstallAndExportMatchTheCpuTrainer) {
  FP8RL_REQUIRE_SM90();
  for (bool pre_sharded : {false, true}) {
    SCOPED_TRACE(pre_sharded ? "made with its shard" : "made whole, then shard()");
    testing::check_shard_against_cpu(
        [] {
          auto dev = make_cuda_train_device();
          EXPECT_TRUE(dev.ok()) << dev.status();
          return dev.ok() ? std::move(*dev) : nullptr;
        },
        pre_sharded);
  }
}

TEST(TrainStateCuda, KvRecordsEqualTheCpuCalibrator) {
  FP8RL_REQUIRE_SM90();
  auto made = model::Model::Init(model::testing::make_config(97, 64, 96, 2, 4, 2, true), {}, 3);
  ASSERT_TRUE(made.ok());
  auto dev = make_cuda_train_device();
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto st =
      DeviceTrainState::Create(**made, {.adamw = kAdamW, .kv_record_capacity = 5}, *std::move(dev));
  ASSERT_TRUE(st.ok()) << st.status();
  DeviceTrainState& s = **st;
  model::KvCalibrator want(2);
  std::mt19937 gen(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // 4 calls of 3 sequences (the capacity of 5 forces flushes); lengths up to 100k elements so the
  // grid-stride loop and several blocks run; a NaN (skipped) and an inf (kept) in some.
  for (int call = 0; call < 4; ++call) {
    auto first = s.begin_kv_records(3);
    ASSERT_TRUE(first.ok()) << first.status();
    for (int64_t l = 0; l < 2; ++l) {
      for (int64_t q = 0; q < 3; ++q) {
        const int64_t len = 1000 + 33000 * q + call;
        std::vector<float> k(len), v(len);
        for (int64_t i = 0; i < len; ++i) {
          k[i] = normal(gen) * (1 + l);
          v[i] = normal(gen) * 0.1f;
        }
        if (call == 1 && q == 0) k[len / 2] = std::numeric_limits<float>::quiet_NaN();
        if (call == 2 && q == 1) v[7] = -std::numeric_limits<float>::infinity();
        auto amax = [](const std::vector<float>& x) {
          float m = 0;
          for (float e : x) m = std::max(m, std::fabs(e));
          return m;
        };
        want.record(l, amax(k), amax(v));
        kc::DeviceBuffer kd = kc::testing::to_device(k), vd = kc::testing::to_device(v);
        ASSERT_TRUE(s.record_kv_amax(*first + q, l, kd.as<float>(), len, vd.as<float>(), len).ok());
        ASSERT_TRUE(s.device().synchronize().ok());
      }
    }
  }
  ASSERT_TRUE(s.flush_kv_records().ok());
  EXPECT_EQ(s.kv_calibrator().k_records(), want.k_records());
  EXPECT_EQ(s.kv_calibrator().v_records(), want.v_records());
  EXPECT_EQ(s.kv_calibrator().scales().k, want.scales().k);
  EXPECT_EQ(s.kv_calibrator().scales().v, want.scales().v);
}

TEST(OptimCuda, AmaxOfFloatAndBf16EqualsTheHostMirror) {
  FP8RL_REQUIRE_SM90();
  const int64_t n = 1'000'003;
  std::vector<float> x = kc::testing::random_matrix(1, n, 5);
  x[12345] = std::numeric_limits<float>::quiet_NaN();  // skipped on both
  std::vector<uint16_t> b(n);
  for (int64_t i = 0; i < n; ++i) b[i] = kernels::dm::float_to_bf16(x[i]);
  auto host = make_cpu_train_device();
  float want = 0, want_b = 0;
  ASSERT_TRUE(host->amax_into(x.data(), n, &want).ok());
  ASSERT_TRUE(host->amax_into_bf16(b.data(), n, &want_b).ok());
  kc::DeviceBuffer xd = kc::testing::to_device(x), bd = kc::testing::to_device(b);
  kc::DeviceBuffer slots = kc::testing::to_device(std::vector<float>{0.0f, 0.0f});
  FP8RL_ASSERT_OK(kc::amax_into(xd.as<float>(), n, slots.as<float>(), nullptr));
  FP8RL_ASSERT_OK(kc::amax_into_bf16(bd.as<uint16_t>(), n, slots.as<float>() + 1, nullptr));
  const std::vector<float> got = kc::testing::to_host<float>(slots, 2);
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(got[1], want_b);
  EXPECT_GT(want, 0.0f);
}

TEST(OptimCuda, SumOfSquaresIsDeterministicAndWithinItsBoundOfTheCpuSum) {
  FP8RL_REQUIRE_SM90();
  const int64_t n = 3'000'017;
  const std::vector<float> g = random_grads(n, 21);
  kc::DeviceBuffer d = kc::testing::to_device(g);
  auto ws = kc::DeviceBuffer::allocate(kc::kSumSquaresWorkspaceBytes);
  ASSERT_TRUE(ws.ok());
  auto a = kc::scale_and_sum_squares(d.as<float>(), n, 1.0f, ws->data(), nullptr);
  auto b = kc::scale_and_sum_squares(d.as<float>(), n, 1.0f, ws->data(), nullptr);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  EXPECT_EQ(std::bit_cast<uint64_t>(*a), std::bit_cast<uint64_t>(*b));
  double cpu = 0;
  for (float x : g) cpu += static_cast<double>(x) * x;
  EXPECT_LE(std::fabs(*a - cpu), 2 * norm_bound(n) * cpu);
  std::printf("sum of squares n=%lld: cpu %.17g cuda %.17g rel %.3g (bound %.3g)\n",
              static_cast<long long>(n), cpu, *a, std::fabs(*a - cpu) / cpu, 2 * norm_bound(n));
  // Scaling happens in place before the squares.
  auto c = kc::scale_and_sum_squares(d.as<float>(), n, 0.5f, ws->data(), nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, *a * 0.25);  // exact: a power-of-two scale
}

}  // namespace
}  // namespace fp8rl::engine
