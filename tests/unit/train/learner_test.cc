// The training layer without protobuf: GRPO and SFT updates, the export for generation (KV
// calibration from the update's own forward, and before the first rollout) and checkpoints.
#include "train/learner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "engine/cpu/train_ops.h"
#include "kernels/gemm.h"
#include "model/kv_calibration.h"
#include "model/rng.h"
#include "tests/unit/train/tiny_model.h"
#include "train/checkpoint.h"

namespace fp8rl::train {
namespace {

using test_model::kVocab;
using test_model::tiny_config;

InitRequest init_request(Precision training, Precision generation) {
  InitRequest r;
  r.job_id = "job-1";
  r.model_config_json = model::model_config_to_json(tiny_config());
  r.seed = 7;
  r.precision.training = training;
  r.precision.generation = generation;
  r.precision.kv_cache = Precision::kFP8;
  r.adamw.lr = 1e-2;
  r.adamw.max_grad_norm = 1.0;
  return r;
}

std::unique_ptr<Learner> make(const InitRequest& r) {
  absl::StatusOr<std::unique_ptr<Learner>> l = Learner::create(r);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::move(*l) : nullptr;
}

// `n` sequences: a 3-token prompt and a 4..6-token response of random ids, advantages
// alternating +1 / -1, gen_logprobs random in [-4, -0.5].
std::vector<Sequence> random_batch(uint64_t seed, int n) {
  model::Rng rng(seed);
  std::vector<Sequence> out(n);
  for (int i = 0; i < n; ++i) {
    const int len = 3 + 4 + static_cast<int>(rng.next() % 3);
    for (int t = 0; t < len; ++t)
      out[i].tokens.push_back(static_cast<int32_t>(rng.next() % kVocab));
    out[i].prompt_length = 3;
    out[i].advantage = i % 2 == 0 ? 1.0f : -1.0f;
    for (int t = 3; t < len; ++t) {
      out[i].gen_logprobs.push_back(static_cast<float>(-0.5 - 3.5 * rng.uniform()));
    }
  }
  return out;
}

GrpoRequest grpo(std::vector<Sequence> batch) {
  GrpoRequest r;
  r.batch = std::move(batch);
  r.loss.clip_eps = 0.2;
  r.loss.is.rule = rl::IsRule::kTis;
  return r;
}

// KV scales as the old extra calibration pass computed them: `gen` run once per sequence with a
// calibrator, p99.9 x 1.05 / 448.
model::KvScales scales_per_sequence(const model::Model& gen, const model::TokenBatch& tokens) {
  model::KvCalibrator calibrator(gen.config().num_hidden_layers);
  engine::TrainStepOptions opts;
  opts.calibrator = &calibrator;
  for (const auto& seq : tokens) {
    EXPECT_TRUE(engine::cpu_logprobs(gen, {seq}, opts).ok());
  }
  return calibrator.scales(kKvCalibrationPercentile, kKvCalibrationMargin);
}

std::unique_ptr<model::Model> generation_model(const Learner& l) {
  absl::StatusOr<model::WeightSet> master = l.policy().export_weights(model::WeightFormat::kF32);
  EXPECT_TRUE(master.ok());
  absl::StatusOr<std::unique_ptr<model::Model>> g =
      model::Model::FromWeightSet(*master, l.precision().generation_policy());
  EXPECT_TRUE(g.ok()) << g.status();
  return std::move(*g);
}

std::vector<float> exported_scales(const model::WeightSet& set, const char* kv, int64_t layers) {
  std::vector<float> out;
  for (int64_t l = 0; l < layers; ++l) {
    const model::NamedTensor* t =
        set.find("model.layers." + std::to_string(l) + ".self_attn." + kv);
    EXPECT_NE(t, nullptr);
    if (t == nullptr) return out;
    out.push_back((*model::tensor_to_f32(*t))[0]);
  }
  return out;
}

model::TokenBatch tokens_of(const std::vector<Sequence>& seqs) {
  model::TokenBatch out;
  for (const Sequence& s : seqs) out.push_back(s.tokens);
  return out;
}

// Relative difference |a - b| / b, largest over layers (scales are > 0).
double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / b[i]);
  }
  return worst;
}

