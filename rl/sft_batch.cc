// SFT warm-start batches (see sft_batch.h).
#include "rl/sft_batch.h"

#include <algorithm>

#include "absl/status/status.h"

namespace fp8rl::rl {

absl::StatusOr<int32_t> answer_end_id(const PromptFormat& format) {
  if (format.stop_ids.empty()) return absl::FailedPreconditionError("prompt format: no stop ids");
  if (format.eos_token.has_value() && format.tokenizer != nullptr) {
    absl::StatusOr<std::vector<int32_t>> ids = format.tokenizer->encode(*format.eos_token);
    if (ids.ok() && ids->size() == 1 &&
        std::find(format.stop_ids.begin(), format.stop_ids.end(), ids->front()) !=
            format.stop_ids.end()) {
      return ids->front();
    }
  }
  return format.stop_ids.front();
}

absl::StatusOr<TokenizedExample> tokenize_with_answer(const Example& example,
                                                      const PromptFormat& format) {
  absl::StatusOr<int32_t> end = answer_end_id(format);
  if (!end.ok()) return end.status();
  absl::StatusOr<std::vector<int32_t>> prompt = encode_prompt(example, format);
  if (!prompt.ok()) return prompt.status();
  absl::StatusOr<std::vector<int32_t>> answer = format.tokenizer->encode(example.answer);
  if (!answer.ok()) return answer.status();
  TokenizedExample out;
  out.tokens = *std::move(prompt);
  out.prompt_length = static_cast<int64_t>(out.tokens.size());
  out.target_mask.assign(out.tokens.size(), 0);
  out.tokens.insert(out.tokens.end(), answer->begin(), answer->end());
  out.tokens.push_back(*end);
  out.target_mask.resize(out.tokens.size(), 1);
  return out;
}

absl::StatusOr<std::vector<TokenizedExample>> sft_batch(std::span<const Example> train,
                                                        uint64_t task_seed, int64_t step,
                                                        int64_t batch_size,
                                                        const PromptFormat& format) {
  std::vector<TokenizedExample> batch;
  for (int64_t index : prompt_indices(static_cast<int64_t>(train.size()),
                                      task_seed + kSftSeedOffset, step, batch_size)) {
    absl::StatusOr<TokenizedExample> example =
        tokenize_with_answer(train[static_cast<size_t>(index)], format);
    if (!example.ok()) return example.status();
    batch.push_back(*std::move(example));
  }
  return batch;
}

}  // namespace fp8rl::rl
