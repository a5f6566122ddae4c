// The training backend boundary (train/train_backend.h): activation recomputation gives the same
// gradients with fewer saved activations, the learner over the CPU backend with recomputation
// trains bit-identically, a checkpoint loads through any placement, and asking for the CUDA
// backend without a device is a clear FAILED_PRECONDITION. Plus the memory plan's hand-computed
// numbers (train/memory_plan.h) and their agreement with the activations a forward really keeps.
#include "train/train_backend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "engine/cpu/train_ops.h"
#include "model/device.h"
#include "model/rng.h"
#include "tests/unit/train/tiny_model.h"
#include "train/checkpoint.h"
#include "train/device_train_backend.h"
#include "train/learner.h"
#include "train/memory_plan.h"

namespace fp8rl::train {
namespace {

using test_model::kVocab;
using test_model::tiny_config;

model::TokenBatch random_tokens(uint64_t seed, int n) {
  model::Rng rng(seed);
  model::TokenBatch out(n);
  for (int i = 0; i < n; ++i) {
    const int len = 5 + static_cast<int>(rng.next() % 7);
    for (int t = 0; t < len; ++t) out[i].push_back(static_cast<int32_t>(rng.next() % kVocab));
  }
  return out;
}

model::TokenValues random_dlogp(uint64_t seed, const model::TokenBatch& batch) {
  model::Rng rng(seed);
  model::TokenValues out(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    for (size_t t = 0; t + 1 < batch[s].size(); ++t) {
      out[s].push_back(static_cast<float>(rng.uniform() * 2.0 - 1.0));
    }
  }
  return out;
}

PrecisionPolicy policy_of(Precision linear) {
  PrecisionConfig p;
  p.training = linear;
  p.kv_cache = linear == Precision::kF32 ? Precision::kF32 : Precision::kFP8;
  p.bf16_last_layers = linear == Precision::kFP8 ? 1 : 0;
  return p.training_policy();
}

struct Grads {
  std::vector<float> grads;
  model::TokenValues logprobs;
  int64_t saved_bytes = 0;
};

Grads gradients(const model::Model& m, const model::TokenBatch& batch, bool recompute) {
  Grads out;
  engine::CpuTrainStep ctx;
  engine::TrainStepOptions opts;
  opts.recompute_layers = recompute;
  absl::StatusOr<model::TokenValues> lp = ctx.forward(m, batch, opts);
  EXPECT_TRUE(lp.ok()) << lp.status();
  if (!lp.ok()) return out;
  out.logprobs = *lp;
  out.saved_bytes = ctx.saved_bytes();
  out.grads.assign(m.num_params(), 0.0f);
  EXPECT_TRUE(ctx.backward(m, random_dlogp(3, batch), out.grads.data()).ok());
  return out;
}

// Recomputing each layer in the backward reproduces the intermediates bit for bit: the logprobs
// and every gradient are identical, for fp32, bf16 and fp8 (with a bf16 last layer and an FP8 KV
// cache's fake quantization) and for Qwen3's per-head q/k norms; the forward keeps only each
// layer's input.
TEST(Recompute, GradientsBitIdenticalWithFewerSavedActivations) {
  for (const char* type : {"llama", "qwen3"}) {
    for (Precision linear : {Precision::kF32, Precision::kBF16, Precision::kFP8}) {
      SCOPED_TRACE(std::string(type) + " " + std::string(precision_name(linear)));
      model::ModelConfig c = tiny_config();
      c.model_type = type;
      absl::StatusOr<std::unique_ptr<model::Model>> m =
          model::Model::Init(c, policy_of(linear), 11);
      ASSERT_TRUE(m.ok()) << m.status();
      const model::TokenBatch batch = random_tokens(5, 4);
      const Grads full = gradients(**m, batch, false);
      const Grads again = gradients(**m, batch, true);
      ASSERT_EQ(full.grads.size(), again.grads.size());
      ASSERT_EQ(full.logprobs, again.logprobs);
      EXPECT_EQ(
          std::memcmp(full.grads.data(), again.grads.data(), full.grads.size() * sizeof(float)), 0);
      double norm = 0;
      for (float g : full.grads) norm += static_cast<double>(g) * g;
      EXPECT_GT(norm, 0.0);  // not a comparison of zeros
      EXPECT_LT(again.saved_bytes, full.saved_bytes);
    }
  }
}

// What the training step holds is what the memory plan counts (engine::train_buffer_floats for
// the step's tokens), with and without recomputation.
TEST(Recompute, SavedActivationsMatchTheMemoryPlan) {
  const model::ModelConfig c = tiny_config();
  absl::StatusOr<std::unique_ptr<model::Model>> m =
      model::Model::Init(c, policy_of(Precision::kF32), 11);
  ASSERT_TRUE(m.ok());
  const model::TokenBatch batch = random_tokens(6, 3);
  int64_t tokens = 0;
  for (const auto& s : batch) tokens += static_cast<int64_t>(s.size());
  int64_t kept = 0;
  for (bool recompute : {false, true}) {
    MemoryPlanInput in;
    in.config = c;
    in.policy = policy_of(Precision::kF32);
    in.step_tokens = tokens;
    in.recompute_layers = recompute;
    absl::StatusOr<MemoryPlan> plan = plan_training_memory(in);
    ASSERT_TRUE(plan.ok());
    const int64_t saved = gradients(**m, batch, recompute).saved_bytes;
    EXPECT_EQ(saved, plan->activations) << recompute;
    // At least what the forward must keep: every layer's input, and without recomputation
    // each layer's full set (418 values per token in this config: hand count).
    const int64_t floor = 4 * tokens * c.hidden_size * c.num_hidden_layers;
    EXPECT_GE(saved, recompute ? floor : 4 * tokens * 418 * c.num_hidden_layers) << recompute;
    if (recompute) {
      EXPECT_LT(saved, kept);
    } else {
      kept = saved;
    }
  }
}

InitRequest init_request() {
  InitRequest r;
  r.job_id = "job-b";
  r.model_config_json = model::model_config_to_json(tiny_config());
  r.seed = 9;
  r.precision.training = Precision::kFP8;
  r.precision.generation = Precision::kFP8;
  r.precision.kv_cache = Precision::kFP8;
  r.adamw.lr = 1e-2;
  return r;
}

GrpoRequest grpo_request(uint64_t seed) {
  GrpoRequest r;
  model::Rng rng(seed);
  for (const auto& tokens : random_tokens(seed, 4)) {
    Sequence s;
    s.tokens = tokens;
    s.prompt_length = 2;
    s.advantage = rng.uniform() < 0.5 ? 1.0f : -1.0f;
    for (size_t t = 2; t < tokens.size(); ++t) {
      s.gen_logprobs.push_back(static_cast<float>(-0.5 - 3.0 * rng.uniform()));
    }
    r.batch.push_back(std::move(s));
  }
  r.loss.clip_eps = 0.2;
  r.minibatches = 2;
  return r;
}

std::vector<float> params_of(const Learner& l) {
  const auto p = l.policy().params();
  return {p.begin(), p.end()};
}

// The fp32 master weights of any backend, through its checkpoint export (a device backend holds
// none on the host).
std::vector<float> master_of(const Learner& l) {
  absl::StatusOr<model::WeightSet> set = l.backend().export_weights(model::WeightFormat::kF32, 0);
  EXPECT_TRUE(set.ok()) << set.status();
  std::vector<float> out;
  if (!set.ok()) return out;
  for (const model::NamedTensor& t : set->tensors) {
    if (t.name.ends_with("_scale")) continue;  // KV scales
    const size_t n = t.bytes.size() / sizeof(float);
    out.resize(out.size() + n);
    std::memcpy(out.data() + out.size() - n, t.bytes.data(), t.bytes.size());
  }
  return out;
}

// The learner with --recompute layers takes the same GRPO steps bit for bit.
TEST(TrainBackend, LearnerWithRecomputeTrainsBitIdentically) {
  InitRequest plain = init_request(), recomputing = init_request();
  recomputing.placement.recompute = Recompute::kLayers;
  absl::StatusOr<std::unique_ptr<Learner>> a = Learner::create(plain);
  absl::StatusOr<std::unique_ptr<Learner>> b = Learner::create(recomputing);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*b)->backend().recompute(), Recompute::kLayers);
  const std::vector<float> before = params_of(**a);
  for (uint64_t step = 0; step < 2; ++step) {
    absl::StatusOr<GrpoResult> ra = (*a)->grpo_update(grpo_request(20 + step));
    absl::StatusOr<GrpoResult> rb = (*b)->grpo_update(grpo_request(20 + step));
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
    EXPECT_EQ(ra->loss, rb->loss);
    EXPECT_EQ(ra->grad_norm, rb->grad_norm);
    EXPECT_GT(ra->grad_norm, 0.0);
  }
  EXPECT_NE(params_of(**a), before);
  EXPECT_EQ(params_of(**a), params_of(**b));
}