// FP8 training and generation: the KV scales come from the K/V amax the prev-logprobs forward of
// the update recorded, one sample per sequence. They equal what the old extra pass (one forward
// per sequence on the generation model) computes on the same data and the same weights, and
// exporting runs no forward at all.
TEST(Learner, KvScalesComeFromTheUpdatesForwardWithoutAnExtraPass) {
  std::unique_ptr<Learner> l = make(init_request(Precision::kFP8, Precision::kFP8));
  ASSERT_NE(l, nullptr);
  const std::vector<Sequence> batch = random_batch(21, 6);
  const model::TokenBatch tokens = tokens_of(batch);
  // The old pass, on the weights the prev-logprobs forward runs with (before the update).
  const model::KvScales want = scales_per_sequence(*generation_model(*l), tokens);
  for (float s : want.k) ASSERT_NE(s, 1.0f);
  GrpoRequest r = grpo(batch);
  r.minibatches = 2;
  r.epochs = 2;
  ASSERT_TRUE(l->grpo_update(r).ok());
  // One record per sequence, from the prev-logprobs forward only (not the 4 training forwards).
  EXPECT_EQ(l->kv_calibration_records(), 6);

  const int64_t forwards = engine::train_forward_calls_total();
  absl::StatusOr<Export> e = l->export_for_generation(Precision::kFP8, 1, /*calibrate_kv=*/true);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(engine::train_forward_calls_total(), forwards) << "export ran a forward";
  EXPECT_TRUE(e->calibrated);
  EXPECT_EQ(e->policy, l->precision().generation_policy());
  EXPECT_EQ(exported_scales(e->weights, "k_scale", 2), want.k);
  EXPECT_EQ(exported_scales(e->weights, "v_scale", 2), want.v);
  // The training policy takes the same scales (its KV fake-quant matches generation).
  EXPECT_EQ(l->policy().kv_scales().k, want.k);
  EXPECT_EQ(l->policy().kv_scales().v, want.v);
  // The payload says which policy to run it with.
  const nlohmann::json config = nlohmann::json::parse(e->weights.config_json);
  PrecisionPolicy announced;
  ASSERT_TRUE(precision_policy_from_json(config.at(kPrecisionConfigKey), "x", &announced).ok());
  announced.train_kv_fake_quant = e->policy.train_kv_fake_quant;
  EXPECT_EQ(announced, e->policy);
}

// BF16 training, FP8 generation: the step has no FP8 forward, so the amax comes from the BF16
// prev-logprobs forward (docs/design/fp8-recipe.md "The FP8 recipe" says why). No extra pass
// either; the scales stay within the 5% calibration margin of what the FP8 generation model would
// record.
TEST(Learner, MixedPrecisionKvScalesComeFromTheTrainingForward) {
  std::unique_ptr<Learner> l = make(init_request(Precision::kBF16, Precision::kFP8));
  ASSERT_NE(l, nullptr);
  const std::vector<Sequence> batch = random_batch(21, 6);
  const model::TokenBatch tokens = tokens_of(batch);
  const model::KvScales training = scales_per_sequence(l->policy(), tokens);
  const model::KvScales fp8 = scales_per_sequence(*generation_model(*l), tokens);
  ASSERT_TRUE(l->grpo_update(grpo(batch)).ok());

  const int64_t forwards = engine::train_forward_calls_total();
  absl::StatusOr<Export> e = l->export_for_generation(Precision::kFP8, 1, /*calibrate_kv=*/true);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(engine::train_forward_calls_total(), forwards) << "export ran a forward";
  EXPECT_TRUE(e->calibrated);
  EXPECT_EQ(exported_scales(e->weights, "k_scale", 2), training.k);
  EXPECT_EQ(exported_scales(e->weights, "v_scale", 2), training.v);
  const double dk = max_relative_difference(training.k, fp8.k);
  const double dv = max_relative_difference(training.v, fp8.v);
  EXPECT_LT(dk, kKvCalibrationMargin - 1) << "bf16 vs fp8 forward k amax";
  EXPECT_LT(dv, kKvCalibrationMargin - 1) << "bf16 vs fp8 forward v amax";
  std::printf("bf16 vs fp8 forward KV scales: max relative difference k %.4f v %.4f\n", dk, dv);
}

