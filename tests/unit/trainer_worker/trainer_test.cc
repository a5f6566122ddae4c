// Tests of the Trainer logic in-process (tiny random model, recording publisher): the direction
// of GRPO updates, on-policy IS/mismatch values, IS rules against rl/grpo.h, minibatches, SFT,
// publish (fresh FP8 quantization + calibrated KV scales), checkpoint round trips and validation.
#include "services/trainer_worker/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/cpu/train_ops.h"
#include "kernels/quantize.h"
#include "model/kv_calibration.h"
#include "rl/grpo.h"
#include "rl/step_metric_schema.h"
#include "services/trainer_worker/trainer_metrics.h"
#include "tests/unit/common/temp_dir.h"
#include "tests/unit/trainer_worker/trainer_test_util.h"

namespace fp8rl::trainer {
namespace {

using testing::init_request;
using testing::random_step;
using testing::RecordingPublisher;
using testing::sequence_logprobs;
using testing::set_gen_to_current;

class TrainerTest : public ::testing::Test {
 protected:
  void init(const v1::InitPolicyRequest& request) {
    absl::StatusOr<v1::InitPolicyResponse> r = trainer_.init_policy(request);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->version(), 0);
    EXPECT_EQ(r->num_parameters(), trainer_.policy()->num_params());
  }

