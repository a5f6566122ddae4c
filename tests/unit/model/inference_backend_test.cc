// The CPU InferenceBackend (decoder_step over the engine's CPU ops, dense and MoE models): logits
// and logprobs equal to the training forward's (engine::cpu_logits / cpu_logprobs) for the same
// tokens, the MoE routing record equal to the training forward's routing, block accounting
// against a budget, and the errors of the interface.
#include "model/inference_backend.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cpu/train_ops.h"
#include "model/step_generator.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

constexpr int64_t kVocab = 96;

std::shared_ptr<const Model> tiny_model(Precision linear, KvCacheDtype kv) {
  PrecisionPolicy policy;
  policy.linear = linear;
  policy.kv_cache = kv;
  auto m = Model::Init(testing::make_config(kVocab, 128, 256, 2, 4, 2, false), policy, 7, 0.05f);
  EXPECT_TRUE(m.ok()) << m.status();
  if (kv == KvCacheDtype::kFP8) {
    KvScales s = (*m)->kv_scales();
    for (auto& k : s.k) k = 0.02f;
    for (auto& v : s.v) v = 0.01f;
    EXPECT_TRUE((*m)->set_kv_scales(s).ok());
  }
  return std::shared_ptr<const Model>(*std::move(m));
}

// fp32 linears run OpenBLAS sgemm, whose last bits depend on the rows of the call (one per
// segment here, every row of the sequence in the training forward); bf16 / FP8 linears
// accumulate each row alone and agree bit for bit. Relative to the largest |logit|.
constexpr double kF32RowsRelTol = 1e-5;

// The training forward's logits of the last of `tokens` (Model::logits): what a KV-cache step
// ending at that token gives.
std::vector<float> last_logits(const Model& m, const std::vector<int32_t>& tokens) {
  auto all = engine::cpu_logits(m, tokens);
  EXPECT_TRUE(all.ok()) << all.status();
  return std::vector<float>(all->end() - kVocab, all->end());
}

void expect_logits_equal(const Model& m, const float* got, const std::vector<float>& want,
                         const std::string& what) {
  double scale = 0, diff = 0;
  for (int64_t v = 0; v < kVocab; ++v) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[v])));
    diff = std::max(diff, std::fabs(static_cast<double>(got[v]) - want[v]));
  }
  ASSERT_GT(scale, 0.0) << what;
  if (m.policy().linear == Precision::kF32) {
    EXPECT_LE(diff, kF32RowsRelTol * scale) << what;
  } else {
    EXPECT_EQ(0, std::memcmp(got, want.data(), kVocab * sizeof(float)))
        << what << ": max |d| " << diff;
  }
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.next() % kVocab);
  return t;
}

TEST(KvBlockPool, HandsOutLowestIdsFirstAndRefusesBeyondTheBudget) {
  KvBlockPool pool(5);
  auto a = pool.acquire(2);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1}));
  auto b = pool.acquire(3);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(pool.free(), 0);
  auto c = pool.acquire(1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("1 blocks asked, 0 free"), std::string::npos);
  pool.release(*a, 2);
  EXPECT_EQ(pool.free(), 2);
  auto d = pool.acquire(1);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, (std::vector<int32_t>{0}));
  EXPECT_EQ(pool.used(), 4);
}

TEST(KvBlockPool, UnboundedCountsWithoutIds) {
  KvBlockPool pool(-1);
  auto a = pool.acquire(1000);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->empty());
  EXPECT_EQ(pool.used(), 1000);
  EXPECT_EQ(pool.free(), -1);
  pool.release(*a, 1000);
  EXPECT_EQ(pool.used(), 0);
}

// The CUDA backend hands a sequence's stream to the device and back through state()/set_state().
TEST(Rng, StateRoundTripContinuesTheStream) {
  Rng a(42);
  for (int i = 0; i < 5; ++i) a.next();
  Rng b(7);
  b.set_state(a.state());
  for (int i = 0; i < 10; ++i) ASSERT_EQ(a.next(), b.next());
  EXPECT_NE(Rng(42).state(), a.state());
}

