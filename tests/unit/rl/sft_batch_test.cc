// Tests of rl/sft_batch.h: each SFT sequence is BOS + prompt + answer + EOS with the prompt
// length where the answer starts, the examples are those of prompt_indices under the offset task
// seed, and a step's batch is stable (a resumed job repeats it) while steps differ.
#include "rl/sft_batch.h"

#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rl/tokenizer.h"

namespace fp8rl::rl {
namespace {

std::vector<Example> random_split(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> operand(0, 999);
  std::vector<Example> out;
  for (int i = 0; i < n; ++i) {
    const int a = operand(rng), b = operand(rng);
    out.push_back({absl::StrCat(a, "+", b, "="), absl::StrCat(a + b)});
  }
  return out;
}

TEST(SftBatch, TokenizesTheOffsetSeedsExamplesWithAnswers) {
  const std::vector<Example> train = random_split(300, 5);
  const uint64_t task_seed = 1234;
  const ByteTokenizer tokenizer;
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<TokenizedExample> batch =
        sft_batch(train, task_seed, step, 8, byte_prompt_format()).value();
    const std::vector<int64_t> indices =
        prompt_indices(static_cast<int64_t>(train.size()), task_seed + kSftSeedOffset, step, 8);
    ASSERT_EQ(batch.size(), 8u);
    for (size_t i = 0; i < batch.size(); ++i) {
      const Example& ex = train[static_cast<size_t>(indices[i])];
      std::vector<int32_t> want = {kBosId};
      for (char c : ex.prompt) want.push_back(static_cast<unsigned char>(c));
      const int64_t prompt_length = static_cast<int64_t>(want.size());
      for (char c : ex.answer) want.push_back(static_cast<unsigned char>(c));
      want.push_back(kEosId);
      EXPECT_EQ(batch[i].tokens, want) << step << " " << i;
      EXPECT_EQ(batch[i].prompt_length, prompt_length);
      EXPECT_EQ(tokenizer.decode(batch[i].tokens), ex.prompt + ex.answer);
    }
  }
}

TEST(SftBatch, StableForAStepDifferentAcrossStepsAndFromTheUnoffsetSeed) {
  const std::vector<Example> train = random_split(500, 9);
  auto tokens = [](const std::vector<TokenizedExample>& batch) {
    std::vector<std::vector<int32_t>> out;
    for (const TokenizedExample& e : batch) out.push_back(e.tokens);
    return out;
  };
  EXPECT_EQ(tokens(sft_batch(train, 77, 4, 16, byte_prompt_format()).value()),
            tokens(sft_batch(train, 77, 4, 16, byte_prompt_format()).value()));
  EXPECT_NE(tokens(sft_batch(train, 77, 4, 16, byte_prompt_format()).value()),
            tokens(sft_batch(train, 77, 5, 16, byte_prompt_format()).value()));
  // A job whose algorithm seed equals its task seed does not train SFT on its RL prompts.
  EXPECT_NE(prompt_indices(500, 77 + kSftSeedOffset, 0, 16), prompt_indices(500, 77, 0, 16));
  EXPECT_TRUE(sft_batch({}, 77, 0, 16, byte_prompt_format()).value().empty());
  EXPECT_TRUE(sft_batch(train, 77, 0, 0, byte_prompt_format()).value().empty());
}

}  // namespace
}  // namespace fp8rl::rl