// SFT has no logprobs pass: its training forwards record, one sample per sequence.
TEST(Learner, SftRecordsKvAmaxInItsTrainingForwards) {
  std::unique_ptr<Learner> l = make(init_request(Precision::kFP8, Precision::kFP8));
  ASSERT_NE(l, nullptr);
  SftRequest r;
  r.batch = random_batch(26, 5);
  for (Sequence& s : r.batch) s.gen_logprobs.clear();
  r.learning_rate = 1e-2;
  r.minibatches = 1;
  const model::KvScales want = scales_per_sequence(l->policy(), tokens_of(r.batch));
  ASSERT_TRUE(l->sft_update(r).ok());
  EXPECT_EQ(l->kv_calibration_records(), 5);
  const int64_t forwards = engine::train_forward_calls_total();
  absl::StatusOr<Export> e = l->export_for_generation(Precision::kFP8, 1, /*calibrate_kv=*/true);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(engine::train_forward_calls_total(), forwards);
  EXPECT_EQ(exported_scales(e->weights, "k_scale", 2), want.k);
  EXPECT_EQ(exported_scales(e->weights, "v_scale", 2), want.v);
}

// Without SFT the first publish comes before any update: it calibrates on the init request's
// calibration sequences instead of leaving the KV scales at 1.
TEST(Learner, FirstPublishCalibratesOnTheCalibrationSequences) {
  InitRequest r = init_request(Precision::kFP8, Precision::kFP8);
  r.calibration = random_batch(22, 5);
  std::unique_ptr<Learner> l = make(r);
  ASSERT_NE(l, nullptr);
  for (float s : l->policy().kv_scales().k) ASSERT_EQ(s, 1.0f);
  const model::KvScales want = scales_per_sequence(l->policy(), tokens_of(r.calibration));
  const int64_t forwards = engine::train_forward_calls_total();
  absl::StatusOr<Export> e = l->export_for_generation(Precision::kFP8, 1, true);
  ASSERT_TRUE(e.ok()) << e.status();
  // No update yet: one forward over the calibration sequences (one sample per sequence).
  EXPECT_EQ(engine::train_forward_calls_total(), forwards + 1);
  EXPECT_TRUE(e->calibrated);
  EXPECT_EQ(exported_scales(e->weights, "k_scale", 2), want.k);
  EXPECT_EQ(exported_scales(e->weights, "v_scale", 2), want.v);
  for (float s : want.k) EXPECT_NE(s, 1.0f);

  // No data at all: nothing to calibrate on, the scales stay.
  std::unique_ptr<Learner> bare = make(init_request(Precision::kFP8, Precision::kFP8));
  absl::StatusOr<Export> none = bare->export_for_generation(Precision::kFP8, 1, true);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->calibrated);
}

// The GRPO update with a positive advantage raises that sequence's logprob and lowers the
// negative one's; each minibatch is one optimizer step, epochs repeat them.
TEST(Learner, GrpoUpdateFollowsTheAdvantageAndCountsSteps) {
  std::unique_ptr<Learner> l = make(init_request(Precision::kFP8, Precision::kFP8));
  ASSERT_NE(l, nullptr);
  std::vector<Sequence> batch = random_batch(23, 4);
  // On-policy: gen logprobs are the current ones.
  absl::StatusOr<std::vector<std::vector<float>>> cur = l->logprobs(batch, 0, false);
  ASSERT_TRUE(cur.ok()) << cur.status();
  for (size_t i = 0; i < batch.size(); ++i) batch[i].gen_logprobs = (*cur)[i];
  GrpoRequest r = grpo(batch);
  r.minibatches = 2;
  r.epochs = 3;
  absl::StatusOr<GrpoResult> res = l->grpo_update(r);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->updates, 6);
  EXPECT_EQ(l->optimizer_steps(), 6);
  EXPECT_EQ(l->version(), 1);
  EXPECT_NEAR(res->mismatch.token_mult_prob_error, 1.0, 1e-6);
  EXPECT_GT(res->grad_norm, 0.0);
  absl::StatusOr<std::vector<std::vector<float>>> after = l->logprobs(batch, 0, false);
  ASSERT_TRUE(after.ok());
  double up = 0, down = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    double delta = 0;
    for (size_t j = 0; j < (*after)[i].size(); ++j) delta += (*after)[i][j] - (*cur)[i][j];
    (i % 2 == 0 ? up : down) += delta;
  }
  EXPECT_GT(up, 0.0);
  EXPECT_LT(down, 0.0);
  // The next publish calibrates on the prev-logprobs forward: one sample per sequence.
  EXPECT_EQ(l->kv_calibration_records(), static_cast<int64_t>(batch.size()));
}