TEST(InferenceBackend, ParsesDeviceNames) {
  EXPECT_EQ(*parse_device("cpu"), Device::kCpu);
  EXPECT_EQ(*parse_device("cuda"), Device::kCuda);
  auto bad = parse_device("tpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'tpu'"), std::string::npos);
  EXPECT_EQ(device_name(Device::kCuda), "cuda");
}

TEST(InferenceBackend, OptionsAreChecked) {
  auto model = tiny_model(Precision::kF32, KvCacheDtype::kF32);
  auto b = make_cpu_backend(model, {.kv_block_tokens = 0});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("kv_block_tokens"), std::string::npos);
  b = make_cpu_backend(model, {.memory_budget_bytes = -1});
  EXPECT_NE(b.status().message().find("memory_budget_bytes"), std::string::npos);
  for (int64_t slots : {0, 3}) {
    b = make_cpu_backend(model, {.weight_slots = slots});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("weight_slots"), std::string::npos);
  }
  EXPECT_EQ(make_cpu_backend(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // The CPU backend serves the host model itself: one copy, whatever weight_slots says.
  b = make_cpu_backend(model, {.weight_slots = 2});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->memory().weight_slots, 1);
}

class CpuBackendTest : public ::testing::TestWithParam<std::pair<Precision, KvCacheDtype>> {};

// Prefill of two prompts in one call, then three decode steps: each segment's logits equal the
// training forward's logits of the sequence so far (bit for bit for bf16 / FP8 linears).
TEST_P(CpuBackendTest, ForwardIsTheTrainingForward) {
  auto model = tiny_model(GetParam().first, GetParam().second);
  auto backend = make_cpu_backend(model, {});
  ASSERT_TRUE(backend.ok()) << backend.status();
  InferenceBackend& be = **backend;
  EXPECT_EQ(be.device(), Device::kCpu);
  std::vector<std::vector<int32_t>> seqs = {random_tokens(9, 1), random_tokens(4, 2)};
  std::vector<std::unique_ptr<KvSequence>> kv;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto s = be.new_sequence(20);
    ASSERT_TRUE(s.ok()) << s.status();
    kv.push_back(*std::move(s));
  }
  std::vector<int32_t> next = {5, 17};
  std::vector<BackendSegment> seg;
  for (size_t i = 0; i < seqs.size(); ++i) {
    seg.push_back({kv[i].get(), seqs[i].data(), static_cast<int64_t>(seqs[i].size()), 0});
  }
  std::vector<float> got(2 * kVocab);
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(be.forward(seg, got.data()).ok());
    for (size_t i = 0; i < seqs.size(); ++i) {
      ASSERT_NO_FATAL_FAILURE(expect_logits_equal(*model, got.data() + i * kVocab,
                                                  last_logits(*model, seqs[i]),
                                                  absl::StrCat("step ", step, " sequence ", i)));
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t pos = seg[i].pos0 + seg[i].n;
      next[i] = static_cast<int32_t>((next[i] * 7 + step) % kVocab);
      seqs[i].push_back(next[i]);
      seg[i] = {kv[i].get(), &next[i], 1, pos};
    }
  }
}