  RecordingPublisher publisher_;
  Trainer trainer_{TrainerOptions{}, &publisher_};
};

TEST_F(TrainerTest, AdvantageSignMovesSequenceLogprob) {
  init(init_request());
  v1::TrainStepRequest step = random_step(11, 4);  // advantages +1, -1, +1, -1
  set_gen_to_current(trainer_, &step);
  const std::vector<double> before = sequence_logprobs(trainer_, step);
  absl::StatusOr<v1::TrainStepResponse> r = trainer_.train_step(step);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<double> after = sequence_logprobs(trainer_, step);
  ASSERT_EQ(after.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    if (step.batch(i).advantage() > 0) {
      EXPECT_GT(after[i], before[i] + 1e-3) << "sequence " << i;
    } else {
      EXPECT_LT(after[i], before[i] - 1e-3) << "sequence " << i;
    }
  }
  EXPECT_EQ(r->version(), 1);
  EXPECT_GT(r->grad_norm(), 0.0);
  EXPECT_DOUBLE_EQ(r->learning_rate(), 1e-2);
  int64_t tokens = 0;
  for (const auto& s : step.batch()) tokens += s.tokens_size() - s.prompt_length();
  EXPECT_EQ(r->tokens(), tokens);
  for (const char* phase : {"logprobs", "forward_backward", "optimizer"}) {
    ASSERT_TRUE(r->phase_seconds().contains(phase)) << phase;
    EXPECT_GT(r->phase_seconds().at(phase), 0.0) << phase;
  }
}

TEST_F(TrainerTest, OnPolicyBatchHasUnitIsWeightAndZeroMismatch) {
  init(init_request());
  v1::TrainStepRequest step = random_step(12, 3);
  set_gen_to_current(trainer_, &step);
  step.mutable_algorithm()->set_is_rule(v1::IS_RULE_TIS);
  step.mutable_algorithm()->set_is_cap(2.0);
  absl::StatusOr<v1::TrainStepResponse> r = trainer_.train_step(step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mismatch().token_mult_prob_error(), 1.0);
  EXPECT_EQ(r->mismatch().gen_kl_error(), 0.0);
  EXPECT_EQ(r->mismatch().sampling_importance_ratio(), 1.0);
  EXPECT_EQ(r->mismatch().is_oob_ratio(), 0.0);
  EXPECT_EQ(r->mismatch().probs_ratio_min(), 1.0);
  EXPECT_EQ(r->mismatch().probs_ratio_max(), 1.0);
  // First minibatch: cur == prev, so no token is clipped and the KL term is off.
  EXPECT_EQ(r->clip_fraction(), 0.0);
  EXPECT_EQ(r->kl(), 0.0);
}

TEST_F(TrainerTest, OffPolicyBatchReportsMismatch) {
  init(init_request());
  v1::TrainStepRequest step = random_step(13, 3);
  set_gen_to_current(trainer_, &step);
  model::Rng rng(5);
  for (auto& s : *step.mutable_batch()) {
    for (float& g : *s.mutable_gen_logprobs()) g += static_cast<float>(rng.uniform() - 0.5);
  }
  absl::StatusOr<v1::TrainStepResponse> r = trainer_.train_step(step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->mismatch().token_mult_prob_error(), 1.0);
  EXPECT_GT(r->mismatch().gen_kl_error(), 0.0);
  // probs_ratio_* are of the PPO ratio exp(cur - prev), not of the IS weight: one update from
  // the rollout policy has cur == prev, whatever gen is (rl/mismatch.h).
  EXPECT_EQ(r->mismatch().probs_ratio_min(), 1.0);
  EXPECT_EQ(r->mismatch().probs_ratio_max(), 1.0);
}

// The trainer's gradient for each IS rule equals rl::grpo_policy_loss + Model::backward computed
// here directly, and the rules really change it.
TEST_F(TrainerTest, IsRulesMatchGrpoLossDirectly) {
  init(init_request());
  v1::TrainStepRequest step = random_step(14, 4);
  set_gen_to_current(trainer_, &step);
  model::Rng rng(9);
  for (auto& s : *step.mutable_batch()) {
    for (float& g : *s.mutable_gen_logprobs()) g += static_cast<float>(0.8 * (rng.uniform() - 0.5));
  }
  // Mask one response token to check masking too.
  step.mutable_batch(1)->mutable_loss_mask()->Resize(
      step.batch(1).tokens_size() - step.batch(1).prompt_length(), 1.0f);
  step.mutable_batch(1)->set_loss_mask(0, 0.0f);

  struct Case {
    v1::ImportanceSamplingRule rule;
    double lo, hi;
    rl::IsConfig expected;
  };
  const std::vector<Case> cases = {
      {v1::IS_RULE_NONE, 0, 0, {rl::IsRule::kNone, 2.0, 0.5, 2.0}},
      {v1::IS_RULE_TIS, 0, 1.1, {rl::IsRule::kTis, 1.1, 0.5, 1.1}},
      {v1::IS_RULE_ICEPOP, 0.9, 1.1, {rl::IsRule::kIcepop, 1.1, 0.9, 1.1}},
      {v1::IS_RULE_SEQ_MASK_TIS, 0.95, 1.05, {rl::IsRule::kSeqMaskTis, 1.05, 0.95, 1.05}},
  };
  const model::Model& m = *trainer_.policy();
  std::vector<std::vector<float>> grads_by_rule;
  for (const Case& c : cases) {
    step.mutable_algorithm()->set_is_rule(c.rule);
    step.mutable_algorithm()->set_is_lo(c.lo);
    step.mutable_algorithm()->set_is_hi(c.hi);
    absl::StatusOr<PolicyGradient> got = trainer_.gradient(step);
    ASSERT_TRUE(got.ok()) << got.status();

    // Expected: padded arrays built here, the loss from rl/grpo.h, backward through the model.
    int64_t L = 0;
    model::TokenBatch tokens;
    for (const auto& s : step.batch()) {
      L = std::max<int64_t>(L, s.tokens_size() - s.prompt_length());
      tokens.emplace_back(s.tokens().begin(), s.tokens().end());
    }
    const int64_t B = step.batch_size();
    engine::CpuTrainStep ctx;
    absl::StatusOr<model::TokenValues> lp = ctx.forward(m, tokens, {});
    ASSERT_TRUE(lp.ok());
    std::vector<float> cur(B * L, 0), gen(B * L, 0), adv(B);
    std::vector<uint8_t> mask(B * L, 0);
    for (int64_t b = 0; b < B; ++b) {
      const auto& s = step.batch(static_cast<int>(b));
      adv[b] = s.advantage();
      for (int j = 0; j < s.tokens_size() - s.prompt_length(); ++j) {
        cur[b * L + j] = (*lp)[b][s.prompt_length() - 1 + j];
        gen[b * L + j] = s.gen_logprobs(j);
        mask[b * L + j] = s.loss_mask_size() == 0 || s.loss_mask(j) != 0 ? 1 : 0;
      }
    }
    rl::PolicyLossConfig config;
    config.clip_eps = 0.2;
    config.is = c.expected;
    rl::PolicyLossInput in{{B, L}, cur, cur, gen, {}, mask, adv};
    absl::StatusOr<rl::PolicyLossResult> want = rl::grpo_policy_loss(in, config);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(got->prev_logprobs, cur);
    EXPECT_NEAR(got->loss.loss, want->loss, 1e-12);
    EXPECT_EQ(got->loss.stats.valid_tokens, want->stats.valid_tokens);
    model::TokenValues dlogp(B);
    for (int64_t b = 0; b < B; ++b) {
      const auto& s = step.batch(static_cast<int>(b));
      dlogp[b].assign(s.tokens_size() - 1, 0.0f);
      for (int j = 0; j < s.tokens_size() - s.prompt_length(); ++j) {
        dlogp[b][s.prompt_length() - 1 + j] = want->dloss_dcur[b * L + j];
      }
    }
    std::vector<float> grads(m.num_params(), 0.0f);
    ASSERT_TRUE(ctx.backward(m, dlogp, grads.data()).ok());
    ASSERT_EQ(got->grads.size(), grads.size());
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(grads[i])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(grads[i]) - got->grads[i]));
    }
    EXPECT_GT(max_abs, 0.0) << "rule " << c.rule;
    EXPECT_LE(max_diff, 1e-6 * max_abs) << "rule " << c.rule;
    grads_by_rule.push_back(std::move(grads));
  }
  // Truncation changes the gradient relative to no correction.
  for (size_t r = 1; r < grads_by_rule.size(); ++r) {
    EXPECT_NE(grads_by_rule[r], grads_by_rule[0]) << "rule index " << r;
  }
  // ICEPOP with bounds that exclude every token zeroes the whole gradient.
  step.mutable_algorithm()->set_is_rule(v1::IS_RULE_ICEPOP);
  step.mutable_algorithm()->set_is_lo(0.9999);
  step.mutable_algorithm()->set_is_hi(1.0001);
  absl::StatusOr<PolicyGradient> zeroed = trainer_.gradient(step);
  ASSERT_TRUE(zeroed.ok()) << zeroed.status();
  for (float g : zeroed->grads) ASSERT_EQ(g, 0.0f);
}