// A checkpoint goes through the backend both ways: saved from a learner that recomputes, loaded
// into a plain one (and the other way round), the next step is the same.
TEST(TrainBackend, CheckpointLoadsIntoAnyPlacement) {
  InitRequest init = init_request();
  init.placement.recompute = Recompute::kLayers;
  absl::StatusOr<std::unique_ptr<Learner>> a = Learner::create(init);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->grpo_update(grpo_request(30)).ok());
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("fp8rl_backend_ckpt_" + std::to_string(getpid())))
          .string();
  ASSERT_TRUE(save_checkpoint(**a, dir, /*include_optimizer=*/true).ok());
  TrainPlacement plain;
  absl::StatusOr<LoadedCheckpoint> b = load_checkpoint(dir, plain);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->learner->backend().recompute(), Recompute::kNone);
  EXPECT_EQ(b->learner->optimizer_steps(), (*a)->optimizer_steps());
  EXPECT_EQ(params_of(*b->learner), params_of(**a));
  ASSERT_TRUE((*a)->grpo_update(grpo_request(31)).ok());
  ASSERT_TRUE(b->learner->grpo_update(grpo_request(31)).ok());
  EXPECT_EQ(params_of(*b->learner), params_of(**a));

  if (!model::probe_cuda_device().device.has_value()) {
    TrainPlacement cuda;
    cuda.device = model::Device::kCuda;
    absl::StatusOr<LoadedCheckpoint> c = load_checkpoint(dir, cuda);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  }
  std::filesystem::remove_all(dir);
}

