// ZeRO-2 on DeviceTrainState against the CPU trainer sharded the same way (model::Model with a
// sharded master, model::AdamW::step_shard, Model::encode_working / install_working /
// export_weights), for any TrainDevice: run on the host mirror in train_state_test.cc and on CUDA
// in tests/gpu/train_state_cuda_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/train_state.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "tests/unit/engine/train_state_test_util.h"

namespace fp8rl::engine::testing {

// The policy a sharded group trains under: FP8 linears, the first layer's in BF16 (both kinds of
// working copy), bf16 activations.
inline model::PrecisionPolicy shard_check_policy() {
  return {
      .linear = model::Precision::kFP8, .kv_cache = model::Precision::kFP8, .bf16_first_layers = 1};
}

inline std::unique_ptr<model::Model> shard_check_model() {
  auto made = model::Model::Init(model::testing::train_state_config(), shard_check_policy(), 11);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return nullptr;
  model::testing::randomize(**made, 5);
  (*made)->refresh();
  return std::move(*made);
}

// Three pieces: the first cut at a 128-row boundary inside an FP8 linear (the block rows of a
// tensor quantized on two ranks; train_state_config's MLP linears have 272 rows), the second at
// the allowed point nearest 2/3 of the parameters.
inline std::vector<int64_t> shard_check_cuts(const model::Model& m) {
  std::vector<int64_t> allowed, inside_fp8;
  const int64_t layers = m.config().num_hidden_layers;
  for (const model::ParamInfo& p : m.layout().params()) {
    allowed.push_back(p.offset);
    if (p.shape.size() != 2) continue;
    const bool fp8 = p.kind == model::ParamKind::kLinear &&
                     m.policy().layer_linear(p.layer, layers) == model::Precision::kFP8;
    for (int64_t row = 128; row < p.shape[0]; row += 128) {
      allowed.push_back(p.offset + row * p.shape[1]);
      if (fp8) inside_fp8.push_back(p.offset + row * p.shape[1]);
    }
  }
  const int64_t n = m.num_params();
  auto nearest = [](const std::vector<int64_t>& from, int64_t after, int64_t target) {
    int64_t best = -1;
    for (int64_t a : from) {
      if (a > after && (best < 0 || std::abs(a - target) < std::abs(best - target))) best = a;
    }
    return best;
  };
  const int64_t first = nearest(inside_fp8, 0, n / 3);
  EXPECT_GT(first, 0) << "no 128-row boundary inside an FP8 linear";
  const int64_t second = nearest(allowed, std::max<int64_t>(first, 0), 2 * n / 3);
  return {0, first, second < 0 ? n : second, n};
}

// For each piece [b, e): a fresh state on make_device() sharded to it (made whole then shard(),
// or with `pre_sharded` made with the shard in its options, never holding the whole master) and
// a CPU model + AdamW
// sharded to it take two steps on the same gradients and norm: master shard, moments, clipped
// gradients and the encoded working streams equal bit for bit. Then every piece's streams,
// installed in the last state, give the FP8 export of the CPU model with the same streams
// installed; the BF16 and F32 exports from the gathered master equal the CPU model's too.
inline void check_shard_against_cpu(
    const std::function<std::unique_ptr<TrainDevice>()>& make_device, bool pre_sharded) {
  std::unique_ptr<model::Model> probe = shard_check_model();
  ASSERT_NE(probe, nullptr);
  const std::vector<int64_t> cuts = shard_check_cuts(*probe);
  const int64_t n = probe->num_params();
  bool cut_inside = false;
  for (size_t r = 1; r + 1 < cuts.size(); ++r) {
    for (const model::ParamInfo& p : probe->layout().params()) {
      cut_inside = cut_inside || (cuts[r] > p.offset && cuts[r] < p.offset + p.numel);
    }
  }
  EXPECT_TRUE(cut_inside) << "no cut falls at a 128-row boundary inside a tensor";
  model::Model::WorkingStreams all;
  std::vector<float> whole_master;
  std::unique_ptr<DeviceTrainState> last;
  for (size_t r = 0; r + 1 < cuts.size(); ++r) {
    const int64_t b = cuts[r], e = cuts[r + 1];
    SCOPED_TRACE(::testing::Message() << "piece [" << b << ", " << e << ")");
    std::unique_ptr<model::Model> cpu = shard_check_model();
    ASSERT_NE(cpu, nullptr);
    TrainStateOptions options{.adamw = model::testing::kTrainStateAdamW, .keep_transposed = true};
    if (pre_sharded) {
      options.shard_begin = b;
      options.shard_end = e;
    }
    auto st = DeviceTrainState::Create(*cpu, options, make_device());
    ASSERT_TRUE(st.ok()) << st.status();
    DeviceTrainState& s = **st;
    model::AdamW opt(*cpu, model::testing::kTrainStateAdamW);
    ASSERT_TRUE(cpu->shard_master(b, e).ok());
    ASSERT_TRUE(opt.shard(b, e).ok());
    if (!pre_sharded) {
      ASSERT_TRUE(s.shard(b, e).ok());
    }
    EXPECT_TRUE(s.sharded());
    EXPECT_EQ(s.shard_begin(), b);
    EXPECT_EQ(s.shard_size(), e - b);
    EXPECT_EQ(s.shard(b, e).code(), absl::StatusCode::kFailedPrecondition);
    for (int step = 0; step < 2; ++step) {
      std::vector<float> g_cpu = model::testing::random_grads(e - b, 300 + 10 * r + step);
      std::vector<float> g_dev = g_cpu;
      const double norm = 2.0 + step;  // above max_grad_norm: the clip applies
      auto want = opt.step_shard(cpu->params(), g_cpu, norm, cpu->master_begin());
      auto got = s.step_shard(g_dev, norm);
      ASSERT_TRUE(want.ok() && got.ok()) << got.status();
      EXPECT_EQ(got->lr, want->lr);
      EXPECT_EQ(got->clipped, want->clipped);
      EXPECT_EQ(got->step, want->step);
      EXPECT_EQ(0, std::memcmp(g_dev.data(), g_cpu.data(), g_cpu.size() * 4)) << "clipped grads";
      auto master = s.download_master();
      ASSERT_TRUE(master.ok()) << master.status();
      ASSERT_EQ(std::ssize(*master), e - b);
      EXPECT_EQ(0, std::memcmp(master->data(), cpu->params().data(), master->size() * 4))
          << "step " << step;
      auto range = s.range_state();
      ASSERT_TRUE(range.ok()) << range.status();
      const model::AdamW::RangeState cpu_range = opt.range_state();
      EXPECT_EQ(range->step, cpu_range.step);
      EXPECT_EQ(0, std::memcmp(range->m.data(), cpu_range.m.data(), cpu_range.m.size() * 4));
      EXPECT_EQ(0, std::memcmp(range->v.data(), cpu_range.v.data(), cpu_range.v.size() * 4));
    }
    auto got = s.encode_working();
    auto want = cpu->encode_working(b, e);
    ASSERT_TRUE(got.ok() && want.ok()) << got.status() << " / " << want.status();
    EXPECT_FALSE(want->codes.empty() && want->bf16.empty());
    EXPECT_TRUE(got->codes == want->codes) << "FP8 codes";
    EXPECT_TRUE(got->scales == want->scales) << "block scales";
    EXPECT_TRUE(got->bf16 == want->bf16) << "bf16 bits";
    all.codes.insert(all.codes.end(), want->codes.begin(), want->codes.end());
    all.scales.insert(all.scales.end(), want->scales.begin(), want->scales.end());
    all.bf16.insert(all.bf16.end(), want->bf16.begin(), want->bf16.end());
    whole_master.insert(whole_master.end(), cpu->params().begin(), cpu->params().end());
    // A sharded state refuses what needs the whole master.
    EXPECT_EQ(s.step().status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.export_f32().status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.save_optimizer_state("/nonexistent/x").code(),
              absl::StatusCode::kFailedPrecondition);
    last = std::move(*st);
  }
  ASSERT_NE(last, nullptr);
  ASSERT_EQ(std::ssize(whole_master), n);
  model::Model::WorkingStreams short_codes = all;
  short_codes.codes.pop_back();
  EXPECT_EQ(last->install_working(short_codes).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(last->install_working(all).ok());
  // The CPU reference: a model sharded to the last piece with the same streams installed.
  std::unique_ptr<model::Model> ref = shard_check_model();
  ASSERT_NE(ref, nullptr);
  ASSERT_TRUE(ref->shard_master(cuts[2], cuts[3]).ok());
  ASSERT_TRUE(ref->install_working(all).ok());
  auto compare = [](const absl::StatusOr<model::WeightSet>& got,
                    const absl::StatusOr<model::WeightSet>& want, const std::string& what) {
    ASSERT_TRUE(got.ok() && want.ok()) << what << ": " << got.status() << " / " << want.status();
    ASSERT_EQ(got->tensors.size(), want->tensors.size()) << what;
    for (size_t i = 0; i < want->tensors.size(); ++i) {
      EXPECT_EQ(got->tensors[i].name, want->tensors[i].name) << what;
      EXPECT_EQ(got->tensors[i].dtype, want->tensors[i].dtype) << what;
      EXPECT_TRUE(got->tensors[i].bytes == want->tensors[i].bytes)
          << what << ": " << want->tensors[i].name;
    }
  };
  compare(last->export_fp8(4), ref->export_weights(model::WeightFormat::kFP8, 4), "FP8 export");
  for (model::WeightFormat f : {model::WeightFormat::kBF16, model::WeightFormat::kF32}) {
    compare(last->export_with_master(f, 4, whole_master), ref->export_weights(f, 4, whole_master),
            f == model::WeightFormat::kF32 ? "F32 export" : "BF16 export");
  }
}

}  // namespace fp8rl::engine::testing
