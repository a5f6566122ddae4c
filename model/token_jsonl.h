// JSON-lines token files (`{"tokens": [...]}` per line) as the CLI and tests exchange them, with
// errors that name the file, the line and the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::model {

struct TokenLines {
  std::vector<std::vector<int32_t>> rows;
  std::vector<int64_t> line;  // 1-based line number of each row (blank lines are skipped)
};

// Each non-blank line must be a JSON object whose `key` is an array of integers in int32 range;
// other keys are ignored. "in.jsonl:3: prompt_tokens: expected an array of integers".
absl::StatusOr<TokenLines> read_token_jsonl(const std::string& path, const std::string& key);

}  // namespace fp8rl::model
