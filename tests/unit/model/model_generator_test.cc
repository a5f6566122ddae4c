// BackendGenerator::cancel on the CPU backend: a cancelled sequence (decoding or still waiting for
// its prefill) leaves the batch and frees its KV blocks, the other sequences' tokens and logprobs
// are bit-identical to a run without it (bf16/fp8; fp32 to rounding), and cancelling an unknown,
// finished or already-cancelled id is a clear error.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "model/model.h"
#include "model/step_generator.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

constexpr int64_t kVocab = 96;

std::shared_ptr<const Model> make_model(const PrecisionPolicy& policy) {
  // hidden 160 / intermediate 288: full and partial 128-blocks in every FP8 GEMM.
  auto m = Model::Init(testing::make_config(kVocab, 160, 288, 2, 4, 2, false), policy, 31);
  EXPECT_TRUE(m.ok()) << m.status();
  testing::randomize(**m, 31, 0.1);
  return std::shared_ptr<const Model>(std::move(*m));
}

// Prompt lengths chosen against max_step_tokens 16: the first step prefills prompts 0-2
// (5 + 4 + 6 rows) and leaves 3-5 waiting.
std::vector<std::vector<int32_t>> prompts() {
  Rng rng(8);
  std::vector<std::vector<int32_t>> out;
  for (int64_t len : {5, 4, 6, 9, 7, 3}) out.push_back(testing::random_tokens(rng, len, kVocab));
  return out;
}

const SamplingParams kParams{.temperature = 1.0f, .max_new_tokens = 12, .seed = 4};

// The generation loop over the CPU backend (no KV budget, blocks of 16 positions).
BackendGenerator cpu_generator(std::shared_ptr<const Model> model, int64_t max_step_tokens = 2048) {
  auto backend = make_cpu_backend(std::move(model), {});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return BackendGenerator(*std::move(backend), max_step_tokens);
}

// Runs `gen` to the end and returns the results by id.
std::map<int64_t, GenerationResult> drain(BackendGenerator& gen) {
  std::map<int64_t, GenerationResult> out;
  while (!gen.idle()) {
    EXPECT_TRUE(gen.step().ok());
    for (GenerationResult& r : gen.take_finished()) out[r.id] = std::move(r);
  }
  for (GenerationResult& r : gen.take_finished()) out[r.id] = std::move(r);
  return out;
}

// The KV blocks' bytes a lone sequence of this prompt reserves.
int64_t cache_bytes_of(std::shared_ptr<const Model> model, const std::vector<int32_t>& prompt) {
  BackendGenerator g = cpu_generator(std::move(model));
  EXPECT_TRUE(g.add(prompt, kParams, 0).ok());
  return g.kv_cache_bytes();
}

struct Mode {
  PrecisionPolicy policy;
  // bf16/fp8 linears accumulate row by row independently of the batch, so logprobs are
  // bit-identical; fp32 runs OpenBLAS sgemm, whose last bit depends on the rows in the batch
  // (tokens still match, logprobs to rounding).
  bool bit_exact = true;
};
// fp32 logprobs of the same sample in batches of different shape.
constexpr double kF32BatchShapeTol = 1e-5;

class GeneratorCancelTest : public ::testing::TestWithParam<Mode> {};