TEST(Learner, StopFlagInterruptsBetweenStepsAndStillMakesAVersion) {
  std::unique_ptr<Learner> l = make(init_request(Precision::kBF16, Precision::kBF16));
  ASSERT_NE(l, nullptr);
  std::atomic<bool> stop{true};
  absl::StatusOr<GrpoResult> res = l->grpo_update(grpo(random_batch(24, 2)), &stop);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(l->version(), 0);  // nothing applied
  EXPECT_EQ(l->optimizer_steps(), 0);
}

TEST(Learner, SftLowersNllOnARepeatedBatch) {
  std::unique_ptr<Learner> l = make(init_request(Precision::kBF16, Precision::kBF16));
  ASSERT_NE(l, nullptr);
  SftRequest r;
  r.batch = random_batch(25, 4);
  for (Sequence& s : r.batch) s.gen_logprobs.clear();
  r.learning_rate = 1e-2;
  r.minibatches = 2;
  absl::StatusOr<SftResult> first = l->sft_update(r);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<SftResult> last;
  for (int i = 0; i < 10; ++i) last = l->sft_update(r);
  ASSERT_TRUE(last.ok());
  EXPECT_LT(last->loss, first->loss);
  EXPECT_EQ(l->version(), 11);
  EXPECT_EQ(l->optimizer_steps(), 22);
}

TEST(Learner, BadRequestsNameTheField) {
  std::unique_ptr<Learner> l = make(init_request(Precision::kFP8, Precision::kFP8));
  ASSERT_NE(l, nullptr);
  auto expect = [](const absl::Status& s, const std::string& field) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message().substr(0, field.size()), field) << s;
  };
  GrpoRequest r = grpo(random_batch(26, 2));
  r.batch[1].gen_logprobs.pop_back();
  expect(l->grpo_update(r).status(), "batch[1].gen_logprobs");
  r = grpo(random_batch(26, 2));
  r.loss.clip_eps = 1.0;
  expect(l->grpo_update(r).status(), "algorithm.clip_eps");
  r = grpo(random_batch(26, 2));
  r.minibatches = 3;
  expect(l->grpo_update(r).status(), "algorithm.minibatches");
  r = grpo(random_batch(26, 2));
  r.loss.kl_beta = 0.1;
  EXPECT_EQ(l->grpo_update(r).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(l->version(), 0);

  InitRequest bad = init_request(Precision::kF32, Precision::kFP8);
  expect(Learner::create(bad).status(), "precision.training: fp32 is not supported");
  bad = init_request(Precision::kFP8, Precision::kFP8);
  bad.precision.bf16_last_layers = -1;
  expect(Learner::create(bad).status(), "precision.bf16_last_layers");
  bad = init_request(Precision::kFP8, Precision::kFP8);
  bad.calibration = random_batch(27, 1);
  bad.calibration[0].tokens[0] = kVocab;
  expect(Learner::create(bad).status(), "calibration[0].tokens");
}

// A checkpoint restores weights, optimizer state, versions and precision: the next update is
// bit-identical to one without the save/load.
TEST(Learner, CheckpointRoundTripContinuesBitIdentically) {
  InitRequest init = init_request(Precision::kBF16, Precision::kFP8);
  init.keep_reference = true;
  std::unique_ptr<Learner> a = make(init);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->grpo_update(grpo(random_batch(28, 3))).ok());
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("fp8rl_learner_ckpt_" + std::to_string(getpid())))
          .string();
  absl::StatusOr<SavedCheckpoint> saved = save_checkpoint(*a, dir, /*include_optimizer=*/true);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->version, 1);
  EXPECT_GT(saved->bytes, 0u);
  absl::StatusOr<LoadedCheckpoint> loaded = load_checkpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Learner& b = *loaded->learner;
  EXPECT_TRUE(loaded->optimizer_restored);
  EXPECT_EQ(b.precision(), a->precision());
  EXPECT_EQ(b.job_id(), "job-1");
  EXPECT_EQ(b.version(), 1);
  EXPECT_NE(b.reference(), nullptr);
  EXPECT_EQ(*checkpoint_version(dir), 1);

  const GrpoRequest next = grpo(random_batch(29, 3));
  ASSERT_TRUE(a->grpo_update(next).ok());
  ASSERT_TRUE(b.grpo_update(next).ok());
  const auto pa = a->policy().params(), pb = b.policy().params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) ASSERT_EQ(pa[i], pb[i]) << i;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp8rl::train

