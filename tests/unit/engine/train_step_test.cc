// The training step (engine/train_step.h) over the CPU ops (CpuTrainOps: kernels/cpu +
// model/linear.h + model/moe.h), per precision policy, with the KV fake-quantization on and off,
// dense and mixture-of-experts, over several packed sequences: packing leaks nothing across
// sequences (each sequence's logprobs, KV records and routing equal those of a forward of that
// sequence alone), activation recomputation changes no bit, every parameter tensor receives a
// gradient, and gradients are reported final from the end. The values themselves are checked
// against float64 PyTorch (tests/unit/model/model_golden_test.cc, moe_test.cc), by finite
// differences, and pinned by the learner's golden digests (tests/unit/train/learner_test.cc).
#include "engine/train_step.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "engine/cpu/train_ops.h"
#include "kernels/gemm.h"
#include "kernels/quantize.h"
#include "model/linear.h"
#include "model/rng.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::engine {
namespace {

struct Case {
  model::Precision linear;
  model::KvCacheDtype kv;
  bool kv_fake_quant;
  int arch;            // 0: Llama (tied embedding), 1: Qwen2 (q/k/v bias), 2: Qwen3 (q/k norm)
  bool mixed = false;  // FP8 recipe with layer 0 kept in bf16 and power-of-two scales
};

std::string case_name(const Case& c) {
  static const char* kArch[] = {"llama", "qwen2", "qwen3"};
  return std::string(precision_name(c.linear)) + "_kv_" + std::string(precision_name(c.kv)) +
         (c.kv_fake_quant ? "_fq_" : "_nofq_") + kArch[c.arch] + (c.mixed ? "_mixed" : "");
}

model::ModelConfig config_for(int arch, int64_t vocab) {
  switch (arch) {
    case 1:
      return model::testing::make_config(vocab, 128, 256, 2, 4, 2, false, /*qwen2=*/true);
    case 2:
      return model::testing::make_qwen3_config(vocab, 128, 256, 2, 4, 2, 48, false);
    default:
      return model::testing::make_config(vocab, 128, 256, 2, 4, 1, true);
  }
}

// Each packed sequence's logprobs as a forward of that sequence alone gives them: bit for bit
// where every linear accumulates in double (bf16 / FP8 linears: a row's value does not depend on
// the other rows), within 1e-5 relative for fp32 linears (sgemm's last bits depend on the rows).
void expect_like_alone(const model::TokenValues& got, const model::TokenValues& alone,
                       bool bitwise) {
  ASSERT_EQ(got.size(), alone.size());
  double norm = 0;
  for (size_t s = 0; s < alone.size(); ++s) {
    ASSERT_EQ(got[s].size(), alone[s].size());
    for (size_t i = 0; i < alone[s].size(); ++i) {
      if (bitwise) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[s][i]), std::bit_cast<uint32_t>(alone[s][i]))
            << "sequence " << s << " token " << i << ": " << got[s][i] << " vs " << alone[s][i];
      } else {
        ASSERT_NEAR(got[s][i], alone[s][i], 1e-5 * std::fabs(alone[s][i]) + 1e-6)
            << "sequence " << s << " token " << i;
      }
      norm += std::fabs(alone[s][i]);
    }
  }
  ASSERT_GT(norm, 0.0);
}

class TrainStepTest : public ::testing::TestWithParam<Case> {};