TEST_F(TrainerTest, MinibatchesTakeOneOptimizerStepEach) {
  init(init_request());
  v1::TrainStepRequest step = random_step(15, 4);
  set_gen_to_current(trainer_, &step);
  step.mutable_algorithm()->set_minibatches(2);
  absl::StatusOr<v1::TrainStepResponse> r = trainer_.train_step(step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(trainer_.optimizer_steps(), 2);
  EXPECT_EQ(r->version(), 1);
  // Four minibatches with a per-step learning rate override (AdamW state carried over).
  step.mutable_algorithm()->set_minibatches(4);
  step.mutable_algorithm()->set_learning_rate(0.05);
  set_gen_to_current(trainer_, &step);
  r = trainer_.train_step(step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(trainer_.optimizer_steps(), 6);
  EXPECT_DOUBLE_EQ(r->learning_rate(), 0.05);
  EXPECT_EQ(r->version(), 2);
}

TEST_F(TrainerTest, EpochsRepeatTheMinibatchesAgainstTheRolloutLogprobs) {
  init(init_request());
  v1::TrainStepRequest step = random_step(16, 4);
  set_gen_to_current(trainer_, &step);
  step.mutable_algorithm()->set_clip_eps(1e-3);
  step.mutable_algorithm()->set_learning_rate(0.05);
  step.mutable_algorithm()->set_minibatches(2);
  // One pass: every token is on-policy when its minibatch is taken, so nothing is clipped.
  Trainer one_pass{TrainerOptions{}, &publisher_};
  ASSERT_TRUE(one_pass.init_policy(init_request()).ok());
  absl::StatusOr<v1::TrainStepResponse> r1 = one_pass.train_step(step);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(one_pass.optimizer_steps(), 2);
  // Three passes: 6 optimizer steps, one new version; the later passes compare the moved policy
  // with the rollout policy's logprobs, so the tight clip range now clips tokens.
  step.mutable_algorithm()->set_epochs(3);
  absl::StatusOr<v1::TrainStepResponse> r3 = trainer_.train_step(step);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(trainer_.optimizer_steps(), 6);
  EXPECT_EQ(r3->version(), 1);
  EXPECT_GT(r3->clip_fraction(), r1->clip_fraction());
  EXPECT_GT(r3->clip_fraction(), 0.0);
  EXPECT_LE(r3->clip_fraction(), 1.0);
  // The first pass of the three-pass run is the one-pass run, so the policies then diverge.
  const std::span<const float> a = trainer_.policy()->params();
  const std::span<const float> b = one_pass.policy()->params();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_FALSE(std::equal(a.begin(), a.end(), b.begin()));
  step.mutable_algorithm()->set_epochs(65);
  absl::Status bad = trainer_.train_step(step).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("algorithm.epochs"), std::string::npos) << bad;
}

TEST_F(TrainerTest, SftLowersNllOnARepeatedBatch) {
  init(init_request(v1::WEIGHT_FORMAT_BF16, v1::WEIGHT_FORMAT_BF16));
  const v1::TrainStepRequest data = random_step(16, 4);
  v1::SftStepRequest sft;
  sft.set_job_id("job-1");
  *sft.mutable_batch() = data.batch();
  for (auto& s : *sft.mutable_batch()) s.clear_gen_logprobs();
  sft.set_learning_rate(1e-2);
  sft.set_minibatches(1);
  std::vector<double> losses;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<v1::SftStepResponse> r = trainer_.sft_step(sft);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->version(), i + 1);
    EXPECT_GT(r->grad_norm(), 0.0);
    losses.push_back(r->loss());
  }
  EXPECT_GT(losses[0], 1.0);  // ~log(48) at random init
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]) << i;
  EXPECT_LT(losses.back(), 0.8 * losses.front());
}