TEST_P(GeneratorCancelTest, OthersAreBitIdenticalToARunWithoutTheCancelled) {
  const std::shared_ptr<const Model> model = make_model(GetParam().policy);
  const auto ps = prompts();
  const std::vector<size_t> kept = {0, 2, 3, 5};  // 1 is cancelled decoding, 4 waiting

  // Reference: only the kept prompts, on their own streams, one prefill for all.
  BackendGenerator ref = cpu_generator(model);
  std::map<size_t, int64_t> ref_id;
  for (size_t i : kept) ref_id[i] = *ref.add(ps[i], kParams, i);
  std::map<int64_t, GenerationResult> expected = drain(ref);

  BackendGenerator gen = cpu_generator(model, /*max_step_tokens=*/16);
  std::vector<int64_t> id;
  for (size_t i = 0; i < ps.size(); ++i) {
    auto added = gen.add(ps[i], kParams, i);
    ASSERT_TRUE(added.ok()) << added.status();
    id.push_back(*added);
  }
  ASSERT_TRUE(gen.step().ok());
  ASSERT_TRUE(gen.take_finished().empty());
  const int64_t bytes_before = gen.kv_cache_bytes();
  // Prompt 1 is prefilled and decoding (one token so far), prompt 4 still waits for its prefill.
  absl::StatusOr<GenerationResult> decoding = gen.cancel(id[1]);
  ASSERT_TRUE(decoding.ok()) << decoding.status();
  EXPECT_EQ(decoding->id, id[1]);
  EXPECT_EQ(decoding->reason, FinishReason::kCancelled);
  EXPECT_EQ(decoding->prompt, ps[1]);
  EXPECT_EQ(decoding->tokens.size(), 1u);
  EXPECT_EQ(decoding->logprobs.size(), 1u);
  absl::StatusOr<GenerationResult> waiting = gen.cancel(id[4]);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_TRUE(waiting->tokens.empty());
  EXPECT_EQ(gen.num_active(), 4);
  EXPECT_EQ(bytes_before - gen.kv_cache_bytes(),
            cache_bytes_of(model, ps[1]) + cache_bytes_of(model, ps[4]));
  EXPECT_GT(gen.kv_cache_bytes(), 0);
  // Twice is an error, and so are ids never handed out.
  EXPECT_EQ(gen.cancel(id[1]).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gen.cancel(id.back() + 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gen.cancel(-1).status().code(), absl::StatusCode::kNotFound);

  std::map<int64_t, GenerationResult> got = drain(gen);
  ASSERT_EQ(got.size(), kept.size());
  EXPECT_FALSE(got.count(id[1]));
  EXPECT_FALSE(got.count(id[4]));
  for (size_t i : kept) {
    ASSERT_TRUE(got.count(id[i])) << "prompt " << i;
    const GenerationResult& a = got[id[i]];
    const GenerationResult& e = expected[ref_id[i]];
    ASSERT_FALSE(a.tokens.empty());
    EXPECT_EQ(a.tokens, e.tokens) << "prompt " << i;
    if (GetParam().bit_exact) {
      EXPECT_EQ(a.logprobs, e.logprobs) << "prompt " << i;
    } else {
      ASSERT_EQ(a.logprobs.size(), e.logprobs.size());
      EXPECT_LE(testing::max_abs_diff(a.logprobs.data(), e.logprobs.data(), a.logprobs.size()),
                kF32BatchShapeTol)
          << "prompt " << i;
    }
    EXPECT_EQ(a.reason, e.reason);
    EXPECT_EQ(a.prompt, ps[i]);
  }
  EXPECT_EQ(gen.kv_cache_bytes(), 0);
  // A finished sequence cannot be cancelled any more.
  EXPECT_EQ(gen.cancel(id[0]).status().code(), absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, GeneratorCancelTest,
    ::testing::Values(Mode{.policy = {}, .bit_exact = false},
                      Mode{.policy = {.linear = Precision::kBF16, .kv_cache = KvCacheDtype::kBF16}},
                      Mode{.policy = {.linear = Precision::kFP8, .kv_cache = KvCacheDtype::kFP8}},
                      Mode{.policy = {.linear = Precision::kFP8, .kv_cache = KvCacheDtype::kF32}}),
    [](const auto& info) {
      return std::string(precision_name(info.param.policy.linear)) + "_kv_" +
             std::string(kv_cache_dtype_name(info.param.policy.kv_cache));
    });

TEST(GeneratorCancel, CancellingEverySequenceLeavesAnIdleReusableGenerator) {
  const std::shared_ptr<const Model> model = make_model({});
  const auto ps = prompts();
  BackendGenerator gen = cpu_generator(model);
  const int64_t a = *gen.add(ps[0], kParams, 0);
  const int64_t b = *gen.add(ps[1], kParams, 1);
  ASSERT_TRUE(gen.step().ok());
  ASSERT_TRUE(gen.cancel(b).ok());
  ASSERT_TRUE(gen.cancel(a).ok());
  EXPECT_TRUE(gen.idle());
  EXPECT_EQ(gen.kv_cache_bytes(), 0);
  ASSERT_TRUE(gen.step().ok());  // no-op
  EXPECT_TRUE(gen.take_finished().empty());
  // The generator keeps serving: a new sequence on stream 0 gives stream 0's sample.
  auto alone = generate(model, {ps[0]}, kParams);
  ASSERT_TRUE(alone.ok());
  const int64_t c = *gen.add(ps[0], kParams, 0);
  EXPECT_GT(c, b);
  std::map<int64_t, GenerationResult> got = drain(gen);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[c].tokens, (*alone)[0].tokens);
  EXPECT_EQ(got[c].logprobs, (*alone)[0].logprobs);
  // A zero-token sequence finishes in add(): nothing to cancel.
  SamplingParams none = kParams;
  none.max_new_tokens = 0;
  const int64_t d = *gen.add(ps[2], none, 2);
  EXPECT_EQ(gen.cancel(d).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(gen.take_finished().size(), 1u);
}

}  // namespace
}  // namespace fp8rl::model