// Three packed sequences (lengths 9, 2 and 71: the last spans two lm_head chunks), random
// weights, random non-zero dL/dlogp except one all-zero sequence (its lm_head chunk is skipped),
// gradients accumulated into a random non-zero array: logprobs and KV calibration records as each
// sequence alone gives them; every gradient bit for bit the same with activation recomputation
// per layer; every tensor moved; gradients reported final from the final norm down to 0.
TEST_P(TrainStepTest, PackedLogprobsRecomputationAndGradients) {
  const Case c = GetParam();
  constexpr int64_t kVocab = 160;
  model::PrecisionPolicy policy;
  policy.linear = c.linear;
  policy.kv_cache = c.kv;
  policy.train_kv_fake_quant = c.kv_fake_quant;
  if (c.mixed) {
    policy.bf16_first_layers = 1;
    policy.pow2_scales = true;
  }
  const model::ModelConfig config = config_for(c.arch, kVocab);
  auto made = model::Model::Init(config, policy, 5, 0.05f);
  ASSERT_TRUE(made.ok()) << made.status();
  model::Model& model = **made;
  model::testing::randomize(model, 11);
  if (c.kv == model::KvCacheDtype::kFP8) {
    model::KvScales s = model.kv_scales();
    for (auto& k : s.k) k = 0.03f;
    for (auto& v : s.v) v = 0.02f;
    ASSERT_TRUE(model.set_kv_scales(s).ok());
  }
  model::Rng rng(3);
  model::TokenBatch batch;
  for (int64_t n : {9, 2, 71}) batch.push_back(model::testing::random_tokens(rng, n, kVocab));
  const float temperature = 0.7f;

  const bool bitwise = c.linear != model::Precision::kF32;
  model::KvCalibrator alone_cal(config.num_hidden_layers), cal(config.num_hidden_layers);
  model::TokenValues alone;
  for (const std::vector<int32_t>& seq : batch) {
    auto one = cpu_logprobs(model, {seq}, {.temperature = temperature, .calibrator = &alone_cal});
    ASSERT_TRUE(one.ok()) << one.status();
    alone.push_back((*one)[0]);
  }
  CpuTrainStep step;
  auto got = step.forward(model, batch, {.temperature = temperature, .calibrator = &cal});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_NO_FATAL_FAILURE(expect_like_alone(*got, alone, bitwise));
  EXPECT_EQ(cal.num_records(), 3);
  if (bitwise) {
    EXPECT_EQ(cal.k_records(), alone_cal.k_records());
    EXPECT_EQ(cal.v_records(), alone_cal.v_records());
  }

  model::TokenValues dlogp(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    dlogp[s].resize(batch[s].size() - 1);
    for (float& v : dlogp[s]) v = s == 1 ? 0.0f : static_cast<float>(rng.normal());
  }
  const int64_t n = model.num_params();
  std::vector<float> init(n);
  for (float& v : init) v = static_cast<float>(1e-3 * rng.normal());
  std::vector<float> grads = init;
  std::vector<int64_t> finals;
  ASSERT_TRUE(train_backward(config, policy, model.layout(), *step.ops, step.buffers, step.tables,
                             dlogp, grads.data(), step.opts,
                             [&](int64_t from) { finals.push_back(from); })
                  .ok());
  // Every parameter tensor received a gradient.
  for (const model::ParamInfo& info : model.layout().params()) {
    double moved = 0;
    for (int64_t i = 0; i < info.numel; ++i) {
      const int64_t at = info.offset + i;
      ASSERT_TRUE(std::isfinite(grads[at])) << info.name << "[" << i << "]";
      moved += std::fabs(grads[at] - init[at]);
    }
    EXPECT_GT(moved, 0.0) << info.name << " got no gradient";
  }
  // Activation recomputation per layer: fewer saved floats, the same logprobs and gradients.
  CpuTrainStep re;
  const TrainStepOptions re_opts{.temperature = temperature, .recompute_layers = true};
  auto re_lp = re.forward(model, batch, re_opts);
  ASSERT_TRUE(re_lp.ok()) << re_lp.status();
  EXPECT_EQ(*re_lp, *got);
  EXPECT_LT(train_buffer_floats(config, step.tables.rows, re_opts),
            train_buffer_floats(config, step.tables.rows, step.opts));
  std::vector<float> re_grads = init;
  ASSERT_TRUE(re.backward(model, dlogp, re_grads.data()).ok());
  ASSERT_EQ(0, std::memcmp(re_grads.data(), grads.data(), n * sizeof(float)))
      << "recompute_layers changed a gradient";
  // on_final: from the final norm down to 0, decreasing.
  ASSERT_FALSE(finals.empty());
  EXPECT_EQ(finals.front(), model.layout().final_norm());
  EXPECT_EQ(finals.back(), 0);
  for (size_t i = 1; i < finals.size(); ++i) EXPECT_LT(finals[i], finals[i - 1]);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, TrainStepTest,
    ::testing::Values(Case{model::Precision::kF32, model::KvCacheDtype::kF32, true, 0},
                      Case{model::Precision::kF32, model::KvCacheDtype::kFP8, true, 2},
                      Case{model::Precision::kF32, model::KvCacheDtype::kFP8, false, 1},
                      Case{model::Precision::kBF16, model::KvCacheDtype::kBF16, true, 1},
                      Case{model::Precision::kBF16, model::KvCacheDtype::kFP8, true, 0},
                      Case{model::Precision::kBF16, model::KvCacheDtype::kFP8, false, 2},
                      Case{model::Precision::kFP8, model::KvCacheDtype::kFP8, true, 0},
                      Case{model::Precision::kFP8, model::KvCacheDtype::kFP8, false, 1},
                      Case{model::Precision::kFP8, model::KvCacheDtype::kBF16, true, 2},
                      Case{model::Precision::kFP8, model::KvCacheDtype::kFP8, true, 2, true}),
    [](const auto& info) { return case_name(info.param); });