// The KV scales a publish after `step` must carry: what the step's prev-logprobs forward records,
// i.e. a calibrator run on the step's batch, one forward per sequence, on the policy before the
// step (training precision). Call before the step.
model::KvScales step_kv_scales(const Trainer& trainer, const v1::TrainStepRequest& step) {
  const model::Model& m = *trainer.policy();
  model::KvCalibrator calibrator(m.config().num_hidden_layers);
  engine::TrainStepOptions opts;
  opts.calibrator = &calibrator;
  for (const auto& s : step.batch()) {
    const std::vector<int32_t> seq(s.tokens().begin(), s.tokens().end());
    EXPECT_TRUE(engine::cpu_logprobs(m, {seq}, opts).ok());
  }
  return calibrator.scales(99.9, 1.05);
}

// Publish: FP8 codes and block scales equal a fresh 128x128 quantization of the master weights;
// k/v scales come from the last step's own forward (`want`, step_kv_scales) and publishing runs
// no forward; versions strictly increase.
void check_publish(Trainer& trainer, RecordingPublisher& publisher, const model::KvScales& want) {
  const model::Model& m = *trainer.policy();
  const int64_t forwards = engine::train_forward_calls_total();
  v1::PublishRequest req;
  req.set_weight_sync_address("sync:1");
  req.set_calibrate_kv_scales(true);
  absl::StatusOr<v1::PublishResponse> r = trainer.publish(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(engine::train_forward_calls_total(), forwards) << "publish ran a forward";
  EXPECT_EQ(r->version(), 1);
  ASSERT_EQ(publisher.uploads.size(), 1u);
  EXPECT_EQ(publisher.addresses.back(), "sync:1");
  EXPECT_EQ(publisher.formats.back(), v1::WEIGHT_FORMAT_FP8);
  const model::WeightSet& set = publisher.uploads.back();
  EXPECT_EQ(set.version, 1);
  EXPECT_NE(set.config_json.find("quantization_config"), std::string::npos);

  int linears = 0;
  for (const model::ParamInfo& p : m.layout().params()) {
    if (p.kind != model::ParamKind::kLinear) continue;
    ++linears;
    const model::NamedTensor* codes = set.find(p.name);
    const model::NamedTensor* scales = set.find(p.name + "_scale_inv");
    ASSERT_NE(codes, nullptr) << p.name;
    ASSERT_NE(scales, nullptr) << p.name;
    EXPECT_EQ(codes->dtype, DType::kF8E4M3);
    const kernels::Fp8Matrix fresh = kernels::quantize(
        m.params().data() + p.offset, p.shape[0], p.shape[1], kernels::ScalingMode::kBlock128x128);
    EXPECT_EQ(codes->bytes, fresh.data) << p.name;
    absl::StatusOr<std::vector<float>> s = model::tensor_to_f32(*scales);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*s, fresh.scale_inv) << p.name;
  }
  EXPECT_EQ(linears, 14);

  for (int64_t l = 0; l < m.config().num_hidden_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::string name =
          absl::StrCat("model.layers.", l, ".self_attn.", kv == 0 ? "k_scale" : "v_scale");
      const model::NamedTensor* t = set.find(name);
      ASSERT_NE(t, nullptr) << name;
      absl::StatusOr<std::vector<float>> v = model::tensor_to_f32(*t);
      ASSERT_TRUE(v.ok());
      const float expected = kv == 0 ? want.k[l] : want.v[l];
      EXPECT_EQ((*v)[0], expected) << name;
      EXPECT_NE((*v)[0], 1.0f) << name << " was not calibrated";
    }
  }
  EXPECT_GT(r->weight_scale_min(), 0.0);
  EXPECT_GE(r->weight_scale_max(), r->weight_scale_min());
  EXPECT_GT(r->kv_scale_mean(), 0.0);
  EXPECT_EQ(r->bytes(), static_cast<uint64_t>(set.nbytes()));

  // Nothing trained since: the next publish still gets a new version; a weight-sync service
  // that already holds a newer one pushes the version above it.
  r = trainer.publish(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 2);
  publisher.latest = 10;
  r = trainer.publish(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 11);
  EXPECT_EQ(trainer.status().published_version(), 11);
}