// forward_sample with the generator's streams gives the tokens and logprobs of generate() (the
// generator's loop over this backend), and each token's untruncated logprob is the training
// forward's logprob of it (bit for bit for bf16 / FP8 linears).
TEST_P(CpuBackendTest, ForwardSampleMatchesGenerate) {
  auto model = tiny_model(GetParam().first, GetParam().second);
  SamplingParams params{
      .temperature = 0.9f, .top_p = 0.9f, .top_k = 20, .max_new_tokens = 6, .seed = 11};
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(7, 3), random_tokens(3, 4)};
  auto want = generate(model, prompts, params);
  ASSERT_TRUE(want.ok());
  auto backend = make_cpu_backend(model, {.kv_block_tokens = 4});
  ASSERT_TRUE(backend.ok());
  InferenceBackend& be = **backend;
  std::vector<std::unique_ptr<KvSequence>> kv;
  std::vector<Rng> rng;
  std::vector<BackendSegment> seg;
  std::vector<SampleSpec> spec;
  for (size_t i = 0; i < prompts.size(); ++i) {
    kv.push_back(*be.new_sequence(static_cast<int64_t>(prompts[i].size()) + 6));
    rng.emplace_back(derive_seed(params.seed, i));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    seg.push_back({kv[i].get(), prompts[i].data(), static_cast<int64_t>(prompts[i].size()), 0});
    spec.push_back({&params, &rng[i]});
  }
  EXPECT_EQ(be.memory().kv_blocks_used, 4 + 3);  // ceil(13/4) + ceil(9/4)
  std::vector<std::vector<int32_t>> tokens(prompts.size());
  std::vector<std::vector<float>> lps(prompts.size()), full(prompts.size());
  std::vector<SampledToken> out;
  for (int step = 0; step < 6; ++step) {
    ASSERT_TRUE(be.forward_sample(seg, spec, &out).ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      tokens[i].push_back(out[i].token);
      lps[i].push_back(out[i].logprob);
      full[i].push_back(out[i].full_logprob);
      seg[i] = {kv[i].get(), &tokens[i].back(), 1, seg[i].pos0 + seg[i].n};
    }
  }
  TokenBatch batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tokens[i], (*want)[i].tokens) << "prompt " << i;
    EXPECT_EQ(lps[i], (*want)[i].logprobs) << "prompt " << i;
    batch.push_back(prompts[i]);
    batch.back().insert(batch.back().end(), tokens[i].begin(), tokens[i].end() - 1);
  }
  auto learner = engine::cpu_logprobs(*model, batch, {.temperature = params.temperature});
  ASSERT_TRUE(learner.ok()) << learner.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (size_t j = 0; j + 1 < full[i].size(); ++j) {
      const float lp = (*learner)[i][prompts[i].size() - 1 + j];
      if (model->policy().linear == Precision::kF32) {
        EXPECT_NEAR(full[i][j], lp, 1e-5) << "prompt " << i << " token " << j;
      } else {
        EXPECT_EQ(std::bit_cast<uint32_t>(full[i][j]), std::bit_cast<uint32_t>(lp))
            << "prompt " << i << " token " << j << ": " << full[i][j] << " vs " << lp;
      }
    }
  }
}

// score() is the training forward's logprobs.
TEST_P(CpuBackendTest, ScoreIsTheTrainingForward) {
  auto model = tiny_model(GetParam().first, GetParam().second);
  auto backend = make_cpu_backend(model, {});
  ASSERT_TRUE(backend.ok());
  const TokenBatch batch = {random_tokens(12, 5), random_tokens(5, 6)};
  auto got = (*backend)->score(batch, 0.7f);
  auto want = engine::cpu_logprobs(*model, batch, {.temperature = 0.7f});
  ASSERT_TRUE(got.ok() && want.ok());
  EXPECT_EQ(*got, *want);
}

INSTANTIATE_TEST_SUITE_P(Policies, CpuBackendTest,
                         ::testing::Values(std::pair{Precision::kF32, KvCacheDtype::kF32},
                                           std::pair{Precision::kF32, KvCacheDtype::kFP8},
                                           std::pair{Precision::kBF16, KvCacheDtype::kBF16},
                                           std::pair{Precision::kBF16, KvCacheDtype::kF32},
                                           std::pair{Precision::kFP8, KvCacheDtype::kFP8},
                                           std::pair{Precision::kFP8, KvCacheDtype::kF32}),
                         [](const auto& info) {
                           return std::string(precision_name(info.param.first)) + "_kv_" +
                                  std::string(precision_name(info.param.second));
                         });