struct MoeCase {
  model::Precision linear;
  bool qwen2_moe;  // shared expert and q/k/v bias; else qwen3_moe (q/k norm, norm_topk_prob)
  bool replay;     // a routing record replayed (partly covering, mostly unlike the router's choice)
  double aux_coef = 0.0;    // load-balancing loss weight
  bool all_sparse = false;  // no dense layer (else the middle layer is dense)
};

std::string moe_case_name(const MoeCase& c) {
  return std::string(precision_name(c.linear)) + (c.qwen2_moe ? "_qwen2_moe" : "_qwen3_moe") +
         (c.replay ? "_replay" : "_fresh") + (c.aux_coef > 0 ? "_aux" : "") +
         (c.all_sparse ? "_all_sparse" : "");
}

class MoeTrainStepTest : public ::testing::TestWithParam<MoeCase> {};

// Mixture of experts through TrainOps::moe / moe_backward (CpuTrainOps: model/moe.h): three
// layers, the middle one dense (mlp_only_layers) or all sparse, three packed sequences (9, 2 and 71
// tokens), random weights and random non-zero dL/dlogp. Logprobs and the routing (experts used,
// the router's own choice, replay counts) as each sequence alone gives them; tokens per expert
// and the load-balancing loss those of the whole batch; every gradient (router, experts, shared
// expert, and the rest) moved and bit for bit the same with activation recomputation; fresh or
// replayed routing, with and without the load-balancing loss.
TEST_P(MoeTrainStepTest, PackedLogprobsRoutingRecomputationAndGradients) {
  const MoeCase c = GetParam();
  constexpr int64_t kVocab = 160;
  model::PrecisionPolicy policy;
  policy.linear = c.linear;
  policy.kv_cache = model::KvCacheDtype::kBF16;
  policy.train_kv_fake_quant = true;
  namespace mt = model::testing;
  model::ModelConfig config =
      c.qwen2_moe ? mt::make_qwen2_moe_config(kVocab, 128, 256, 3, 4, 2, true, 4, 2, 64, 96)
                  : mt::make_qwen3_moe_config(kVocab, 128, 256, 3, 4, 2, 48, false, 4, 2, 64, true);
  if (!c.all_sparse) config.moe.mlp_only_layers = {1};
  const int64_t n_sparse = c.all_sparse ? 3 : 2;
  ASSERT_EQ(config.num_sparse_layers(), n_sparse);
  auto made = model::Model::Init(config, policy, 5, 0.05f);
  ASSERT_TRUE(made.ok()) << made.status();
  model::Model& model = **made;
  mt::randomize(model, 21, 0.1);
  model::Rng rng(7);
  model::TokenBatch batch;
  for (int64_t n : {9, 2, 71}) batch.push_back(mt::random_tokens(rng, n, kVocab));
  // A record of k distinct random experts per token and sparse layer: all but the last token of
  // sequence 0, none of sequence 1, every token of sequence 2.
  const int64_t k = config.moe.num_experts_per_tok, n_exp = config.moe.num_experts,
                width = config.num_sparse_layers() * k;
  model::TokenRouting record(batch.size());
  for (size_t s : {size_t{0}, size_t{2}}) {
    const int64_t tokens = static_cast<int64_t>(batch[s].size()) - (s == 0 ? 1 : 0);
    for (int64_t g = 0; g < tokens * width / k; ++g) {
      std::vector<int32_t> perm(n_exp);
      for (int64_t e = 0; e < n_exp; ++e) perm[e] = static_cast<int32_t>(e);
      for (int64_t e = n_exp - 1; e > 0; --e) std::swap(perm[e], perm[rng.next() % (e + 1)]);
      record[s].insert(record[s].end(), perm.begin(), perm.begin() + k);
    }
  }
  const float temperature = 0.7f;
  const bool bitwise = c.linear != model::Precision::kF32;
  model::ForwardRouting routing;
  model::TokenValues alone;
  std::vector<model::ForwardRouting> alone_routing(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    const model::TokenRouting one_record = {record[s]};
    auto one = cpu_logprobs(model, {batch[s]},
                            {.temperature = temperature,
                             .replay = c.replay ? &one_record : nullptr,
                             .router_aux_loss_coef = c.aux_coef,
                             .routing_out = &alone_routing[s]});
    ASSERT_TRUE(one.ok()) << one.status();
    alone.push_back((*one)[0]);
  }
  const TrainStepOptions opts{.temperature = temperature,
                              .replay = c.replay ? &record : nullptr,
                              .router_aux_loss_coef = c.aux_coef,
                              .routing_out = &routing};
  CpuTrainStep step;
  auto got = step.forward(model, batch, opts);
  ASSERT_TRUE(got.ok()) << got.status();
  // Only a dense layer has buffers for a dense MLP.
  EXPECT_EQ(step.buffers.layers[0].g, nullptr);
  EXPECT_EQ(step.buffers.layers[1].g == nullptr, c.all_sparse);
  EXPECT_EQ(step.buffers.layers[2].act, nullptr);
  EXPECT_EQ(step.buffers.dact == nullptr, c.all_sparse);
  ASSERT_NO_FATAL_FAILURE(expect_like_alone(*got, alone, bitwise));
  // The routing report: per sequence as alone; the counts are the batch's sums.
  ASSERT_EQ(routing.used.size(), batch.size());
  int64_t replayed = 0, overrode = 0;
  std::vector<int64_t> expert_tokens(routing.expert_tokens.size(), 0);
  for (size_t s = 0; s < batch.size(); ++s) {
    if (bitwise) {
      EXPECT_EQ(routing.used[s], alone_routing[s].used[0]) << "sequence " << s;
      EXPECT_EQ(routing.chosen[s], alone_routing[s].chosen[0]) << "sequence " << s;
    }
    replayed += alone_routing[s].replayed_tokens;
    overrode += alone_routing[s].replay_overrode;
    ASSERT_EQ(alone_routing[s].expert_tokens.size(), expert_tokens.size());
    for (size_t e = 0; e < expert_tokens.size(); ++e) {
      expert_tokens[e] += alone_routing[s].expert_tokens[e];
    }
  }
  EXPECT_EQ(routing.replayed_tokens, replayed);
  if (bitwise) {
    EXPECT_EQ(routing.replay_overrode, overrode);
    EXPECT_EQ(routing.expert_tokens, expert_tokens);
  }
  EXPECT_GT(routing.aux_loss, 0.0);
  if (c.replay) {
    // The record was followed where it exists, and it differed from the router's own choice.
    EXPECT_EQ(routing.replayed_tokens, 8 + 71);
    EXPECT_GT(routing.replay_overrode, 0);
    EXPECT_TRUE(std::equal(record[0].begin(), record[0].end(), routing.used[0].begin()));
    EXPECT_EQ(record[2], routing.used[2]);
    EXPECT_NE(routing.used, routing.chosen);
  } else {
    EXPECT_EQ(routing.replayed_tokens, 0);
    EXPECT_EQ(routing.used, routing.chosen);
  }

  model::TokenValues dlogp(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    dlogp[s].resize(batch[s].size() - 1);
    for (float& v : dlogp[s]) v = static_cast<float>(rng.normal());
  }
  const int64_t n = model.num_params();
  std::vector<float> init(n);
  for (float& v : init) v = static_cast<float>(1e-3 * rng.normal());
  std::vector<float> grads = init;
  ASSERT_TRUE(step.backward(model, dlogp, grads.data()).ok());
  int64_t expert_tensors = 0;
  for (const model::ParamInfo& info : model.layout().params()) {
    double moved = 0;
    for (int64_t i = 0; i < info.numel; ++i) {
      const int64_t at = info.offset + i;
      ASSERT_TRUE(std::isfinite(grads[at])) << info.name << "[" << i << "]";
      moved += std::fabs(grads[at] - init[at]);
    }
    EXPECT_GT(moved, 0.0) << info.name << " got no gradient";
    expert_tensors += info.name.find(".experts.") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(expert_tensors, n_sparse * n_exp * 3);  // sparse layers x E experts x gate, up, down
  // Activation recomputation per layer: the same logprobs and gradients.
  CpuTrainStep re;
  TrainStepOptions re_opts = opts;
  re_opts.recompute_layers = true;
  re_opts.routing_out = nullptr;
  auto re_lp = re.forward(model, batch, re_opts);
  ASSERT_TRUE(re_lp.ok()) << re_lp.status();
  EXPECT_EQ(*re_lp, *got);
  std::vector<float> re_grads = init;
  ASSERT_TRUE(re.backward(model, dlogp, re_grads.data()).ok());
  ASSERT_EQ(0, std::memcmp(re_grads.data(), grads.data(), n * sizeof(float)))
      << "recompute_layers changed a gradient";
}

INSTANTIATE_TEST_SUITE_P(Policies, MoeTrainStepTest,
                         ::testing::Values(MoeCase{model::Precision::kBF16, false, false},
                                           MoeCase{model::Precision::kBF16, false, true, 0.05},
                                           MoeCase{model::Precision::kBF16, true, false, 0.05},
                                           MoeCase{model::Precision::kBF16, true, true},
                                           MoeCase{model::Precision::kFP8, false, false, 0.05},
                                           MoeCase{model::Precision::kFP8, false, true},
                                           MoeCase{model::Precision::kFP8, true, false},
                                           MoeCase{model::Precision::kFP8, true, true, 0.05},
                                           MoeCase{model::Precision::kF32, false, true, 0.05},
                                           MoeCase{model::Precision::kF32, true, false},
                                           MoeCase{model::Precision::kBF16, false, true, 0.05,
                                                   true},
                                           MoeCase{model::Precision::kFP8, true, false, 0.0, true}),
                         [](const auto& info) { return moe_case_name(info.param); });

// ZeRO-3's hook: each unit's working copies installed from the whole model's streams right before
// the step needs them and dropped right after.
class JustInTimeUnits final : public UnitWeights {
 public:
  JustInTimeUnits(const model::Model& source, model::Model& target)
      : source_(source), target_(target) {}
  absl::Status acquire(int64_t unit) override {
    order.push_back(unit);
    for (const auto& [b, e] : ranges(unit)) {
      auto streams = source_.encode_working(b, e);
      if (!streams.ok()) return streams.status();
      if (auto s = target_.install_working_range(*streams, b, e); !s.ok()) return s;
    }
    ++held;
    max_held = std::max(max_held, held);
    return absl::OkStatus();
  }
  void release(int64_t unit) override {
    for (const auto& [b, e] : ranges(unit)) EXPECT_TRUE(target_.drop_working_range(b, e).ok());
    --held;
  }
  std::vector<int64_t> order;
  int held = 0, max_held = 0;

 private:
  std::vector<std::pair<int64_t, int64_t>> ranges(int64_t unit) const {
    const int64_t n = target_.config().num_hidden_layers;
    std::vector<std::pair<int64_t, int64_t>> out = {unit_range(target_.layout(), n, unit)};
    if (unit == n + 1 && target_.config().tie_word_embeddings) {
      out.push_back(unit_range(target_.layout(), n, 0));  // the lm_head is the embedding
    }
    return out;
  }
  const model::Model& source_;
  model::Model& target_;
};

// A model holding no working copy but the unit in use gives the logprobs, KV records, routing and
// gradients of the model holding them all, bit for bit, with and without recomputation; the
// units come one at a time in forward_unit_order / backward_unit_order and tile the layout.
TEST(TrainStep, UnitsAcquiredJustInTimeGiveTheSameStep) {
  namespace mt = model::testing;
  struct UnitCase {
    model::Precision linear;
    model::ModelConfig config;
  };
  const std::vector<UnitCase> cases = {
      {model::Precision::kFP8, config_for(0, 160)},  // llama, tied embedding
      {model::Precision::kBF16, config_for(1, 160)},
      {model::Precision::kFP8, [] {
         model::ModelConfig c =
             mt::make_qwen3_moe_config(160, 128, 256, 3, 4, 2, 48, false, 4, 2, 64, true);
         c.moe.mlp_only_layers = {1};
         return c;
       }()}};
  for (const UnitCase& uc : cases) {
    SCOPED_TRACE(std::string(precision_name(uc.linear)) + " " + uc.config.model_type);
    model::PrecisionPolicy policy;
    policy.linear = uc.linear;
    policy.kv_cache = model::KvCacheDtype::kBF16;
    auto whole = model::Model::Init(uc.config, policy, 5, 0.05f);
    auto jit = model::Model::Init(uc.config, policy, 5, 0.05f);
    ASSERT_TRUE(whole.ok() && jit.ok());
    mt::randomize(**whole, 11);
    mt::randomize(**jit, 11);
    const model::ParamLayout& layout = (*jit)->layout();
    const int64_t n_layers = uc.config.num_hidden_layers, total = layout.total();
    // The units tile [0, total) in flat order.
    int64_t at = 0;
    for (int64_t u : forward_unit_order(n_layers)) {
      const auto [b, e] = unit_range(layout, n_layers, u);
      EXPECT_EQ(b, at) << "unit " << u;
      EXPECT_LT(b, e) << "unit " << u;
      at = e;
    }
    EXPECT_EQ(at, total);
    const int64_t bytes_whole = (*jit)->weight_bytes();
    ASSERT_TRUE((*jit)->drop_working_range(0, total).ok());
    EXPECT_LT((*jit)->weight_bytes(), bytes_whole);
    EXPECT_EQ((*jit)->drop_working_range(1, total).code(), absl::StatusCode::kInvalidArgument);

    model::Rng rng(3);
    model::TokenBatch batch;
    for (int64_t len : {9, 2, 71}) batch.push_back(mt::random_tokens(rng, len, 160));
    model::TokenValues dlogp(batch.size());
    for (size_t s = 0; s < batch.size(); ++s) {
      dlogp[s].resize(batch[s].size() - 1);
      for (float& v : dlogp[s]) v = static_cast<float>(rng.normal());
    }
    const int64_t n = layout.total();
    model::KvCalibrator want_cal(n_layers);
    model::ForwardRouting want_routing;
    CpuTrainStep want_step;
    auto want = want_step.forward(
        **whole, batch,
        {.temperature = 0.7f, .calibrator = &want_cal, .routing_out = &want_routing});
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<float> want_grads(n, 0.0f);
    ASSERT_TRUE(want_step.backward(**whole, dlogp, want_grads.data()).ok());
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(recompute ? "recompute" : "keep");
      JustInTimeUnits units(**whole, **jit);
      model::KvCalibrator cal(n_layers);
      model::ForwardRouting routing;
      CpuTrainStep step;
      auto got = step.forward(**jit, batch,
                              {.temperature = 0.7f,
                               .calibrator = &cal,
                               .recompute_layers = recompute,
                               .routing_out = &routing,
                               .units = &units});
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, *want);
      EXPECT_EQ(cal.k_records(), want_cal.k_records());
      EXPECT_EQ(cal.v_records(), want_cal.v_records());
      EXPECT_EQ(routing.used, want_routing.used);
      EXPECT_EQ(units.order, forward_unit_order(n_layers));
      units.order.clear();
      std::vector<float> grads(n, 0.0f);
      ASSERT_TRUE(step.backward(**jit, dlogp, grads.data()).ok());
      EXPECT_EQ(units.order, backward_unit_order(n_layers));
      ASSERT_EQ(0, std::memcmp(grads.data(), want_grads.data(), n * sizeof(float)));
      EXPECT_EQ(units.max_held, 1);
      EXPECT_EQ(units.held, 0);
    }
    // Every unit was given back: the model holds no working copy again.
    EXPECT_LT((*jit)->weight_bytes(), bytes_whole);
  }
}