// The device backend's logic (train/device_train_backend.h: gradients through the state's
// device array and the learner's host buffer, AdamW + re-quantization in the device state, the
// engine refreshed from the state's master, export and checkpoints from the state) on its host
// mirror: every step, the published FP8 payload and a checkpoint are bit-identical to the CPU
// backend's. This is what the CUDA backend runs, with the host mirror's ops and memory.
TEST(TrainBackend, DeviceBackendHostMirrorMatchesTheCpuBackendBitForBit) {
  for (Precision training : {Precision::kBF16, Precision::kFP8}) {
    for (Recompute recompute : {Recompute::kNone, Recompute::kLayers}) {
      SCOPED_TRACE(std::string(precision_name(training)) +
                   (recompute == Recompute::kLayers ? " recompute layers" : ""));
      PrecisionConfig precision;
      precision.training = training;
      precision.generation = training;
      precision.kv_cache = Precision::kFP8;
      model::AdamWConfig adamw;
      adamw.lr = 1e-2;
      auto make = [&](bool mirror) -> std::unique_ptr<Learner> {
        absl::StatusOr<std::unique_ptr<model::Model>> m =
            model::Model::Init(tiny_config(), precision.training_policy(), 21);
        EXPECT_TRUE(m.ok());
        if (!m.ok()) return nullptr;
        std::unique_ptr<TrainBackend> backend;
        if (mirror) {
          absl::StatusOr<std::unique_ptr<TrainBackend>> b =
              make_host_mirror_train_backend(std::move(*m), adamw);
          EXPECT_TRUE(b.ok()) << b.status();
          if (!b.ok()) return nullptr;
          backend = std::move(*b);
        } else {
          backend = make_cpu_train_backend(std::move(*m), adamw);
        }
        return std::make_unique<Learner>("mirror", precision, std::move(backend), nullptr, 0, 0);
      };
      std::unique_ptr<Learner> cpu = make(false), mirror = make(true);
      ASSERT_NE(cpu, nullptr);
      ASSERT_NE(mirror, nullptr);
      // The device backend keeps a description on the host: no master, no working copies.
      EXPECT_TRUE(mirror->policy().description_only());
      EXPECT_TRUE(mirror->policy().params().empty());
      EXPECT_EQ(mirror->policy().weight_bytes(), 0);
      EXPECT_EQ(mirror->policy().num_params(), cpu->policy().num_params());
      EXPECT_EQ(engine::cpu_logprobs(mirror->policy(), {{1, 2, 3}}).status().code(),
                absl::StatusCode::kFailedPrecondition);
      // The device backend recomputes on its own step engine; the CPU backend keeps everything.
      mirror->backend().set_recompute(recompute);
      const std::vector<float> before = params_of(*cpu);
      for (uint64_t step = 0; step < 3; ++step) {
        absl::StatusOr<GrpoResult> a = cpu->grpo_update(grpo_request(50 + step));
        absl::StatusOr<GrpoResult> b = mirror->grpo_update(grpo_request(50 + step));
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        EXPECT_EQ(a->loss, b->loss);
        EXPECT_EQ(a->grad_norm, b->grad_norm);
        EXPECT_EQ(a->mismatch.token_mult_prob_error, b->mismatch.token_mult_prob_error);
      }
      EXPECT_NE(params_of(*cpu), before);
      EXPECT_EQ(params_of(*cpu), master_of(*mirror));
      EXPECT_EQ(master_of(*cpu), master_of(*mirror));
      EXPECT_EQ(mirror->optimizer_steps(), 6);  // 3 updates x 2 minibatches
      // Alone, the learner kept the gradients in the backend's own (device) buffer.
      EXPECT_EQ(mirror->backend().gradient_transfer_bytes(), 0);
      absl::StatusOr<uint64_t> fa = cpu->backend().master_fingerprint();
      absl::StatusOr<uint64_t> fb = mirror->backend().master_fingerprint();
      ASSERT_TRUE(fa.ok() && fb.ok());
      EXPECT_EQ(*fa, *fb);
      absl::StatusOr<Export> ea = cpu->export_for_generation(training, 1, true);
      absl::StatusOr<Export> eb = mirror->export_for_generation(training, 1, true);
      ASSERT_TRUE(ea.ok()) << ea.status();
      ASSERT_TRUE(eb.ok()) << eb.status();
      ASSERT_EQ(ea->weights.tensors.size(), eb->weights.tensors.size());
      for (size_t i = 0; i < ea->weights.tensors.size(); ++i) {
        EXPECT_EQ(ea->weights.tensors[i].name, eb->weights.tensors[i].name);
        EXPECT_EQ(ea->weights.tensors[i].bytes, eb->weights.tensors[i].bytes)
            << ea->weights.tensors[i].name;
      }
      // The BF16 export (rounded on the device, bf16 bits only to the host) equals the CPU
      // model's, whatever the training precision.
      absl::StatusOr<model::WeightSet> ba =
          cpu->backend().export_weights(model::WeightFormat::kBF16, 7);
      absl::StatusOr<model::WeightSet> bb =
          mirror->backend().export_weights(model::WeightFormat::kBF16, 7);
      ASSERT_TRUE(ba.ok()) << ba.status();
      ASSERT_TRUE(bb.ok()) << bb.status();
      EXPECT_EQ(ba->config_json, bb->config_json);
      EXPECT_EQ(ba->version, bb->version);
      ASSERT_EQ(ba->tensors.size(), bb->tensors.size());
      for (size_t i = 0; i < ba->tensors.size(); ++i) {
        EXPECT_EQ(ba->tensors[i].name, bb->tensors[i].name);
        EXPECT_EQ(ba->tensors[i].dtype, bb->tensors[i].dtype);
        EXPECT_EQ(ba->tensors[i].shape, bb->tensors[i].shape);
        EXPECT_EQ(ba->tensors[i].bytes, bb->tensors[i].bytes) << ba->tensors[i].name;
      }
      // A checkpoint of the mirror loads into the CPU backend and continues identically.
      const std::string dir = (std::filesystem::temp_directory_path() /
                               ("fp8rl_mirror_ckpt_" + std::to_string(getpid())))
                                  .string();
      ASSERT_TRUE(save_checkpoint(*mirror, dir, true).ok());
      absl::StatusOr<LoadedCheckpoint> loaded = load_checkpoint(dir);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ASSERT_TRUE(loaded->learner->grpo_update(grpo_request(60)).ok());
      ASSERT_TRUE(mirror->grpo_update(grpo_request(60)).ok());
      EXPECT_EQ(params_of(*loaded->learner), master_of(*mirror));
      EXPECT_EQ(mirror->policy().kv_scales().k, loaded->learner->policy().kv_scales().k);
      std::filesystem::remove_all(dir);
    }
  }
}