TEST_F(TrainerTest, PublishFp8TrainingRequantizesAndCalibrates) {
  init(init_request());
  v1::TrainStepRequest step = random_step(17, 3);
  set_gen_to_current(trainer_, &step);
  const model::KvScales want = step_kv_scales(trainer_, step);
  ASSERT_TRUE(trainer_.train_step(step).ok());
  check_publish(trainer_, publisher_, want);
}

// The step's forward is BF16: its amax calibrates the FP8 generation's KV cache
// (docs/design/fp8-recipe.md).
TEST_F(TrainerTest, PublishFp8FromBf16Training) {
  init(init_request(v1::WEIGHT_FORMAT_BF16, v1::WEIGHT_FORMAT_FP8));
  v1::TrainStepRequest step = random_step(18, 3);
  set_gen_to_current(trainer_, &step);
  const model::KvScales want = step_kv_scales(trainer_, step);
  ASSERT_TRUE(trainer_.train_step(step).ok());
  check_publish(trainer_, publisher_, want);
}

TEST_F(TrainerTest, PublishBf16HasNoScales) {
  init(init_request(v1::WEIGHT_FORMAT_BF16, v1::WEIGHT_FORMAT_BF16));
  v1::PublishRequest req;
  absl::StatusOr<v1::PublishResponse> r = trainer_.publish(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 1);
  EXPECT_EQ(publisher_.addresses.back(), "localhost:50052");  // the default address
  for (const model::NamedTensor& t : publisher_.uploads.back().tensors) {
    EXPECT_NE(t.dtype, DType::kF8E4M3) << t.name;
  }
}

TEST_F(TrainerTest, CheckpointRoundTripContinuesBitIdentically) {
  testing_util::TempDir dir;
  init(init_request(v1::WEIGHT_FORMAT_FP8, v1::WEIGHT_FORMAT_FP8, /*keep_reference=*/true));
  v1::TrainStepRequest step = random_step(19, 4);
  step.mutable_algorithm()->set_kl_beta(0.1);
  step.mutable_algorithm()->set_is_rule(v1::IS_RULE_TIS);
  set_gen_to_current(trainer_, &step);
  ASSERT_TRUE(trainer_.train_step(step).ok());

  v1::SaveCheckpointRequest save;
  save.set_path(dir.file("ckpt/step-1"));  // the parent folder is created
  save.set_include_optimizer(true);
  absl::StatusOr<v1::SaveCheckpointResponse> saved = trainer_.save_checkpoint(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->version(), 1);
  EXPECT_GT(saved->bytes(), 0u);
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("ckpt"))) {
    names.insert(e.path().filename().string());
  }
  EXPECT_EQ(names, std::set<std::string>{"step-1"});  // no temporary folder left
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors",
                        "trainer_state.json", "reference/model.safetensors"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.file(std::string("ckpt/step-1/") + f))) << f;
  }

  RecordingPublisher other_publisher;
  Trainer restored(TrainerOptions{}, &other_publisher);
  v1::LoadCheckpointRequest load;
  load.set_path(saved->path());
  absl::StatusOr<v1::LoadCheckpointResponse> loaded = restored.load_checkpoint(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->version(), 1);
  EXPECT_TRUE(loaded->optimizer_restored());
  EXPECT_EQ(restored.status().job_id(), "job-1");

  // The same next step on both: identical results and identical parameters afterwards.
  v1::TrainStepRequest next = random_step(20, 4);
  next.mutable_algorithm()->set_kl_beta(0.1);
  set_gen_to_current(trainer_, &next);
  absl::StatusOr<v1::TrainStepResponse> a = trainer_.train_step(next);
  absl::StatusOr<v1::TrainStepResponse> b = restored.train_step(next);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->loss(), b->loss());
  EXPECT_EQ(a->kl(), b->kl());
  EXPECT_GT(a->kl(), 0.0);
  EXPECT_EQ(a->grad_norm(), b->grad_norm());
  EXPECT_EQ(a->version(), b->version());
  const auto pa = trainer_.policy()->params(), pb = restored.policy()->params();
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_TRUE(std::equal(pa.begin(), pa.end(), pb.begin()));
  EXPECT_EQ(trainer_.optimizer_steps(), restored.optimizer_steps());
}