// The device's FP8 wgrad (engine/cuda/cuda_train_ops.h) pads the token dimension of dY^T and X^T
// with zeros to a multiple of 16 before the 1x128 tiling; on the CPU recipe (model/linear.h) the
// last tile is a partial one. Zeros change no tile's amax, hence no scale and no code, and add
// exact zeros to the sums: the padded wgrad equals linear_backward's bit for bit.
TEST(TrainStep, ZeroPaddedTokensLeaveFp8WgradUnchanged) {
  const int64_t m = 145, n = 32, k = 48, ld = 160;  // a full tile of 128 tokens and 17 padded to 32
  model::Rng rng(9);
  std::vector<float> x(m * k), dy(m * n), master(n * k);
  for (float& v : x) v = static_cast<float>(rng.normal());
  for (float& v : dy) v = static_cast<float>(rng.normal());
  for (float& v : master) v = static_cast<float>(0.05 * rng.normal());
  model::LinearWeight w;
  prepare_linear(master.data(), n, k, model::Precision::kFP8, false, &w);
  std::vector<float> want(n * k, 0.0f), got(n * k, 0.0f);
  ASSERT_TRUE(linear_backward(w, x.data(), dy.data(), m, nullptr, want.data(), nullptr).ok());
  // What the device does: transpose with zero padding, 1x128 tiles along the tokens, one GEMM.
  std::vector<float> dyt(n * ld, 0.0f), xt(k * ld, 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) dyt[c * ld + r] = dy[r * n + c];
    for (int64_t c = 0; c < k; ++c) xt[c * ld + r] = x[r * k + c];
  }
  const kernels::Fp8Matrix a =
      kernels::quantize(dyt.data(), n, ld, kernels::ScalingMode::kTile1x128, {});
  const kernels::Fp8Matrix b =
      kernels::quantize(xt.data(), k, ld, kernels::ScalingMode::kTile1x128, {});
  ASSERT_TRUE(kernels::gemm_fp8(a, b, got.data(), kernels::OutDtype::kF32, true).ok());
  double norm = 0;
  for (int64_t i = 0; i < n * k; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << i;
    norm += std::fabs(want[i]);
  }
  EXPECT_GT(norm, 0.0);
}

