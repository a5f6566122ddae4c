// Verifiable tasks: deterministic train/validation splits generated from a seed (or read from
// JSONL), prompt formatting, answer extraction and the exact-match reward the coordinator uses
// to score each sample.
//
// Built-in tasks (prompt -> answer):
//   addition        "123+45="      -> "168"   operands uniform in [0, 10^digits)
//   multiplication  "12*34="       -> "408"   operands uniform in [0, 10^digits)
//   arithmetic      "(3+4)*2-5="   -> "9"     `terms` operands in [0, max_operand], random
//                                             binary tree of + - *, minimal parentheses
//                                             (integer result, may be negative)
//   jsonl           one {"prompt": "...", "answer": "..."} object per line (answer may be a JSON
//                   string or integer; other keys are ignored; blank lines skipped). A bad line
//                   is an error naming "<path>:<line>".
//   math            GSM8K / MATH-style JSONL word problems (rl/math_task.h): configurable
//                   fields, reference answers after "####", in \boxed{} or plain, answers
//                   extracted and compared in canonical numeric form (rl/math_answer.h).
// Splits: generated tasks: the validation split holds val_size distinct prompts; training prompts
// are drawn (with repetition) from the problems NOT in the validation split, so validation is held
// out. File tasks (jsonl, math): without val_path, a seeded shuffle of the train file whose first
// val_size examples are held out; with val_path, that file capped at val_size. The training split
// is capped at train_size. The same TaskConfig always gives the same splits.
//
// Answer extraction from a completion (the decoded response text, without the prompt):
//   number (built-ins, jsonl match: number): skip leading whitespace, then an optional '-' and
//     the longest run of digits; whatever follows is ignored ("  42\nfoo" -> "42"). No digits:
//     no answer.
//   line (jsonl default): skip leading whitespace, take up to the first '\n', trim trailing
//     whitespace. Empty: no answer.
//   math: the first of task.params.extraction (boxed, hash, last_number) that finds an answer,
//     in canonical form (normalize_math_answer); the reference answer is stored canonical.
// Reward: 1 when the extracted answer equals the example's answer as a string (so "042" is not
// "42" for number), else format_reward when an answer could be extracted, else 0. Always in
// [0, 1]. For math, restricting extraction (e.g. to [boxed]) makes format_reward a reward for
// answering in that format.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "rl/job_config.h"
#include "rl/math_answer.h"
#include "rl/tokenizer.h"

namespace fp8rl::rl {

struct Example {
  // The prompt in the plain format (no chat template): the model input text after BOS.
  std::string prompt;
  std::string answer;
  // The prompt as chat messages, for models with a chat template (rl/prompt_format.h): an
  // optional system message and the user message; an empty user means `prompt`.
  std::string system = {};
  std::string user = {};
  bool operator==(const Example&) const = default;
};

enum class AnswerMatch { kNumber, kLine, kMath };

// kMath here uses the default extractor order; Task::extract uses the task's.
std::optional<std::string> extract_answer(std::string_view completion, AnswerMatch match);

class Task {
 public:
  // `math_extractors` is used (and must be non-empty) when match is kMath.
  Task(std::string name, std::vector<Example> train, std::vector<Example> validation,
       AnswerMatch match, double format_reward, std::vector<MathExtractor> math_extractors = {});

  const std::string& name() const { return name_; }
  const std::vector<Example>& train() const { return train_; }
  const std::vector<Example>& validation() const { return validation_; }
  AnswerMatch match() const { return match_; }

  // The completion's answer as compared with Example::answer (kMath: canonical form).
  std::optional<std::string> extract(std::string_view completion) const;
  // Reward in [0, 1] of a completion for `example` (see the header comment).
  double reward(const Example& example, std::string_view completion) const;
  // 1 if the completion's answer is exactly right (what validation accuracy counts).
  bool correct(const Example& example, std::string_view completion) const;

 private:
  std::string name_;
  std::vector<Example> train_;
  std::vector<Example> validation_;
  AnswerMatch match_;
  double format_reward_;
  std::vector<MathExtractor> math_extractors_;
};

// Model input for an example. tokens = BOS, prompt bytes, then (with_answer) answer bytes and EOS.
// target_mask[t] = 1 where tokens[t] is part of the answer or the final EOS, i.e. the positions
// whose logprob (predicted from position t - 1) the SFT loss trains; prompt_length is the number
// of tokens before the answer (BOS + prompt), where generation starts.
struct TokenizedExample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> target_mask;
  int64_t prompt_length = 0;
};
TokenizedExample tokenize_example(const Example& example, const ByteTokenizer& tokenizer,
                                  bool with_answer);

// Checks task.name, task.params and the sizes against the task's problem space; errors carry the
// field path ("task.params.digits: must be in [1, 9]"). Does not read JSONL files.
absl::Status validate_task_config(const TaskConfig& config);

// Reads a JSON-lines file of examples: blank lines are skipped, every other line must be a JSON
// object, which `parse(where, object)` turns into an Example (`where` is "path:line: " for its
// errors). Errors name file:line and never quote the file's contents; a file without examples is
// an error too.
absl::StatusOr<std::vector<Example>> read_jsonl_examples(
    const std::string& path,
    const std::function<absl::StatusOr<Example>(const std::string& where,
                                                const nlohmann::json& object)>& parse);

// Builds the task: generates the splits, or reads and validates the JSONL files (errors name
// "<path>:<line>").
absl::StatusOr<Task> make_task(const TaskConfig& config);

// Which training examples step `step` uses: `count` indices into a split of `split_size`,
// walking a fresh seeded permutation per epoch. Stateless (a resumed job sees the same prompts);
// the same arguments always give the same indices. Empty when split_size or count is 0.
std::vector<int64_t> prompt_indices(int64_t split_size, uint64_t seed, int64_t step, int64_t count);

}  // namespace fp8rl::rl
