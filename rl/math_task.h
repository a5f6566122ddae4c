// The `math` task: word problems with numeric answers read from JSON-lines datasets in the common
// shapes, so a job can post-train on GSM8K, MATH-style data or the offline set that
// scripts/make_math_dataset.py generates.
//
// Dataset: one JSON object per line; blank lines are skipped; keys other than the two fields are
// ignored (datasets carry ids, levels, types). Each line needs
//   question_field (default "question"): a non-empty string, the problem text;
//   answer_field (default "answer"): a string or a number, read by answer_format:
//     gsm8k  the text after the last "####" (GSM8K: "...reasoning...\n#### 72");
//     boxed  the content of the last \boxed{...} (MATH's `solution`);
//     plain  the whole value ("72", 72, "3/4");
//     auto   (default) gsm8k when the text has "####", else boxed when it has a complete
//            \boxed{}, else plain.
//   The reference is stored in canonical form (normalize_math_answer). An unreadable file, a
//   line that is not a JSON object (invalid JSON or UTF-8), a missing or mistyped field, or an
//   answer the format cannot find is an error naming "<path>:<line>" and the field.
//
// Prompt: plain format (Example::prompt, fed after BOS when the model has no chat template):
//   [system_prompt "\n\n"] question ["\n" instruction]
// chat format (Example::system / Example::user, rendered by the checkpoint's chat template,
// rl/prompt_format.h): a system message when system_prompt is set, and the user message
//   question ["\n" instruction].
// Completions are scored by task.params.extraction (rl/math_answer.h) and exact match of the
// canonical forms; see rl/tasks.h for the reward.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "rl/job_config.h"
#include "rl/math_answer.h"
#include "rl/tasks.h"

namespace fp8rl::rl {

// Checks the math task's params (train_path given, field names non-empty, answer_format and every
// extraction name known, no repeated extractor); errors name the field, e.g.
// "task.params.extraction[1]: must be one of boxed, hash, last_number, got \"regex\"".
absl::Status validate_math_params(const TaskConfig& config);

// task.params.extraction as extractors (call after validate_math_params).
std::vector<MathExtractor> math_extractors(const TaskConfig& config);

// The canonical reference answer of an answer-field value under `answer_format` (see above);
// the error says what is missing, without the location.
absl::StatusOr<std::string> math_reference_answer(const nlohmann::json& value,
                                                  std::string_view answer_format);

// The example for one problem: plain prompt, chat messages and the given canonical answer.
Example math_example(const TaskConfig& config, std::string_view question, std::string answer);

// Reads one dataset file (see above).
absl::StatusOr<std::vector<Example>> read_math_jsonl(const std::string& path,
                                                     const TaskConfig& config);

}  // namespace fp8rl::rl