TEST(TrainStep, TablesAndBadInput) {
  const model::ModelConfig config = config_for(0, 50);
  auto t = build_train_tables({{1, 2, 3}, {4}, {5, 6}}, config);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rows, 6);
  EXPECT_EQ(t->seq_start, (std::vector<int32_t>{0, 3, 4, 6}));
  EXPECT_EQ(t->pos, (std::vector<int32_t>{0, 1, 2, 0, 0, 1}));
  EXPECT_EQ(t->row_seq, (std::vector<int32_t>{0, 0, 0, 1, 2, 2}));
  EXPECT_EQ(t->targets, (std::vector<int32_t>{2, 3, -1, -1, 6, -1}));
  absl::Status s = build_train_tables({{1}, {2, 50}}, config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sequence 1: token id 50 at index 1"), std::string::npos) << s;
  EXPECT_NE(build_train_tables({{1}, {}}, config).status().message().find("sequence 1 is empty"),
            std::string::npos);
  EXPECT_FALSE(build_train_tables({}, config).ok());
  // Buffers: padded rows, aligned, and counted exactly as carved.
  const TrainStepOptions opts;
  EXPECT_EQ(train_padded_rows(6), 32);
  const int64_t floats = train_buffer_floats(config, 6, opts);
  std::vector<float> base(floats);
  const TrainBuffers b = carve_train_buffers(config, 6, opts, base.data());
  EXPECT_EQ(b.padded_rows, 32);
  EXPECT_EQ((b.layers[1].act - base.data()) % 64, 0);
  EXPECT_LE(b.du + 32 * config.intermediate_size, base.data() + floats);
}