TEST_F(TrainerTest, LoadCheckpointErrorsKeepThePolicy) {
  init(init_request());
  v1::LoadCheckpointRequest load;
  load.set_path("/nonexistent/fp8rl/ckpt");
  absl::StatusOr<v1::LoadCheckpointResponse> r = trainer_.load_checkpoint(load);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("trainer_state.json"), std::string::npos);
  EXPECT_TRUE(trainer_.status().ready());
  EXPECT_EQ(trainer_.status().job_id(), "job-1");
}

void expect_invalid(const absl::Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(field), std::string::npos)
      << "'" << s.message() << "' lacks " << field;
}

// With roots set, every path a call names is confined after symlinks and ".." are resolved: a
// caller that skips the coordinator's checks cannot write or read checkpoints elsewhere.
TEST_F(TrainerTest, PathsOutsideTheRootsAreRefused) {
  testing_util::TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir.file("data"));
  fs::create_directories(dir.file("models"));
  fs::create_directories(dir.file("outside"));
  fs::create_directory_symlink(dir.file("outside"), dir.file("data/link"));
  fs::create_directory_symlink(dir.file("outside"), dir.file("models/link"));
  TrainerOptions options;
  options.data_root = dir.file("data");
  options.models_root = dir.file("models");
  RecordingPublisher publisher;
  Trainer confined(options, &publisher);
  ASSERT_TRUE(confined.init_policy(init_request()).ok());

  v1::SaveCheckpointRequest save;
  save.set_path(dir.file("data/ckpt/step-1"));
  ASSERT_TRUE(confined.save_checkpoint(save).ok());
  for (const std::string& escape : {std::string("/etc/fp8rl-ckpt"),
                                    dir.file("data/../outside/ckpt"), dir.file("data/link/ckpt")}) {
    save.set_path(escape);
    absl::Status s = confined.save_checkpoint(save).status();
    expect_invalid(s, "--data-root");
    v1::LoadCheckpointRequest load;
    load.set_path(escape);
    expect_invalid(confined.load_checkpoint(load).status(), "--data-root");
  }
  EXPECT_FALSE(fs::exists(dir.file("outside/ckpt")));

  for (const std::string& escape :
       {std::string("/etc"), dir.file("models/../outside"), dir.file("models/link")}) {
    v1::InitPolicyRequest from_checkpoint = init_request();
    from_checkpoint.mutable_model()->set_checkpoint_dir(escape);
    absl::Status s = confined.init_policy(from_checkpoint).status();
    expect_invalid(s, "model.checkpoint_dir");
    EXPECT_NE(s.message().find("--models-root"), std::string::npos) << s;
  }
  EXPECT_TRUE(confined.status().ready());  // refusals keep the held policy
}

