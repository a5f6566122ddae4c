// BackendGenerator (the scheduler's loop over an InferenceBackend on either device) checked on the
// CPU backend: with continuous batching, stop tokens, cancellation and the row limit, every
// sample's tokens and logprobs equal, bit for bit, those of the sample generated alone (its
// tokens do not depend on what shares its batch); tests/unit/model/generation_golden_test.cc pins
// the bytes themselves.
#include "model/step_generator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "tests/unit/generation_worker/test_util.h"

namespace fp8rl::generation {
namespace {

using model::BackendGenerator;
using testing::export_set;
using testing::prompt_for;
using testing::random_model;

std::shared_ptr<const model::Model> served_model(uint64_t seed, model::KvCacheDtype kv) {
  auto m = random_model(seed);
  auto served = model::Model::FromWeightSet(export_set(*m, model::WeightFormat::kFP8, 1),
                                            testing::policy_of(model::Precision::kFP8, kv));
  EXPECT_TRUE(served.ok()) << served.status();
  return std::shared_ptr<const model::Model>(std::move(*served));
}

BackendGenerator cpu_backend_generator(std::shared_ptr<const model::Model> m, int64_t rows) {
  model::BackendOptions o;
  o.kv_block_tokens = 16;
  auto be = model::make_cpu_backend(std::move(m), o);
  EXPECT_TRUE(be.ok()) << be.status();
  return BackendGenerator(std::move(*be), rows);
}

// The sample generated alone in a fresh generator, with stream `stream`.
model::GenerationResult alone(std::shared_ptr<const model::Model> m,
                              const std::vector<int32_t>& prompt, const model::SamplingParams& p,
                              uint64_t stream) {
  BackendGenerator g = cpu_backend_generator(std::move(m), 2048);
  EXPECT_TRUE(g.add(prompt, p, stream).ok());
  while (!g.idle()) EXPECT_TRUE(g.step().ok());
  auto done = g.take_finished();
  EXPECT_EQ(done.size(), 1u);
  return done.empty() ? model::GenerationResult{} : std::move(done[0]);
}

void expect_same(const model::GenerationResult& got, const model::GenerationResult& want) {
  ASSERT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  EXPECT_EQ(
      std::memcmp(got.logprobs.data(), want.logprobs.data(), want.logprobs.size() * sizeof(float)),
      0);
  EXPECT_EQ(std::memcmp(got.full_logprobs.data(), want.full_logprobs.data(),
                        want.full_logprobs.size() * sizeof(float)),
            0);
  EXPECT_EQ(got.reason, want.reason);
}

TEST(BackendGenerator, MatchesModelGenerateWhileSamplesComeAndGo) {
  for (model::KvCacheDtype kv : {model::KvCacheDtype::kBF16, model::KvCacheDtype::kFP8}) {
    auto m = served_model(71, kv);
    model::SamplingParams p;
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.top_k = 40;
    p.max_new_tokens = 12;
    p.seed = 5;
    model::SamplingParams stop = p;
    stop.stop_tokens = {7, 11, 19, 23, 31};  // likely to end some samples early
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 6; ++i) prompts.push_back(prompt_for(i));
    // The reference: each sample alone (stream i).
    std::vector<model::GenerationResult> want;
    for (int i = 0; i < 6; ++i) want.push_back(alone(m, prompts[i], i % 2 ? stop : p, i));
    // Three at once, three more joining after two steps, a row limit that splits the prefills.
    BackendGenerator gen = cpu_backend_generator(m, 12);
    std::map<int64_t, int> sample_of;
    for (int i = 0; i < 3; ++i) {
      auto id = gen.add(prompts[i], i % 2 ? stop : p, i);
      ASSERT_TRUE(id.ok()) << id.status();
      sample_of[*id] = i;
    }
    std::vector<model::GenerationResult> got(6);
    int steps = 0;
    while (!gen.idle() || steps < 2) {
      ASSERT_TRUE(gen.step().ok());
      if (++steps == 2) {
        for (int i = 3; i < 6; ++i) {
          auto id = gen.add(prompts[i], i % 2 ? stop : p, i);
          ASSERT_TRUE(id.ok());
          sample_of[*id] = i;
        }
      }
      for (auto& r : gen.take_finished()) got[sample_of.at(r.id)] = std::move(r);
    }
    for (int i = 0; i < 6; ++i) {
      SCOPED_TRACE(i);
      expect_same(got[i], want[i]);
    }
    EXPECT_EQ(gen.backend().memory().kv_blocks_used, 0);  // every sequence gave its blocks back
    EXPECT_EQ(gen.kv_cache_bytes(), 0);
  }
}

TEST(BackendGenerator, CancelFreesBlocksAndLeavesOthersUnchanged) {
  auto m = served_model(72, model::KvCacheDtype::kBF16);
  model::SamplingParams p;
  p.temperature = 1.0f;
  p.max_new_tokens = 30;
  p.seed = 9;
  const model::GenerationResult want = alone(m, prompt_for(2), p, 1);

  BackendGenerator gen = cpu_backend_generator(m, 2048);
  auto a = gen.add(prompt_for(1), p, 0);  // 4 + 30 = 34 positions: 3 blocks of 16
  auto b = gen.add(prompt_for(2), p, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(gen.backend().memory().kv_blocks_used, 6);
  EXPECT_GT(gen.kv_cache_bytes(), 0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(gen.step().ok());
  auto partial = gen.cancel(*a);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->tokens.size(), 5u);
  EXPECT_EQ(partial->reason, model::FinishReason::kCancelled);
  EXPECT_EQ(gen.backend().memory().kv_blocks_used, 3);
  EXPECT_EQ(gen.cancel(*a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gen.cancel(99).status().code(), absl::StatusCode::kNotFound);
  while (!gen.idle()) ASSERT_TRUE(gen.step().ok());
  auto done = gen.take_finished();
  ASSERT_EQ(done.size(), 1u);
  expect_same(done[0], want);
}

// The CPU backend as a backend that bounds its rows per step (as the CUDA backend does).
class RowBoundedBackend final : public model::InferenceBackend {
 public:
  explicit RowBoundedBackend(std::unique_ptr<model::InferenceBackend> cpu) : cpu_(std::move(cpu)) {}
  model::Device device() const override { return cpu_->device(); }
  const model::ModelConfig& config() const override { return cpu_->config(); }
  const model::PrecisionPolicy& policy() const override { return cpu_->policy(); }
  absl::Status set_model(std::shared_ptr<const model::Model> m) override {
    return cpu_->set_model(std::move(m));
  }
  absl::StatusOr<std::unique_ptr<model::KvSequence>> new_sequence(int64_t capacity) override {
    return cpu_->new_sequence(capacity);
  }
  absl::Status forward(const std::vector<model::BackendSegment>& s, float* logits) override {
    return cpu_->forward(s, logits);
  }
  absl::Status forward_sample(const std::vector<model::BackendSegment>& s,
                              const std::vector<model::SampleSpec>& spec,
                              std::vector<model::SampledToken>* out) override {
    return cpu_->forward_sample(s, spec, out);
  }
  absl::StatusOr<model::TokenValues> score(const model::TokenBatch& b, float t) override {
    return cpu_->score(b, t);
  }
  model::BackendMemory memory() const override { return cpu_->memory(); }

 private:
  std::unique_ptr<model::InferenceBackend> cpu_;
};

// A prompt longer than the rows of one step runs alone on the CPU backend (its first step is
// that prefill), and is refused at add() by a backend that bounds its rows.
TEST(BackendGenerator, LongPromptRunsAloneOnTheCpuAndIsRefusedByABoundedBackend) {
  auto m = served_model(74, model::KvCacheDtype::kBF16);
  model::SamplingParams p;
  p.max_new_tokens = 5;
  p.seed = 3;
  const std::vector<int32_t> long_prompt = {4, 9, 2, 7, 7, 1, 30, 8, 5};  // 9 rows > 8
  BackendGenerator gen = cpu_backend_generator(m, 8);
  auto a = gen.add(prompt_for(1), p, 0);
  auto b = gen.add(long_prompt, p, 1);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  std::vector<model::GenerationResult> got;
  while (!gen.idle()) {
    ASSERT_TRUE(gen.step().ok());
    for (auto& r : gen.take_finished()) got.push_back(std::move(r));
  }
  ASSERT_EQ(got.size(), 2u);
  expect_same(got[0].id == *a ? got[0] : got[1], alone(m, prompt_for(1), p, 0));
  expect_same(got[0].id == *b ? got[0] : got[1], alone(m, long_prompt, p, 1));

  model::BackendOptions o;
  auto cpu = model::make_cpu_backend(m, o);
  ASSERT_TRUE(cpu.ok());
  BackendGenerator bounded(std::make_unique<RowBoundedBackend>(*std::move(cpu)), 8);
  auto refused = bounded.add(long_prompt, p, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--max-batch-tokens"), std::string::npos);
  EXPECT_TRUE(bounded.idle());
}

TEST(BackendGenerator, BadSamplesAreRefusedAtAdd) {
  auto m = served_model(73, model::KvCacheDtype::kBF16);
  BackendGenerator gen = cpu_backend_generator(m, 8);
  model::SamplingParams p;
  p.max_new_tokens = 4;
  EXPECT_EQ(gen.add({}, p, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gen.add({1, 96}, p, 0).status().code(), absl::StatusCode::kInvalidArgument);
  p.max_new_tokens = 255;  // 2 + 255 > max_position_embeddings 256
  EXPECT_EQ(gen.add({1, 2}, p, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(gen.idle());
  EXPECT_EQ(gen.backend().memory().kv_blocks_used, 0);
}

}  // namespace
}  // namespace fp8rl::generation
