// The math task's dataset reader, reference answers and prompts (math_task.h).
#include "rl/math_task.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rl/tasks.h"

namespace fp8rl::rl {

namespace {

absl::Status param_error(std::string_view field, std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("task.params.", std::string(field), ": ", std::string(message)));
}

}  // namespace

absl::Status validate_math_params(const TaskConfig& c) {
  if (c.train_path.empty()) return param_error("train_path", "required");
  if (c.question_field.empty()) return param_error("question_field", "must not be empty");
  if (c.answer_field.empty()) return param_error("answer_field", "must not be empty");
  if (c.question_field == c.answer_field) {
    return param_error("answer_field", "must differ from question_field");
  }
  if (c.answer_format != "auto" && c.answer_format != "gsm8k" && c.answer_format != "boxed" &&
      c.answer_format != "plain") {
    return param_error("answer_format", "must be one of auto, gsm8k, boxed, plain");
  }
  if (c.extraction.empty()) {
    return param_error("extraction", "must list at least one of boxed, hash, last_number");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < c.extraction.size(); ++i) {
    const std::string field = absl::StrCat("extraction[", i, "]");
    absl::StatusOr<MathExtractor> e = parse_math_extractor(c.extraction[i]);
    if (!e.ok()) return param_error(field, std::string(e.status().message()));
    if (!seen.insert(c.extraction[i]).second) {
      return param_error(field, absl::StrCat("\"", c.extraction[i], "\" is listed twice"));
    }
  }
  return absl::OkStatus();
}

std::vector<MathExtractor> math_extractors(const TaskConfig& c) {
  std::vector<MathExtractor> out;
  for (const std::string& name : c.extraction) {
    absl::StatusOr<MathExtractor> e = parse_math_extractor(name);
    if (e.ok()) out.push_back(*e);
  }
  return out;
}

absl::StatusOr<std::string> math_reference_answer(const nlohmann::json& value,
                                                  std::string_view answer_format) {
  std::string text;
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_number_integer() || value.is_number_float()) {
    text = value.dump();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("must be a string or a number, got ", value.type_name()));
  }
  std::optional<std::string> raw;
  if (answer_format == "gsm8k" || (answer_format == "auto" && text.find("####") != text.npos)) {
    raw = extract_after_hash(text);
    if (!raw.has_value()) return absl::InvalidArgumentError("no \"#### <answer>\" line");
  } else if (answer_format == "boxed" ||
             (answer_format == "auto" && extract_last_boxed(text).has_value())) {
    raw = extract_last_boxed(text);
    if (!raw.has_value()) return absl::InvalidArgumentError("no complete \\boxed{...}");
  } else {
    raw = text;
  }
  std::string canonical = normalize_math_answer(*raw);
  if (canonical.empty()) return absl::InvalidArgumentError("the answer is empty");
  return canonical;
}

Example math_example(const TaskConfig& c, std::string_view question, std::string answer) {
  Example ex;
  ex.user = std::string(question);
  if (!c.instruction.empty()) absl::StrAppend(&ex.user, "\n", c.instruction);
  ex.system = c.system_prompt;
  ex.prompt = c.system_prompt.empty() ? ex.user : absl::StrCat(c.system_prompt, "\n\n", ex.user);
  ex.answer = std::move(answer);
  return ex;
}

absl::StatusOr<std::vector<Example>> read_math_jsonl(const std::string& path, const TaskConfig& c) {
  return read_jsonl_examples(
      path, [&c](const std::string& where, const nlohmann::json& j) -> absl::StatusOr<Example> {
        auto question = j.find(c.question_field);
        if (question == j.end() || !question->is_string() ||
            question->get<std::string>().find_first_not_of(" \t\r\n") == std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "\"", c.question_field, "\" must be a non-empty string"));
        }
        auto answer = j.find(c.answer_field);
        if (answer == j.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "\"", c.answer_field, "\" missing"));
        }
        absl::StatusOr<std::string> reference = math_reference_answer(*answer, c.answer_format);
        if (!reference.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(where, "\"", c.answer_field, "\" (",
                                                         c.answer_format,
                                                         "): ", reference.status().message()));
        }
        return math_example(c, question->get<std::string>(), *std::move(reference));
      });
}

}  // namespace fp8rl::rl