// The backend's own gradient buffer (backward / optimizer_step with nullptr): two backwards
// accumulate there in place and one step reads them, bit-identical to the CPU backend's host
// buffer (which its backward also accumulates into in place), on the CPU backend and on the
// device backend's host mirror, with no gradient bytes moved. (The device backend's host-buffer
// path adds each backward's downloaded sum into the host buffer instead, another summation order
// when a step has several backwards; the learner's steps have one.) Mixing in a host buffer while
// gradients are pending is FAILED_PRECONDITION.
TEST(TrainBackend, OwnGradientBufferAccumulatesLikeTheHostBuffer) {
  auto make = [&](bool mirror) -> std::unique_ptr<TrainBackend> {
    auto m = model::Model::Init(tiny_config(), policy_of(Precision::kFP8), 31);
    EXPECT_TRUE(m.ok());
    if (!m.ok()) return nullptr;
    model::AdamWConfig adamw;
    adamw.lr = 1e-2;
    if (!mirror) return make_cpu_train_backend(std::move(*m), adamw);
    auto b = make_host_mirror_train_backend(std::move(*m), adamw);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  };
  std::unique_ptr<TrainBackend> ref = make(false), cpu_own = make(false), mirror_own = make(true),
                                mirror_host = make(true);
  ASSERT_TRUE(ref && cpu_own && mirror_own && mirror_host);
  const GrpoRequest req = grpo_request(70);
  absl::StatusOr<PackedBatch> packed =
      pack_sequences(req.batch, ref->host_model(), "batch", /*require_gen=*/true);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const PackedBatch halves[2] = {packed->slice(0, 2), packed->slice(2, 4)};
  std::vector<float> ref_grads(static_cast<size_t>(ref->num_params()), 0.0f);
  std::vector<float> host_grads = ref_grads;
  for (const PackedBatch& mb : halves) {
    const std::vector<float> dlogp(static_cast<size_t>(mb.size() * mb.length), 0.25f);
    for (TrainBackend* b : {ref.get(), cpu_own.get(), mirror_own.get(), mirror_host.get()}) {
      std::unique_ptr<ForwardState> saved = b->new_forward_state();
      ASSERT_TRUE(b->logprobs(mb, saved.get()).ok());
      float* into = b == ref.get()           ? ref_grads.data()
                    : b == mirror_host.get() ? host_grads.data()
                                             : nullptr;
      ASSERT_TRUE(b->backward(*saved, mb, dlogp, into).ok());
    }
  }
  // Pending gradients in the own buffers: a host buffer is refused.
  for (TrainBackend* b : {cpu_own.get(), mirror_own.get()}) {
    std::unique_ptr<ForwardState> saved = b->new_forward_state();
    ASSERT_TRUE(b->logprobs(halves[0], saved.get()).ok());
    std::vector<float> other(ref_grads.size(), 0.0f);
    const std::vector<float> dlogp(static_cast<size_t>(halves[0].size() * halves[0].length), 1);
    EXPECT_EQ(b->backward(*saved, halves[0], dlogp, other.data()).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(b->optimizer_step(other.data()).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  absl::StatusOr<model::OptimizerStepStats> want = ref->optimizer_step(ref_grads.data());
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_GT(want->grad_norm, 0.0);
  for (TrainBackend* b : {cpu_own.get(), mirror_own.get()}) {
    absl::StatusOr<model::OptimizerStepStats> got = b->optimizer_step(nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->grad_norm, want->grad_norm);
    EXPECT_EQ(*b->master_fingerprint(), *ref->master_fingerprint());
    EXPECT_EQ(b->gradient_transfer_bytes(), 0);
  }
  ASSERT_TRUE(mirror_host->optimizer_step(host_grads.data()).ok());
  // Two backwards down, one step up and back: 4 x 4 bytes per parameter.
  EXPECT_EQ(mirror_host->gradient_transfer_bytes(), 4 * 4 * ref->num_params());
}

// Learner::create over a model already built equals the one that builds it; a model under
// another policy is INVALID_ARGUMENT naming `model`.
TEST(TrainBackend, LearnerOverABuiltModel) {
  const InitRequest init = init_request();
  auto m = model::Model::Init(tiny_config(), init.precision.training_policy(), init.seed);
  ASSERT_TRUE(m.ok());
  absl::StatusOr<std::unique_ptr<Learner>> a = Learner::create(init);
  absl::StatusOr<std::unique_ptr<Learner>> b = Learner::create(init, std::move(*m));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ASSERT_TRUE((*a)->grpo_update(grpo_request(80)).ok());
  ASSERT_TRUE((*b)->grpo_update(grpo_request(80)).ok());
  EXPECT_EQ(params_of(**a), params_of(**b));
  auto other = model::Model::Init(tiny_config(), policy_of(Precision::kBF16), 1);
  ASSERT_TRUE(other.ok());
  absl::StatusOr<std::unique_ptr<Learner>> bad = Learner::create(init, std::move(*other));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "model:")) << bad.status();
}

// Without an sm_90 device (or in a build without CUDA) the cuda placement is FAILED_PRECONDITION
// naming the device, never a policy on the CPU.
TEST(TrainBackend, CudaWithoutADeviceIsAClearFailedPrecondition) {
  if (model::probe_cuda_device().device.has_value()) GTEST_SKIP() << "an sm_90 device is visible";
  InitRequest init = init_request();
  init.placement.device = model::Device::kCuda;
  absl::StatusOr<std::unique_ptr<Learner>> l = Learner::create(init);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(l.status().message(), "device: ")) << l.status();
  EXPECT_GT(l.status().message().size(), std::string_view("device: ").size());
}