TEST_F(TrainerTest, BadRequestsAreRejectedNamingTheField) {
  // Before InitPolicy: ABORTED (the caller must start again from InitPolicy/LoadCheckpoint).
  EXPECT_EQ(trainer_.train_step(random_step(1, 2)).status().code(), absl::StatusCode::kAborted);
  v1::InitPolicyRequest bad_init = init_request();
  bad_init.mutable_model()->mutable_init()->set_model_config_json("{\"hidden_size\": 0}");
  expect_invalid(trainer_.init_policy(bad_init).status(), "model.init.model_config_json");
  bad_init = init_request();
  bad_init.mutable_optimizer()->set_learning_rate(-1);
  expect_invalid(trainer_.init_policy(bad_init).status(), "optimizer.learning_rate");
  bad_init = init_request();
  bad_init.mutable_precision()->set_bf16_first_layers(-1);
  expect_invalid(trainer_.init_policy(bad_init).status(), "precision.bf16_first_layers");
  bad_init = init_request();
  bad_init.clear_model();
  expect_invalid(trainer_.init_policy(bad_init).status(), "model");
  init(init_request());

  const v1::TrainStepRequest good = random_step(2, 2);
  struct Case {
    std::function<void(v1::TrainStepRequest&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.clear_batch(); }, "batch"},
      {[](auto& r) { r.mutable_batch(1)->set_tokens(2, testing::kVocab); }, "batch[1].tokens"},
      {[](auto& r) { r.mutable_batch(0)->set_tokens(0, -3); }, "batch[0].tokens"},
      {[](auto& r) { r.mutable_batch(0)->set_prompt_length(0); }, "batch[0].prompt_length"},
      {[](auto& r) { r.mutable_batch(0)->set_prompt_length(r.batch(0).tokens_size()); },
       "batch[0].prompt_length"},
      {[](auto& r) { r.mutable_batch(1)->add_gen_logprobs(-1); }, "batch[1].gen_logprobs"},
      {[](auto& r) { r.mutable_batch(0)->add_loss_mask(1); }, "batch[0].loss_mask"},
      {[](auto& r) { r.mutable_batch(0)->set_advantage(NAN); }, "batch[0].advantage"},
      {[](auto& r) { r.mutable_algorithm()->set_minibatches(0); }, "algorithm.minibatches"},
      {[](auto& r) { r.mutable_algorithm()->set_minibatches(3); }, "algorithm.minibatches"},
      {[](auto& r) { r.mutable_algorithm()->set_clip_eps(0); }, "algorithm.clip_eps"},
      {[](auto& r) { r.mutable_algorithm()->set_kl_beta(-1); }, "algorithm.kl_beta"},
      {[](auto& r) { r.mutable_algorithm()->set_learning_rate(-1); }, "algorithm.learning_rate"},
      {[](auto& r) {
         r.mutable_algorithm()->set_is_rule(v1::IS_RULE_ICEPOP);
         r.mutable_algorithm()->set_is_lo(1.5);
         r.mutable_algorithm()->set_is_hi(1.2);
       },
       "algorithm.is"},
  };
  for (const Case& c : cases) {
    v1::TrainStepRequest r = good;
    c.mutate(r);
    expect_invalid(trainer_.train_step(r).status(), c.field);
  }
  v1::TrainStepRequest wrong_job = good;
  wrong_job.set_job_id("job-2");
  absl::Status s = trainer_.train_step(wrong_job).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(s.message().find("job_id"), std::string::npos);
  v1::TrainStepRequest kl = good;
  kl.mutable_algorithm()->set_kl_beta(0.1);  // no reference policy held
  EXPECT_EQ(trainer_.train_step(kl).status().code(), absl::StatusCode::kFailedPrecondition);

  v1::SftStepRequest sft;
  sft.set_job_id("job-1");
  *sft.mutable_batch() = good.batch();
  sft.set_minibatches(1);
  expect_invalid(trainer_.sft_step(sft).status(), "learning_rate");
  sft.set_learning_rate(1e-3);
  sft.set_minibatches(0);
  expect_invalid(trainer_.sft_step(sft).status(), "minibatches");

  v1::ComputeLogprobsRequest lp;
  *lp.mutable_sequences() = good.batch();
  lp.mutable_sequences(0)->set_prompt_length(-1);
  expect_invalid(trainer_.compute_logprobs(lp).status(), "sequences[0].prompt_length");
  lp.mutable_sequences(0)->set_prompt_length(2);
  lp.set_use_reference(true);
  EXPECT_EQ(trainer_.compute_logprobs(lp).status().code(), absl::StatusCode::kFailedPrecondition);

  v1::SaveCheckpointRequest save;
  expect_invalid(trainer_.save_checkpoint(save).status(), "path");

  // Nothing was trained by the rejected requests.
  EXPECT_EQ(trainer_.status().version(), 0);
  EXPECT_EQ(trainer_.optimizer_steps(), 0);
}