// The CPU backend keeps KV in a paged pool that grows as blocks are handed out: blocks a
// finished sequence frees are reused by the next one (not contiguous, not in order) while the
// pool grows under a live sequence, and every logit still equals the training forward's.
TEST(CpuBackend, PagedPoolReusesFreedBlocksAndGrowsUnderLiveSequences) {
  auto model = tiny_model(Precision::kFP8, KvCacheDtype::kFP8);
  auto backend = make_cpu_backend(model, {.kv_block_tokens = 4});
  ASSERT_TRUE(backend.ok());
  InferenceBackend& be = **backend;
  std::vector<float> got(2 * kVocab);
  // seqs[i]: every token segment i's sequence has been fed so far.
  auto check = [&](const std::vector<BackendSegment>& seg,
                   const std::vector<std::vector<int32_t>>& seqs) {
    ASSERT_TRUE(be.forward(seg, got.data()).ok());
    for (size_t i = 0; i < seg.size(); ++i) {
      ASSERT_NO_FATAL_FAILURE(expect_logits_equal(*model, got.data() + i * kVocab,
                                                  last_logits(*model, seqs[i]),
                                                  absl::StrCat("segment ", i)));
    }
  };
  std::vector<int32_t> pa = random_tokens(10, 21), pb = random_tokens(6, 22),
                       pc = random_tokens(23, 23);
  auto a = be.new_sequence(12);  // 3 blocks
  auto b = be.new_sequence(9);   // 3 blocks
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_NO_FATAL_FAILURE(
      check({{a->get(), pa.data(), 10, 0}, {b->get(), pb.data(), 6, 0}}, {pa, pb}));
  a->reset();  // frees a's 3 blocks; c takes them and 4 new ones (the pool grows under b)
  auto c = be.new_sequence(28);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(be.memory().kv_blocks_used, 3 + 7);
  std::vector<int32_t> next = {3, 9};
  std::vector<int32_t> sb = pb, sc = pc;
  sb.push_back(next[0]);
  ASSERT_NO_FATAL_FAILURE(
      check({{b->get(), &next[0], 1, 6}, {c->get(), pc.data(), 23, 0}}, {sb, sc}));
  for (int64_t step = 0; step < 2; ++step) {
    next = {static_cast<int32_t>(step + 40), static_cast<int32_t>(step + 50)};
    sb.push_back(next[0]);
    sc.push_back(next[1]);
    ASSERT_NO_FATAL_FAILURE(
        check({{b->get(), &next[0], 1, 7 + step}, {c->get(), &next[1], 1, 23 + step}}, {sb, sc}));
  }
}

// Mixture-of-experts models run decoder_step with the CPU ops' MoE op: the logits of the training
// forward, and a routing record (BackendSegment::routing) equal to the experts the training
// forward ran each token through; a dense model appends nothing.
TEST(CpuBackend, MoeModelIsTheTrainingForwardAndRecordsItsRouting) {
  PrecisionPolicy policy;
  policy.linear = Precision::kFP8;
  policy.kv_cache = KvCacheDtype::kFP8;
  auto made = Model::Init(
      testing::make_qwen3_moe_config(kVocab, 128, 256, 2, 4, 2, 32, false, 4, 2, 64, true), policy,
      13, 0.05f);
  ASSERT_TRUE(made.ok()) << made.status();
  testing::randomize(**made, 3, 0.1);
  std::shared_ptr<const Model> model(*std::move(made));
  ASSERT_GT(model->config().num_sparse_layers(), 0);
  auto backend = make_cpu_backend(model, {.kv_block_tokens = 4});
  ASSERT_TRUE(backend.ok());
  std::vector<int32_t> seq = random_tokens(11, 31);
  auto kv = (*backend)->new_sequence(14);
  ASSERT_TRUE(kv.ok());
  std::vector<float> got(kVocab);
  std::vector<int32_t> routing;
  const std::vector<int32_t> decode = {5, 77, 12};
  for (int step = 0; step < 3; ++step) {
    const int32_t* t = step == 0 ? seq.data() : &decode[step - 1];
    const int64_t n = step == 0 ? 11 : 1, pos0 = step == 0 ? 0 : 10 + step;
    if (step > 0) seq.push_back(decode[step - 1]);
    ASSERT_TRUE((*backend)->forward({{kv->get(), t, n, pos0, &routing}}, got.data()).ok());
    ASSERT_NO_FATAL_FAILURE(expect_logits_equal(*model, got.data(), last_logits(*model, seq),
                                                absl::StrCat("step ", step)));
  }
  engine::CpuTrainStep ctx;
  ASSERT_TRUE(ctx.forward(*model, {seq}, {}).ok());
  ASSERT_EQ(static_cast<int64_t>(routing.size()), 13 * model->routing_width());
  EXPECT_EQ(routing, ctx.routing.used[0]);
  std::set<int32_t> experts(routing.begin(), routing.end());
  EXPECT_GT(experts.size(), 1u);  // the router did choose

  auto dense = tiny_model(Precision::kFP8, KvCacheDtype::kF32);
  auto dense_be = make_cpu_backend(dense, {});
  auto dkv = (*dense_be)->new_sequence(4);
  std::vector<int32_t> none;
  ASSERT_TRUE((*dense_be)->forward({{dkv->get(), decode.data(), 3, 0, &none}}, got.data()).ok());
  EXPECT_TRUE(none.empty());
}