TEST(TrainBackend, ParseRecompute) {
  EXPECT_EQ(*parse_recompute("layers", "--recompute"), Recompute::kLayers);
  EXPECT_EQ(*parse_recompute("none", "--recompute"), Recompute::kNone);
  absl::StatusOr<Recompute> bad = parse_recompute("all", "--recompute");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--recompute"), std::string::npos);
}

// The tiny config by hand: vocab 48, hidden 32, intermediate 64, 2 layers, 4 heads of 8, 2 KV
// heads (q_dim 32, kv_dim 16), untied lm_head.
//   parameters: embedding 48x32 = 1536; per layer q 1024, k 512, v 512, o 1024, gate/up/down
//   2048 each (9216 in linears) + 2 norms of 32; final norm 32; lm_head 1536 -> N = 21664.
//   FP8 weights (every linear is one 128x128 block): per layer 2 x (9216 + 7 x 4) = 18488, two
//   layers 36976; embedding + lm_head bf16 2 x 3072 = 6144; norms 4 x 160 = 640 -> 43760.
//   master 4N = 86656, moments 8N = 173312, grads 4N = 86656.
//   activations (the training step's buffers): 100 tokens -> 128 padded rows r, every buffer
//   rounded up to 64 floats. Per layer x, h1, q, o, x2, h2 6 x 32r + k, v 2 x 16r + inv1, inv2
//   2 x r + g, u, act 3 x 64r = 53504; final and backward: x, h_final, dx, dh, dq, dout 6 x 32r +
//   inv_final, lse, logprob, dlogp 4 x r + logits (64 + 16) x 48 + tmp 64r + dk, dv 2 x 16r +
//   dact, dg, du 3 x 64r = 65792 -> 4 x (2 x 53504 + 65792) = 691200. Recomputing: layer 1 keeps
//   only x (32r): 4 x (53504 + 4096 + 65792) = 493568.
//   KV cache, 100 tokens in fp8: 2 x 2 x 16 x 100 = 6400.
TEST(MemoryPlan, HandComputedTinyConfig) {
  MemoryPlanInput in;
  in.config = tiny_config();
  in.policy = PrecisionConfig{}.training_policy();  // fp8 linears, fp8 KV, no bf16 layers
  in.step_tokens = 100;
  in.kv_cache_tokens = 100;
  EXPECT_EQ(model::ParamLayout(in.config).total(), 21664);
  absl::StatusOr<MemoryPlan> plan = plan_training_memory(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->weights, 43760);
  EXPECT_EQ(plan->master, 86656);
  EXPECT_EQ(plan->moments, 173312);
  EXPECT_EQ(plan->grads, 86656);
  EXPECT_EQ(plan->activations, 691200);
  EXPECT_EQ(plan->kv_cache, 6400);
  EXPECT_EQ(plan->total(), 1087984);
  EXPECT_TRUE(check_memory_plan(*plan, 1087984).ok());
  const absl::Status over = check_memory_plan(*plan, 1087983);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("--gpu-memory-fraction"), std::string::npos) << over;
  EXPECT_NE(over.message().find("activations"), std::string::npos) << over;

  in.recompute_layers = true;
  EXPECT_EQ(plan_training_memory(in)->activations, 493568);
  // bf16 linears: 2 B per value: 2 x 2 x 9216 + 6144 + 640; bf16 KV: 2 B per value.
  in.policy =
      PrecisionConfig{.training = Precision::kBF16, .kv_cache = Precision::kBF16}.training_policy();
  EXPECT_EQ(plan_training_memory(in)->weights, 36864 + 6144 + 640);
  EXPECT_EQ(plan_training_memory(in)->kv_cache, 12800);
  in.step_tokens = -1;
  EXPECT_EQ(plan_training_memory(in).status().code(), absl::StatusCode::kInvalidArgument);
}

// The learner checks the plan before its backend allocates: a budget too small for the step is
// RESOURCE_EXHAUSTED naming the flag; a fitting one creates the policy with the plan recorded.
TEST(MemoryPlan, LearnerRefusesAPlanOverBudget) {
  InitRequest init = init_request();
  init.placement.max_step_tokens = 100;
  init.placement.memory_budget_bytes = 1000;
  absl::StatusOr<std::unique_ptr<Learner>> l = Learner::create(init);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kResourceExhausted);
  // The refusal is the plan and the verdict `fp8rl plan` prints (train/memory_plan.h).
  EXPECT_NE(l.status().message().find("memory plan: weights"), std::string::npos) << l.status();
  EXPECT_NE(l.status().message().find(": does not fit: "), std::string::npos) << l.status();
  EXPECT_NE(l.status().message().find("--gpu-memory-fraction"), std::string::npos) << l.status();
  init.placement.memory_budget_bytes = 2 << 20;
  l = Learner::create(init);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ((*l)->memory_plan().input.step_tokens, 100);
  EXPECT_GT((*l)->memory_plan().total(), 0);
  EXPECT_NE((*l)->memory_plan().describe().find("memory plan: weights"), std::string::npos);
}

}  // namespace
}  // namespace fp8rl::train
