// The checks a job's `model.checkpoint` folder must pass before the job is accepted, so a bad
// folder is an InvalidArgument naming the field at submission (REST 400) instead of a failure
// minutes later on the trainer. Reads only small files: config.json, the shard index,
// tokenizer.json / tokenizer_config.json / generation_config.json; the weights themselves are
// checked (shapes, dtypes, values) when the trainer loads them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp8rl::rl {

struct ModelCheckpointInfo {
  int64_t vocab_size = 0;  // config.json
  // tokenizer.json is present (a Hugging Face model's vocabulary); without it the job uses the
  // byte tokenizer (fp8rl's own checkpoints). With it the RL loop encodes prompts with it and its
  // chat template (job_prompt_format in services/coordinator/rl_loop.h).
  bool has_tokenizer = false;
  bool has_chat_template = false;
  int32_t tokenizer_vocab_size = 0;  // one past the largest token id (0 without a tokenizer)
  std::vector<int32_t> stop_ids;     // HfTokenizer::eos_ids(); empty without a tokenizer
};

// Checks DIR: a folder; config.json a JSON object with an integer vocab_size > 0; weights as
// model.safetensors or model.safetensors.index.json whose weight_map names shards that exist;
// tokenizer.json (when present) loads with its special ids, every id fits config's vocab_size,
// and an EOS id is known; tokenizer_config.json's chat_template (when present) parses. Without
// tokenizer.json, vocab_size must hold the byte tokenizer's 259 ids. Every error is
// InvalidArgument and starts with "model.checkpoint: ".
absl::StatusOr<ModelCheckpointInfo> check_model_checkpoint(const std::string& dir);

}  // namespace fp8rl::rl
