// The batches of the SFT warm start (docs/design.md "The RL step", step 0): SFT step s trains on
// batch_size training examples, each tokenized as BOS + prompt + answer + EOS with the loss on
// the answer and the EOS (tokenize_example in rl/tasks.h). Stateless like prompt_indices: a
// step's batch depends only on the split, the seed and the step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "rl/tasks.h"

namespace fp8rl::rl {

// SFT draws its examples with prompt_indices under the seed task.seed + kSftSeedOffset. It is
// keyed on the task seed, not the algorithm seed, so the warm start belongs to the task; the
// offset keeps the SFT order apart from the RL prompt order when a job sets algorithm.seed equal
// to task.seed. 7919 (the 1000th prime) is arbitrary but fixed: changing it changes the warm
// start of every job, resumed ones included.
inline constexpr uint64_t kSftSeedOffset = 7919;

// The examples of SFT step `step` (0-based): `batch_size` indices into `train` drawn by
// prompt_indices(train.size(), task_seed + kSftSeedOffset, step, batch_size), tokenized with
// their answers. Empty when train or batch_size is empty.
std::vector<TokenizedExample> sft_batch(std::span<const Example> train, uint64_t task_seed,
                                        int64_t step, int64_t batch_size);

}  // namespace fp8rl::rl