namespace fp8rl::train {
namespace {

// Mixture of experts: a GRPO step reports the routing statistics; with the generation's own
// routing replayed nothing is overridden, with a different routing replayed the step reports
// where the router disagreed and trains through the replayed experts; a malformed record is an
// error naming the field.
TEST(LearnerMoe, RoutingReplayStatsAndErrors) {
  model::ModelConfig c = tiny_config();
  c.model_type = "qwen3_moe";
  c.moe.num_experts = 4;
  c.moe.num_experts_per_tok = 2;
  c.moe.moe_intermediate_size = 32;
  c.moe.norm_topk_prob = true;
  InitRequest init = init_request(Precision::kFP8, Precision::kFP8);
  init.model_config_json = model::model_config_to_json(c);
  std::unique_ptr<Learner> learner = make(init);
  ASSERT_NE(learner, nullptr);
  std::vector<Sequence> batch = random_batch(5, 4);
  // The routing the policy itself takes (what generation with the same kernels records).
  model::TokenBatch tokens;
  for (const Sequence& s : batch) tokens.push_back(s.tokens);
  engine::CpuTrainStep ctx;
  ASSERT_TRUE(ctx.forward(learner->policy(), tokens, {}).ok());
  const int64_t width = learner->policy().routing_width();
  ASSERT_EQ(width, 2 * 2);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].routing = ctx.routing.used[i];
    batch[i].routing.resize((batch[i].tokens.size() - 1) *
                            width);  // generation never feeds the last
  }
  int64_t expected_tokens = 0;
  for (const Sequence& s : batch) expected_tokens += static_cast<int64_t>(s.tokens.size()) - 1;

