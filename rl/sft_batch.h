// The batches of the SFT warm start (docs/design/rl-step.md "The RL step", step 0): SFT step s
// trains on batch_size training examples, each tokenized as the job's prompt tokens (encode_prompt
// in rl/prompt_format.h) + answer + end-of-answer id, with the loss on the answer and that id.
// Stateless like prompt_indices: a step's batch depends only on the split, the seed, the step and
// the prompt format.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "rl/prompt_format.h"
#include "rl/tasks.h"

namespace fp8rl::rl {

// SFT draws its examples with prompt_indices under the seed task.seed + kSftSeedOffset. It is
// keyed on the task seed, not the algorithm seed, so the warm start belongs to the task; the
// offset keeps the SFT order apart from the RL prompt order when a job sets algorithm.seed equal
// to task.seed. 7919 (the 1000th prime) is arbitrary but fixed: changing it changes the warm
// start of every job, resumed ones included.
inline constexpr uint64_t kSftSeedOffset = 7919;

// The id that ends a reference answer: the id of the format's eos_token text when it is one of
// the stop ids (a chat model's end of turn, e.g. <|im_end|> or Llama 3's <|eot_id|>), else the
// first stop id (the byte tokenizer's EOS). FailedPrecondition when the format has no stop ids.
absl::StatusOr<int32_t> answer_end_id(const PromptFormat& format);

// encode_prompt(example) + the tokenizer's encoding of example.answer + answer_end_id; the target
// mask is 1 on the answer and the end id. With byte_prompt_format() that is BOS + prompt bytes +
// answer bytes + EOS (tokenize_example in rl/tasks.h). Errors from encoding pass through.
absl::StatusOr<TokenizedExample> tokenize_with_answer(const Example& example,
                                                      const PromptFormat& format);

// The examples of SFT step `step` (0-based): `batch_size` indices into `train` drawn by
// prompt_indices(train.size(), task_seed + kSftSeedOffset, step, batch_size), each
// tokenize_with_answer. Empty when train or batch_size is empty.
absl::StatusOr<std::vector<TokenizedExample>> sft_batch(std::span<const Example> train,
                                                        uint64_t task_seed, int64_t step,
                                                        int64_t batch_size,
                                                        const PromptFormat& format);

}  // namespace fp8rl::rl
