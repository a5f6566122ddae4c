// SFT warm-start batches (see sft_batch.h).
#include "rl/sft_batch.h"

#include "rl/tokenizer.h"

namespace fp8rl::rl {

std::vector<TokenizedExample> sft_batch(std::span<const Example> train, uint64_t task_seed,
                                        int64_t step, int64_t batch_size) {
  const ByteTokenizer tokenizer;
  std::vector<TokenizedExample> batch;
  for (int64_t index : prompt_indices(static_cast<int64_t>(train.size()),
                                      task_seed + kSftSeedOffset, step, batch_size)) {
    batch.push_back(
        tokenize_example(train[static_cast<size_t>(index)], tokenizer, /*with_answer=*/true));
  }
  return batch;
}

}  // namespace fp8rl::rl