// One off-policy GRPO step (2 epochs x 2 minibatches, so the PPO ratio moves) through a trainer
// with metrics; with FP8RL_SCHEMA_DUMP_DIR set, writes the response and the /metrics text there
// (timings dropped) so a refactor of the metric plumbing can be diffed before/after.
TEST(TrainerMetricsDump, OffPolicyStep) {
  service::MetricsRegistry registry;
  absl::StatusOr<std::unique_ptr<TrainerMetrics>> metrics = TrainerMetrics::create(&registry);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  RecordingPublisher publisher;
  Trainer trainer(TrainerOptions{}, &publisher, metrics->get());
  ASSERT_TRUE(trainer.init_policy(init_request()).ok());
  v1::TrainStepRequest step = random_step(17, 4);
  set_gen_to_current(trainer, &step);
  model::Rng rng(9);
  for (auto& s : *step.mutable_batch()) {
    for (float& g : *s.mutable_gen_logprobs()) g += static_cast<float>(rng.uniform() - 0.5);
  }
  step.mutable_algorithm()->set_is_rule(v1::IS_RULE_TIS);
  step.mutable_algorithm()->set_minibatches(2);
  step.mutable_algorithm()->set_epochs(2);
  absl::StatusOr<v1::TrainStepResponse> r = trainer.train_step(step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->mismatch().probs_ratio_max(), 1.0);
  EXPECT_LT(r->mismatch().probs_ratio_min(), 1.0);
  // Every step metric of the schema is computed and sent by name, with the fixed fields' value.
  rl::MetricsValues sent;
  for (const auto& [name, value] : r->metrics()) sent[name] = value;
  EXPECT_TRUE(rl::check_step_metric_values(sent).ok()) << rl::check_step_metric_values(sent);
  EXPECT_EQ(sent.size(), rl::kStepMetrics.size());
  EXPECT_EQ(sent.at("probs_ratio_max"), r->mismatch().probs_ratio_max());
  EXPECT_EQ(sent.at("train_tokens"), static_cast<double>(r->tokens()));
  const char* dir = std::getenv("FP8RL_SCHEMA_DUMP_DIR");
  if (dir == nullptr) return;
  v1::TrainStepResponse stable = *r;
  stable.clear_phase_seconds();
  std::string text;
  for (absl::string_view line : absl::StrSplit(registry.render(), '\n')) {
    if (absl::StrContains(line, "seconds") || absl::StrContains(line, "process_") ||
        absl::StrContains(line, "build_info")) {
      continue;
    }
    absl::StrAppend(&text, line, "\n");
  }
  std::ofstream(std::string(dir) + "/trainer_response.txt") << stable.DebugString();
  std::ofstream(std::string(dir) + "/trainer_metrics.txt") << text;
}

}  // namespace
// Rollouts sampled at temperature T: the trainer must take logprobs of logits / T, or every token
// looks off-policy.
TEST_F(TrainerTest, LogprobsFollowTheSamplingTemperature) {
  init(init_request());
  v1::TrainStepRequest step = random_step(14, 3);
  v1::ComputeLogprobsRequest req;
  *req.mutable_sequences() = step.batch();
  req.set_temperature(2.0);
  absl::StatusOr<v1::ComputeLogprobsResponse> hot = trainer_.compute_logprobs(req);
  ASSERT_TRUE(hot.ok()) << hot.status();
  req.set_temperature(0.0);  // unset = 1
  absl::StatusOr<v1::ComputeLogprobsResponse> cold = trainer_.compute_logprobs(req);
  ASSERT_TRUE(cold.ok()) << cold.status();
  double diff = 0;
  for (int i = 0; i < step.batch_size(); ++i) {
    ASSERT_EQ(hot->sequences(i).logprobs_size(), cold->sequences(i).logprobs_size());
    for (int j = 0; j < hot->sequences(i).logprobs_size(); ++j) {
      diff += std::abs(hot->sequences(i).logprobs(j) - cold->sequences(i).logprobs(j));
    }
    *step.mutable_batch(i)->mutable_gen_logprobs() = hot->sequences(i).logprobs();
  }
  EXPECT_GT(diff, 0.1);

  v1::TrainStepRequest at_one = step;
  step.mutable_algorithm()->set_temperature(2.0);
  absl::StatusOr<v1::TrainStepResponse> r = trainer_.train_step(step);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mismatch().token_mult_prob_error(), 1.0);
  EXPECT_EQ(r->mismatch().sampling_importance_ratio(), 1.0);

  at_one.mutable_algorithm()->set_temperature(-1.0);
  expect_invalid(trainer_.train_step(at_one).status(), "algorithm.temperature");
  req.set_temperature(std::nan(""));
  expect_invalid(trainer_.compute_logprobs(req).status(), "temperature");
}

}  // namespace fp8rl::trainer