  GrpoRequest off = grpo(batch);
  absl::StatusOr<PolicyGradient> g_off = learner->gradient(off);
  ASSERT_TRUE(g_off.ok()) << g_off.status();
  // A different routing: every token of every layer swapped to the two other experts.
  std::vector<Sequence> swapped = batch;
  for (Sequence& s : swapped) {
    for (size_t i = 0; i < s.routing.size(); i += 2) {
      const int32_t a = s.routing[i], b = s.routing[i + 1];
      std::vector<int32_t> rest;
      for (int32_t e = 0; e < 4; ++e) {
        if (e != a && e != b) rest.push_back(e);
      }
      s.routing[i] = rest[0];
      s.routing[i + 1] = rest[1];
    }
  }
  GrpoRequest replay = grpo(swapped);
  replay.routing_replay = true;
  replay.router_aux_loss_coef = 0.01;
  absl::StatusOr<PolicyGradient> g_replay = learner->gradient(replay);
  ASSERT_TRUE(g_replay.ok()) << g_replay.status();
  double diff = 0;
  for (size_t i = 0; i < g_off->grads.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(g_off->grads[i] - g_replay->grads[i])));
  }
  EXPECT_GT(diff, 1e-6) << "replaying other experts must change the gradient";

  absl::StatusOr<GrpoResult> same = learner->grpo_update(off);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->moe.present);
  EXPECT_FALSE(same->moe.replay);
  EXPECT_EQ(same->moe.routed_tokens, expected_tokens);
  EXPECT_EQ(same->moe.differ_tokens, 0);
  EXPECT_EQ(same->moe.num_experts, 4);
  ASSERT_EQ(same->moe.expert_tokens.size(), 2u * 4u);
  int64_t rows = 0;
  for (int64_t n : same->moe.expert_tokens) rows += n;
  EXPECT_EQ(rows, 2 * 2 * (expected_tokens + 4));  // layers x k x every token
  EXPECT_GT(same->moe.aux_loss, 0.5);

  // The swapped routing is disjoint from the router's choice of one update ago: the router
  // (moved by one small step) disagrees with it on most tokens.
  absl::StatusOr<GrpoResult> r = learner->grpo_update(replay);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->moe.replay);
  EXPECT_EQ(r->moe.routed_tokens, expected_tokens);
  EXPECT_GT(r->moe.differ_tokens, expected_tokens / 2);
  // What the logprob log carries (docs/metrics.md): per sequence the record as sent and the
  // router's own choice for every token; under replay the latter is not the record, and the
  // tokens where they differ as sets are the step's differ_tokens.
  ASSERT_EQ(r->logprobs.size(), swapped.size());
  int64_t differ = 0;
  for (size_t i = 0; i < swapped.size(); ++i) {
    EXPECT_EQ(r->logprobs[i].gen_routing, swapped[i].routing);
    ASSERT_EQ(r->logprobs[i].router_routing.size(),
              swapped[i].tokens.size() * static_cast<size_t>(width));
    for (size_t t = 0; t * width < swapped[i].routing.size(); ++t) {
      bool d = false;
      for (int64_t j = 0; j < width; j += 2) {
        const int32_t* g = swapped[i].routing.data() + t * width + j;
        const int32_t* c = r->logprobs[i].router_routing.data() + t * width + j;
        d |= !((g[0] == c[0] && g[1] == c[1]) || (g[0] == c[1] && g[1] == c[0]));
      }
      differ += d ? 1 : 0;
    }
  }
  EXPECT_EQ(differ, r->moe.differ_tokens);
  // Without replay, from the generation's own routing: the router chose exactly the record.
  for (size_t i = 0; i < batch.size(); ++i) {
    const GrpoResult::SequenceLogprobs& l = same->logprobs[i];
    ASSERT_EQ(l.router_routing.size(), batch[i].tokens.size() * static_cast<size_t>(width));
    EXPECT_TRUE(std::equal(l.gen_routing.begin(), l.gen_routing.end(), l.router_routing.begin()));
  }

  std::vector<Sequence> bad = batch;
  bad[2].routing[1] = 9;
  absl::StatusOr<GrpoResult> err = learner->grpo_update(grpo(bad));
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(err.status().message().find("batch[2].routed_experts"), std::string::npos)
      << err.status();
}

}  // namespace
}  // namespace fp8rl::train