TEST(CpuBackend, BudgetBoundsBlocksAndFreesThemWithTheSequence) {
  auto model = tiny_model(Precision::kF32, KvCacheDtype::kF32);
  const int64_t block = kv_block_bytes(model->config(), KvCacheDtype::kF32, 8);
  EXPECT_EQ(block, 2 * 2 * 8 * 64 * 4);  // K+V, 2 layers, 8 positions, kv_dim 64, fp32
  auto backend =
      make_cpu_backend(model, {.memory_budget_bytes = 5 * block + 7, .kv_block_tokens = 8});
  ASSERT_TRUE(backend.ok());
  InferenceBackend& be = **backend;
  EXPECT_EQ(be.memory().kv_blocks_total, 5);
  EXPECT_EQ(be.blocks_for(17), 3);
  auto a = be.new_sequence(17);  // 3 blocks
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->blocks(), 3);
  EXPECT_EQ(be.memory().kv_blocks_free(), 2);
  auto b = be.new_sequence(24);  // 3 blocks: refused
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(be.memory().kv_blocks_free(), 2);
  // set_model while a sequence holds blocks is refused.
  EXPECT_EQ(be.set_model(model).code(), absl::StatusCode::kFailedPrecondition);
  a->reset();
  EXPECT_EQ(be.memory().kv_blocks_free(), 5);
  EXPECT_TRUE(be.new_sequence(24).ok());  // freed at once when the handle goes
  EXPECT_TRUE(be.set_model(model).ok());
}

TEST(CpuBackend, BadInputGetsClearErrors) {
  auto model = tiny_model(Precision::kF32, KvCacheDtype::kF32);
  auto backend = make_cpu_backend(model, {});
  ASSERT_TRUE(backend.ok());
  InferenceBackend& be = **backend;
  EXPECT_EQ(be.new_sequence(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be.new_sequence(257).status().code(), absl::StatusCode::kInvalidArgument);
  auto other = make_cpu_backend(model, {});
  auto foreign = (*other)->new_sequence(4);
  ASSERT_TRUE(foreign.ok());
  const int32_t tok = 1;
  std::vector<float> logits(kVocab);
  auto s = be.forward({{foreign->get(), &tok, 1, 0}}, logits.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("segment 0"), std::string::npos);
  auto kv = be.new_sequence(2);
  s = be.forward({{kv->get(), &tok, 1, 2}}, logits.data());  // position 2 of a 2-slot cache
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::vector<SampledToken> out;
  s = be.forward_sample({{kv->get(), &tok, 1, 0}}, {}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "forward_sample: 0 sample specs for 1 segments");
  SamplingParams params;
  s = be.forward_sample({{kv->get(), &tok, 1, 0}}, {{&params, nullptr}}, &out);
  EXPECT_EQ(s.message(), "forward_sample: spec 0 lacks params or rng");
  auto bigger =
      Model::Init(testing::make_config(kVocab + 1, 128, 256, 2, 4, 2, false), model->policy(), 1);
  EXPECT_EQ(be.set_model(std::shared_ptr<const Model>(*std::move(bigger))).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaBackend, WithoutADeviceSaysWhy) {
  if (cuda_backend_available()) GTEST_SKIP() << "a CUDA device is present";
  auto b = make_cuda_backend(tiny_model(Precision::kF32, KvCacheDtype::kF32),
                             {.memory_budget_bytes = 1 << 30});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(cuda_backend_unavailable_reason().empty());
}

}  // namespace
}  // namespace fp8rl::model
