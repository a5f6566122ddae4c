// DeviceTrainState on its CPU mirror (make_cpu_train_device) against the CPU trainer: AdamW steps
// bit-identical to model::AdamW, FP8 working copies and the published weight set equal to
// Model::refresh / Model::export_weights(kFP8), KV calibration records equal to the training
// forward's, checkpoints that move between the two trainers, and the errors. The same logic runs
// on the CUDA device in tests/gpu/train_state_cuda_test.cc.
#include "engine/train_state.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/train_ops.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "tests/unit/engine/train_state_shard_check.h"
#include "tests/unit/engine/train_state_test_util.h"

namespace fp8rl::engine {
namespace {

model::ModelConfig small_config(bool tied = false) {
  return model::testing::train_state_config(tied);
}

const model::AdamWConfig& kAdamW = model::testing::kTrainStateAdamW;
using model::testing::random_grads;

bool same_bits(const std::vector<float>& a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      ADD_FAILURE() << "element " << i << ": " << a[i] << " vs " << b[i];
      return false;
    }
  }
  return true;
}

void expect_same_sets(const model::WeightSet& want, const model::WeightSet& got) {
  EXPECT_EQ(want.version, got.version);
  EXPECT_EQ(want.config_json, got.config_json);
  ASSERT_EQ(want.tensors.size(), got.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const model::NamedTensor& a = want.tensors[i];
    const model::NamedTensor& b = got.tensors[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.dtype, b.dtype) << a.name;
    EXPECT_EQ(a.shape, b.shape) << a.name;
    EXPECT_TRUE(a.bytes == b.bytes) << a.name << " differs";
  }
}

// The CPU optimizer's moments, through its state file.
model::AdamWState cpu_state(const model::AdamW& opt, const std::string& path, int64_t n) {
  EXPECT_TRUE(opt.save_state(path).ok());
  auto s = model::load_adamw_state(path, n);
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->step, opt.steps());
  return *std::move(s);
}

struct Pair {
  std::unique_ptr<model::Model> cpu;
  std::unique_ptr<DeviceTrainState> state;
};

Pair make_pair(const model::PrecisionPolicy& policy, const TrainStateOptions& options,
               bool tied = false) {
  auto a = model::Model::Init(small_config(tied), policy, 11);
  EXPECT_TRUE(a.ok()) << a.status();
  model::testing::randomize(**a, 5);
  (*a)->refresh();
  auto state = DeviceTrainState::Create(**a, options, make_cpu_train_device());
  EXPECT_TRUE(state.ok()) << state.status();
  return {std::move(*a), std::move(*state)};
}

class TrainStateSteps : public ::testing::TestWithParam<model::Precision> {};