namespace fp8rl::train {
namespace {

// FNV-1a over bytes, for the golden digests below.
struct Digest {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <typename T>
  void value(const T& v) {
    bytes(&v, sizeof(v));
  }
  template <typename T>
  void values(const std::vector<T>& v) {
    bytes(v.data(), v.size() * sizeof(T));
  }
};

struct GoldenCase {
  const char* name;
  const char* model_type;  // llama, qwen3_moe, qwen2_moe
  Precision training;
  Recompute recompute;
  bool replay;  // MoE: replay a routing record (not the router's own) with a load-balancing loss
  uint64_t digest;
};

// Three GRPO updates (two minibatches each) of the CPU learner on fixed data: every metric of
// every update (losses, grad norm, clip fraction, mismatch, MoE routing statistics, the prev
// logprobs and router routing bit for bit), then the fp32 master and the exported generation
// weights, folded into one digest. The digests were recorded with CPU training on
// Model::forward / Model::backward, before CpuTrainBackend moved to the engine's training step
// (engine/train_step.h over CpuTrainOps); the engine must reproduce them bit for bit. They depend
// on the CPU's float kernels: they were recorded with OpenBLAS's Haswell kernels (an x86-64 with
// AVX2 and FMA), and another kernel set sums in another order, so elsewhere the test skips (the
// engine's step is checked against Model::forward / Model::backward on every machine by
// tests/unit/engine/train_step_test.cc). On a mismatch, first run this test at the commit before
// the switch on the same machine.
TEST(LearnerGolden, ThreeGrpoUpdatesAreBitIdenticalToTheModelPath) {
  const std::string core = kernels::blas_core_name();
  if (core != "Haswell") {
    GTEST_SKIP() << "digests recorded with OpenBLAS's Haswell kernels; this machine uses '" << core
                 << "'";
  }
  const std::vector<GoldenCase> cases = {
      {"llama_fp8", "llama", Precision::kFP8, Recompute::kNone, false, 0x705a642e9fee9a30ull},
      {"llama_bf16_recompute", "llama", Precision::kBF16, Recompute::kLayers, false,
       0x70511abaa4e9c51aull},
      {"qwen3_moe_fp8_replay_aux", "qwen3_moe", Precision::kFP8, Recompute::kNone, true,
       0x950244cb03419e72ull},
      {"qwen2_moe_bf16_recompute", "qwen2_moe", Precision::kBF16, Recompute::kLayers, false,
       0x954517a82742854bull},
  };
  for (const GoldenCase& gc : cases) {
    SCOPED_TRACE(gc.name);
    model::ModelConfig c = tiny_config();
    c.model_type = gc.model_type;
    const bool moe = c.model_type != "llama";
    if (moe) {
      c.moe.num_experts = 4;
      c.moe.num_experts_per_tok = 2;
      c.moe.moe_intermediate_size = 32;
      c.moe.norm_topk_prob = c.model_type == "qwen3_moe";
      if (c.model_type == "qwen3_moe") c.moe.mlp_only_layers = {0};  // a dense layer too
      if (c.model_type == "qwen2_moe") {
        c.moe.shared_expert_intermediate_size = 48;
        c.attention_bias = true;
      }
    }
    InitRequest init = init_request(gc.training, gc.training);
    init.model_config_json = model::model_config_to_json(c);
    init.placement.recompute = gc.recompute;
    std::unique_ptr<Learner> learner = make(init);
    ASSERT_NE(learner, nullptr);
    Digest d;
    model::Rng rng(31);
    for (int update = 0; update < 3; ++update) {
      std::vector<Sequence> batch = random_batch(100 + update, 6);
      GrpoRequest request = grpo(batch);
      request.minibatches = 2;
      if (gc.replay) {
        // k distinct random experts per token and sparse layer, all but the last token.
        const int64_t width = learner->policy().routing_width();
        for (Sequence& s : request.batch) {
          for (size_t g = 0; g < (s.tokens.size() - 1) * width / 2; ++g) {
            const int32_t a = static_cast<int32_t>(rng.next() % 4);
            const int32_t b = static_cast<int32_t>((a + 1 + rng.next() % 3) % 4);
            s.routing.push_back(a);
            s.routing.push_back(b);
          }
        }
        request.routing_replay = true;
        request.router_aux_loss_coef = 0.01;
      }
      absl::StatusOr<GrpoResult> r = learner->grpo_update(request);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->updates, 2);
      EXPECT_GT(r->grad_norm, 0.0);
      for (double v : {r->loss, r->pg_loss, r->kl, r->grad_norm, r->learning_rate, r->clip_fraction,
                       r->mismatch.token_mult_prob_error, r->moe.aux_loss}) {
        d.value(v);
      }
      d.value(r->tokens);
      d.value(r->moe.routed_tokens);
      d.value(r->moe.differ_tokens);
      d.values(r->moe.expert_tokens);
      for (const GrpoResult::SequenceLogprobs& s : r->logprobs) {
        d.values(s.prev);
        d.values(s.router_routing);
      }
      EXPECT_EQ(r->moe.present, moe);
      if (moe) {
        EXPECT_GT(r->moe.aux_loss, 0.0);
      }
    }
    d.bytes(learner->policy().params().data(), learner->policy().params().size() * sizeof(float));
    absl::StatusOr<model::WeightSet> exported = learner->export_weights(
        gc.training == Precision::kFP8 ? model::WeightFormat::kFP8 : model::WeightFormat::kBF16, 3);
    ASSERT_TRUE(exported.ok()) << exported.status();
    for (const model::NamedTensor& t : exported->tensors) d.values(t.bytes);
    std::printf("[golden] %s digest 0x%016llx\n", gc.name, static_cast<unsigned long long>(d.h));
    EXPECT_EQ(d.h, gc.digest) << gc.name;
  }
}

}  // namespace
}  // namespace fp8rl::train