TEST(TrainStep, BadRoutingTemperatureAndDlogp) {
  model::PrecisionPolicy policy;
  const model::ModelConfig moe =
      model::testing::make_qwen3_moe_config(64, 64, 128, 1, 2, 1, 32, false, 4, 2, 32, true);
  auto m = model::Model::Init(moe, policy, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  CpuTrainStep step;
  // A bad routing record: InvalidArgument (model::check_routing's message), which names the
  // sequence and, for a bad id, the token. (-1, "route freely", is what a record's
  // missing tokens become inside the step; it is not a valid id in a record.)
  const model::TokenBatch batch = {{1, 2, 3}, {4, 5}};
  const std::vector<std::pair<model::TokenRouting, std::string>> bad_records = {
      {{{0, 1}, {0, 9}}, "routing[1]: token 0: expert id 9 out of range [0, 4)"},
      {{{0, 1, 3, 3}, {}}, "routing[0]: token 1: expert id 3 repeated"},
      {{{0, 1, -1, 2}, {}}, "routing[0]: token 1: expert id -1 out of range [0, 4)"},
      {{{0, 1}, {1, 0, 2, 3}}, ""},  // fine
      {{{0, 1, 2}, {}}, "routing[0]: 3 ids is not a whole number of tokens of 2"},
      {{{0, 1}, {0, 1, 2, 3, 0, 1}}, "routing[1]: 6 ids"},
      {{{}}, "routing: 1 sequences, the batch has 2"}};
  for (const auto& [bad, message] : bad_records) {
    auto r = step.forward(**m, batch, {.replay = &bad});
    if (message.empty()) {
      EXPECT_TRUE(r.ok()) << r.status();
      continue;
    }
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(message), std::string::npos)
        << r.status() << " lacks " << message;
  }
  auto r = step.forward(**m, batch, {.replay = nullptr, .router_aux_loss_coef = -1.0});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("router_aux_loss_coef"), std::string::npos) << r.status();

  auto d = model::Model::Init(config_for(0, 50), policy, 1);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(step.forward(**d, {{1, 2, 3}}, {.temperature = 0.0f}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(step.forward(**d, {{1, 2, 3}, {4, 5}}, {}).ok());
  std::vector<float> grads((*d)->num_params(), 0.0f);
  absl::Status s = step.backward(**d, {{0.5f, 1.0f}}, grads.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dlogp has 1 sequences"), std::string::npos) << s;
  s = step.backward(**d, {{0.5f}, {1.0f}}, grads.data());
  EXPECT_NE(s.message().find("dlogp[0] has 1 values, expected 2"), std::string::npos) << s;
  s = step.backward(**d, {{0.5f, NAN}, {1.0f}}, grads.data());
  EXPECT_NE(s.message().find("dlogp[0] not finite"), std::string::npos) << s;
}

}  // namespace
}  // namespace fp8rl::engine