TEST_P(TrainStateSteps, BitIdenticalToCpuAdamWRefreshAndExport) {
  const model::PrecisionPolicy policy{
      .linear = GetParam(),
      .kv_cache = model::Precision::kFP8,
      .bf16_first_layers = GetParam() == model::Precision::kFP8 ? 1 : 0};
  TrainStateOptions options{.adamw = kAdamW, .keep_bf16_copy = true, .keep_transposed = true};
  Pair p = make_pair(policy, options);
  model::Model& cpu = *p.cpu;
  DeviceTrainState& st = *p.state;
  model::AdamW opt(cpu, kAdamW);
  const int64_t n = cpu.num_params();
  model::testing::TempDir dir;
  int clipped = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g = random_grads(n, 100 + step);
    ASSERT_TRUE(st.device().upload(st.grads(), g.data(), 4 * n).ok());
    auto want = opt.step(cpu, g.data(), 0.75f);
    auto got = st.step(0.75f);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(want->step, got->step);
    EXPECT_EQ(want->lr, got->lr);
    EXPECT_EQ(want->grad_norm, got->grad_norm);  // the host mirror sums in the CPU's order
    EXPECT_EQ(want->clipped, got->clipped);
    clipped += got->clipped;
    EXPECT_TRUE(same_bits(*st.download(st.master()), cpu.params().data(), n));
    EXPECT_TRUE(same_bits(*st.download(st.grads()), g.data(), n));  // left scaled and clipped
    const model::AdamWState cs = cpu_state(opt, dir / "opt.safetensors", n);
    EXPECT_TRUE(same_bits(*st.download(st.exp_avg()), cs.m.data(), n));
    EXPECT_TRUE(same_bits(*st.download(st.exp_avg_sq()), cs.v.data(), n));
    auto want_set = cpu.export_weights(model::WeightFormat::kFP8, step);
    auto got_set = st.export_fp8(step);
    ASSERT_TRUE(want_set.ok() && got_set.ok()) << got_set.status();
    expect_same_sets(*want_set, *got_set);
    // BF16: rounded on the device in pieces of the export scratch.
    auto want_bf16 = cpu.export_weights(model::WeightFormat::kBF16, step);
    auto got_bf16 = st.export_bf16(step);
    ASSERT_TRUE(want_bf16.ok() && got_bf16.ok()) << got_bf16.status();
    expect_same_sets(*want_bf16, *got_bf16);
  }
  EXPECT_GT(clipped, 0);  // the clipping path ran
  // The FP8 working copies (and their transposes) are the CPU model's, as the forward uses them.
  int64_t fp8_count = 0;
  for (int64_t l = 0; l < cpu.config().num_hidden_layers; ++l) {
    for (int64_t j = 0; j < 7; ++j) {
      const model::LinearWeight& w = cpu.layer_linear(l, j);
      const int64_t offset = w.master - cpu.params().data();
      const Fp8Weight* fw = nullptr;
      for (const Fp8Weight& x : st.fp8_weights()) {
        if (cpu.layout().params()[x.param].offset == offset) fw = &x;
      }
      if (w.precision != model::Precision::kFP8) {
        EXPECT_EQ(fw, nullptr);
        continue;
      }
      ASSERT_NE(fw, nullptr);
      ++fp8_count;
      auto q = st.device().download_block128(fw->codes, fw->scales, fw->rows, fw->cols);
      auto qt = st.device().download_block128(fw->t_codes, fw->t_scales, fw->cols, fw->rows);
      ASSERT_TRUE(q.ok() && qt.ok());
      EXPECT_TRUE(q->data == w.q.data && q->scale_inv == w.q.scale_inv);
      EXPECT_TRUE(qt->data == w.qt.data && qt->scale_inv == w.qt.scale_inv);
    }
  }
  EXPECT_EQ(fp8_count, GetParam() == model::Precision::kFP8 ? 2 * 7 : 0);
  // The bf16 copy is master rounded to bf16.
  std::vector<uint16_t> bf16(n);
  ASSERT_TRUE(st.device().download(bf16.data(), st.bf16_params(), 2 * n).ok());
  for (int64_t i = 0; i < n; i += 97) {
    EXPECT_EQ(bf16[i], kernels::dm::float_to_bf16(cpu.params()[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, TrainStateSteps,
                         ::testing::Values(model::Precision::kF32, model::Precision::kBF16,
                                           model::Precision::kFP8),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

// ZeRO-2 on the host mirror: shard, steps on the shard, encoded streams, install and exports
// equal the CPU trainer sharded the same way (the CUDA run: tests/gpu/train_state_cuda_test.cc).
TEST(TrainState, ShardStepEncodeInstallAndExportMatchTheCpuTrainer) {
  for (bool pre_sharded : {false, true}) {
    SCOPED_TRACE(pre_sharded ? "made with its shard" : "made whole, then shard()");
    testing::check_shard_against_cpu([] { return make_cpu_train_device(); }, pre_sharded);
  }
}

TEST(TrainState, NonFiniteGradientSkipsTheStep) {
  Pair p = make_pair({.linear = model::Precision::kFP8}, {.adamw = kAdamW});
  DeviceTrainState& st = *p.state;
  const int64_t n = st.num_params();
  std::vector<float> g = random_grads(n, 3);
  g[n / 2] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(st.device().upload(st.grads(), g.data(), 4 * n).ok());
  const std::vector<float> before = *st.download(st.master());
  auto r = st.step();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.steps(), 0);
  EXPECT_TRUE(same_bits(before, st.download(st.master())->data(), n));
  EXPECT_TRUE(same_bits(std::vector<float>(n, 0.0f), st.download(st.exp_avg())->data(), n));
}

// The forward's own records: K (after RoPE) and V of every sequence of every layer, read back from
// the saved activations and recorded through the state, give the calibrator the same numbers.
TEST(TrainState, KvRecordsEqualTheTrainingForwardsCalibrator) {
  const model::PrecisionPolicy policy{.linear = model::Precision::kBF16,
                                      .kv_cache = model::Precision::kF32};
  // Capacity 4 with 3 sequences per call: the second call flushes the first to the host.
  Pair p = make_pair(policy, {.adamw = kAdamW, .kv_record_capacity = 4});
  model::Model& cpu = *p.cpu;
  DeviceTrainState& st = *p.state;
  const int64_t n_layers = cpu.config().num_hidden_layers;
  const int64_t kvd = cpu.config().num_key_value_heads * cpu.config().head_dim;
  model::KvCalibrator want(n_layers);
  model::Rng rng(4);
  for (int call = 0; call < 3; ++call) {
    const model::TokenBatch batch = {model::testing::random_tokens(rng, 5 + call, 97),
                                     model::testing::random_tokens(rng, 9, 97),
                                     model::testing::random_tokens(rng, 3, 97)};
    engine::CpuTrainStep ctx;
    ASSERT_TRUE(ctx.forward(cpu, batch, {.calibrator = &want}).ok());
    auto first = st.begin_kv_records(static_cast<int64_t>(batch.size()));
    ASSERT_TRUE(first.ok()) << first.status();
    const int64_t m = ctx.tables.rows;
    const std::vector<int64_t> row0(ctx.tables.seq_start.begin(), ctx.tables.seq_start.end() - 1);
    for (int64_t l = 0; l < n_layers; ++l) {
      const engine::TrainLayerBuffers& a = ctx.buffers.layers[l];
      // Host memory is the mirror's device memory.
      if (call == 0) {  // one sequence at a time
        for (size_t s = 0; s < batch.size(); ++s) {
          const int64_t r0 = row0[s], r1 = s + 1 < batch.size() ? row0[s + 1] : m;
          ASSERT_TRUE(st.record_kv_amax(*first + static_cast<int64_t>(s), l, a.k + r0 * kvd,
                                        (r1 - r0) * kvd, a.v + r0 * kvd, (r1 - r0) * kvd)
                          .ok());
        }
      } else {  // the whole batch
        ASSERT_TRUE(st.record_kv_amax_rows(*first, l, a.k, a.v, kvd, row0, m).ok());
      }
    }
  }
  ASSERT_TRUE(st.flush_kv_records().ok());
  EXPECT_EQ(st.kv_calibrator().num_records(), 9);
  EXPECT_EQ(st.kv_calibrator().k_records(), want.k_records());
  EXPECT_EQ(st.kv_calibrator().v_records(), want.v_records());
  const model::KvScales a = want.scales(), b = st.kv_calibrator().scales();
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
  EXPECT_NE(b.k[0], 1.0f);  // calibrated, not the fallback
  ASSERT_TRUE(st.set_kv_scales(b).ok());
  ASSERT_TRUE(cpu.set_kv_scales(a).ok());
  expect_same_sets(*cpu.export_weights(model::WeightFormat::kFP8), *st.export_fp8());
}

TEST(TrainState, AmaxSkipsNanAndKeepsInf) {
  auto dev = make_cpu_train_device();
  float slot = 0;
  const std::vector<float> x = {1.0f, -3.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  ASSERT_TRUE(dev->amax_into(x.data(), 4, &slot).ok());
  EXPECT_EQ(slot, 3.0f);
  const std::vector<float> y = {-std::numeric_limits<float>::infinity()};
  ASSERT_TRUE(dev->amax_into(y.data(), 1, &slot).ok());
  EXPECT_TRUE(std::isinf(slot));
  // bf16 bits: 0xC0A0 = -5, 0x7FC0 = NaN (skipped), 0x3F80 = 1.
  const std::vector<uint16_t> b = {0x3F80, 0xC0A0, 0x7FC0};
  float slot2 = 0;
  ASSERT_TRUE(dev->amax_into_bf16(b.data(), 3, &slot2).ok());
  EXPECT_EQ(slot2, 5.0f);
}

// A checkpoint written by either trainer loads in the other, and both continue identically.
TEST(TrainState, CheckpointsMoveBetweenCpuAndDeviceTrainers) {
  const model::PrecisionPolicy policy{.linear = model::Precision::kFP8,
                                      .kv_cache = model::Precision::kFP8};
  TrainStateOptions options{.adamw = kAdamW};
  Pair p = make_pair(policy, options, /*tied=*/true);
  model::Model& cpu = *p.cpu;
  model::AdamW opt(cpu, kAdamW);
  const int64_t n = cpu.num_params();
  for (int step = 0; step < 2; ++step) {
    std::vector<float> g = random_grads(n, 7 + step);
    ASSERT_TRUE(p.state->device().upload(p.state->grads(), g.data(), 4 * n).ok());
    ASSERT_TRUE(opt.step(cpu, g.data()).ok());
    ASSERT_TRUE(p.state->step().ok());
  }
  ASSERT_TRUE(cpu.set_kv_scales({std::vector<float>(3, 0.02f), std::vector<float>(3, 0.03f)}).ok());
  ASSERT_TRUE(p.state->set_kv_scales(cpu.kv_scales()).ok());
  model::testing::TempDir dir;
  // Device -> CPU.
  ASSERT_TRUE(p.state->save_checkpoint(dir / "from_device").ok());
  model::AdamW opt2(cpu, kAdamW);
  auto cpu2 = load_training_checkpoint(dir / "from_device", policy, &opt2);
  ASSERT_TRUE(cpu2.ok()) << cpu2.status();
  EXPECT_EQ(opt2.steps(), 2);
  EXPECT_TRUE(same_bits(std::vector<float>(cpu.params().begin(), cpu.params().end()),
                        (*cpu2)->params().data(), n));
  EXPECT_EQ((*cpu2)->kv_scales().v, cpu.kv_scales().v);
  // CPU -> device.
  ASSERT_TRUE(save_training_checkpoint(dir / "from_cpu", cpu, opt).ok());
  auto st2 =
      DeviceTrainState::LoadCheckpoint(dir / "from_cpu", policy, options, make_cpu_train_device());
  ASSERT_TRUE(st2.ok()) << st2.status();
  EXPECT_EQ((*st2)->steps(), 2);
  // One more identical step everywhere: the moments and step counts came across.
  const std::vector<float> g = random_grads(n, 99);
  std::vector<float> g_cpu = g, g_cpu2 = g;
  ASSERT_TRUE((*st2)->device().upload((*st2)->grads(), g.data(), 4 * n).ok());
  ASSERT_TRUE(opt.step(cpu, g_cpu.data()).ok());
  ASSERT_TRUE(opt2.step(**cpu2, g_cpu2.data()).ok());
  ASSERT_TRUE((*st2)->step().ok());
  EXPECT_TRUE(same_bits(*(*st2)->download((*st2)->master()), cpu.params().data(), n));
  EXPECT_TRUE(same_bits(std::vector<float>(cpu.params().begin(), cpu.params().end()),
                        (*cpu2)->params().data(), n));
  expect_same_sets(*cpu.export_weights(model::WeightFormat::kFP8, 3), *(*st2)->export_fp8(3));
}

// FP8 codes loaded from an FP8 checkpoint are used as they are until the first step, on both.
TEST(TrainState, PinnedFp8CodesExportAsTheModelHoldsThem) {
  const model::PrecisionPolicy policy{.linear = model::Precision::kFP8, .pow2_scales = true};
  Pair p = make_pair(policy, {.adamw = kAdamW});
  model::testing::TempDir dir;
  ASSERT_TRUE(p.cpu->save(dir / "fp8", model::WeightFormat::kFP8).ok());
  auto loaded = model::Model::Load(dir / "fp8", policy);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto st = DeviceTrainState::Create(**loaded, {.adamw = kAdamW}, make_cpu_train_device());
  ASSERT_TRUE(st.ok());
  expect_same_sets(*(*loaded)->export_weights(model::WeightFormat::kFP8), *(*st)->export_fp8());
}

TEST(TrainState, ErrorsNameTheProblem) {
  auto m = model::Model::Init(small_config(), {}, 1);
  ASSERT_TRUE(m.ok());
  model::AdamWConfig bad = kAdamW;
  bad.lr = 0;
  auto st = DeviceTrainState::Create(**m, {.adamw = bad}, make_cpu_train_device());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("lr"), std::string::npos);
  EXPECT_FALSE(DeviceTrainState::Create(**m, {.adamw = kAdamW}, nullptr).ok());
  auto inf = model::Model::ForInference(small_config(), {.linear = model::Precision::kBF16});
  ASSERT_TRUE(inf.ok());
  EXPECT_FALSE(DeviceTrainState::Create(**inf, {.adamw = kAdamW}, make_cpu_train_device()).ok());

  auto good = DeviceTrainState::Create(**m, {.adamw = kAdamW, .kv_record_capacity = 2},
                                       make_cpu_train_device());
  ASSERT_TRUE(good.ok());
  DeviceTrainState& s = **good;
  EXPECT_EQ(s.begin_kv_records(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.begin_kv_records(3).status().code(), absl::StatusCode::kInvalidArgument);
  const float x[2] = {1, 2};
  EXPECT_FALSE(s.record_kv_amax(0, 0, x, 2, x, 2).ok());  // nothing reserved
  ASSERT_TRUE(s.begin_kv_records(1).ok());
  EXPECT_TRUE(s.record_kv_amax(0, 0, x, 2, x, 2).ok());
  EXPECT_FALSE(s.record_kv_amax(0, 3, x, 2, x, 2).ok());  // layer out of range
  const std::vector<int64_t> row0 = {0, 3};  // the second sequence starts past the 2 rows
  EXPECT_EQ(s.record_kv_amax_rows(0, 0, x, x, 1, row0, 2).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(s.set_kv_scales({{1.0f, 0.0f, 1.0f}, {1.0f, 1.0f, 1.0f}}).ok());
  EXPECT_FALSE(s.set_kv_scales({{1.0f}, {1.0f}}).ok());
  EXPECT_EQ(s.set_lr(-1).code(), absl::StatusCode::kInvalidArgument);
  model::testing::TempDir dir;
  EXPECT_FALSE(s.load_optimizer_state(dir / "missing.safetensors").ok());
  ASSERT_TRUE(model::save_adamw_state(dir / "short.safetensors", {1.0f}, {1.0f}, 1).ok());
  auto wrong = s.load_optimizer_state(dir / "short.safetensors");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
}

// Without an sm_90 device (or without CUDA in the build) asking for the CUDA device is a clear
// error, never a crash; with one it is a working device.
TEST(TrainState, CudaDeviceIsAnErrorWithoutAGpu) {
  auto dev = make_cuda_train_device();
  if (dev.ok()) {
    EXPECT_EQ((*dev)->name(), "cuda");
    return;
  }
  EXPECT_TRUE(dev.status().code() == absl::StatusCode::kFailedPrecondition ||
              dev.status().code() == absl::StatusCode::kUnimplemented)
      << dev.status();
  EXPECT_FALSE(dev.status().message().empty());
}

TEST(TrainState, MemoryPlanCountsWhatIsHeld) {
  const model::ModelConfig c = small_config();
  const int64_t n = model::ParamLayout(c).total();
  const TrainStateBytes fp8 = plan_train_state_bytes(c, {.linear = model::Precision::kFP8},
                                                     {.adamw = {}, .keep_transposed = true});
  const TrainStateBytes bf16 = plan_train_state_bytes(c, {.linear = model::Precision::kBF16}, {});
  EXPECT_GE(fp8.master, 4 * n);
  EXPECT_EQ(fp8.master, fp8.grads);
  EXPECT_EQ(fp8.moments, 2 * fp8.master);
  EXPECT_EQ(bf16.fp8_weights, 0);
  // 3 layers x 7 linears, codes at least numel bytes, times 2 for the transposes.
  // Codes alone: per layer q, o [160, 160], k, v [32, 160], gate, up, down 272 x 160.
  EXPECT_GE(fp8.fp8_weights, 2 * 3 * (2 * 160 * 160 + 2 * 32 * 160 + 3 * 272 * 160));
  EXPECT_EQ(fp8.total(), fp8.master + fp8.grads + fp8.moments + fp8.fp8_weights + fp8.bf16_copy +
                             fp8.kv_records + fp8.export_scratch);
}

}  // namespace
}  // namespace fp8rl::engine
