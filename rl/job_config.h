// The job-config schema: what a user submits (a YAML file, or the same document as JSON over
// REST / gRPC) to describe one RL job. Parsed into JobConfig with defaults; unknown keys, wrong
// types and bad values are rejected with the field path (absl::InvalidArgumentError), e.g.
//   "algorithm.samples_per_prompt: must be >= 2"
//   "precision.kv_cache: must be one of fp8, bf16, fp32"
//   "algorithm.foo: unknown key"
// The coordinator stores job_config_to_json(config); parsing that JSON gives the same config.
//
// Keys (all optional unless marked required; "path" = file-system path, see resolve_paths):
//
// | key                              | type          | default    | meaning / constraint |
// |----------------------------------|---------------|------------|-----------------------------------|
// | name                             | string        | ""         | free-form job name | |
// model.checkpoint                 | path          | -          | HF checkpoint folder to start
// from| | model.init.config                | path | map    | -          | HF config.json path or
// inline map | | model.init.seed                  | int >= 0      | 0          | weight-init seed |
// |   (model: exactly one of checkpoint, init is required)                                        |
// | task.name (required)             | string        | -          | addition, multiplication, | |
// |               |            | arithmetic, jsonl                 | | task.seed | int >= 0      |
// 1234       | seed of the generated splits      | | task.train_size                  | int >= 1 |
// 10000      | train examples (jsonl: a cap)     | | task.val_size                    | int >= 1 |
// 200        | validation examples (jsonl: split | |                                  | | | off
// train when no val_path, else a| |                                  |               |            |
// cap)                              | | task.format_reward               | 0 <= x < 1    | 0 |
// reward of a wrong but well-formed | |                                  |               | | answer
// | | task.params.digits               | int           | 3 / 2      | addition: 1..9 (default 3), |
// |                                  |               |            | multiplication: 1..4 (default
// 2)  | | task.params.terms                | int 2..8      | 3          | arithmetic: operands per
// problem  | | task.params.max_operand          | int 1..99     | 9          | arithmetic: operands
// in [0, max]  | | task.params.train_path (jsonl)   | path          | - (req.)   | JSONL
// {"prompt":..,"answer":..}   | | task.params.val_path (jsonl)     | path          | ""         |
// validation JSONL                  | | task.params.match (jsonl)        | string        | line |
// line or number (rl/tasks.h)       | | algorithm.steps                  | int >= 1      | 100 |
// GRPO steps                        | | algorithm.prompts_per_step       | int >= 1      | 16 | P |
// | algorithm.samples_per_prompt     | int >= 2      | 8          | G (group size) | |
// algorithm.max_new_tokens         | int 1..4096   | 16         | completion length limit | |
// algorithm.temperature            | x > 0         | 1.0        | sampling temperature | |
// algorithm.top_p                  | 0 < x <= 1    | 1.0        | nucleus sampling | |
// algorithm.seed                   | int >= 0      | 1          | sampling seed | |
// algorithm.learning_rate          | x > 0         | 1e-5       | AdamW peak learning rate | |
// algorithm.warmup_steps           | int >= 0      | 0          | linear warmup steps | |
// algorithm.weight_decay           | x >= 0        | 0.0        | AdamW decoupled weight decay | |
// algorithm.grad_clip              | x >= 0        | 1.0        | global grad-norm clip, 0 = off |
// | algorithm.minibatches            | int >= 1      | 1          | optimizer steps per epoch; must
// be| |                                  |               |            | <=
// prompts_per_step*samples_per_..| | algorithm.epochs                 | int >= 1      | 1 | passes
// over each step's batch     | | algorithm.clip_eps               | 0 < x < 1     | 0.2        |
// PPO clip epsilon                  | | algorithm.kl_beta                | x >= 0        | 0.0 |
// KL_k3(ref||cur) weight, 0 = no ref| | algorithm.is.rule                | string        | tis |
// none, tis, icepop, seq_mask_tis   | | algorithm.is.cap                 | x > 0         | 2.0 |
// tis clamp C                       | | algorithm.is.lo                  | 0 <= x <= 1   | 0.5 |
// icepop / seq_mask_tis lower bound | | algorithm.is.hi                  | x >= 1, > lo  | 2.0 |
// icepop / seq_mask_tis upper bound | | sft (optional; absent = no SFT warm start) | | sft.steps |
// int >= 1      | 50         | SFT optimizer steps               | | sft.learning_rate | x > 0 |
// 1e-3       | SFT AdamW learning rate           | | sft.batch_size                   | int >= 1 |
// 32         | examples per SFT step             | | precision.generation             | string |
// fp8        | fp8, bf16, fp32 (linear layers)   | | precision.training               | string |
// fp8        | fp8, bf16, fp32 (linear layers)   | | precision.kv_cache               | string |
// fp8        | fp8, bf16, fp32                   | | precision.pow2_scales            | bool |
// false      | power-of-two FP8 scales           | | precision.bf16_first_layers      | int >= 0 |
// 0          | first N layers stay BF16          | | precision.bf16_last_layers       | int >= 0 |
// 0          | last N layers stay BF16           | | validation.every_steps           | int >= 0 |
// 10         | validate every k steps (and before| |                                  | | | step 1
// and after the last); 0 =   | |                                  |               |            |
// only before and after             | | validation.num_prompts           | int >= 0      | 0 | val
// examples used, 0 = all; for   | |                                  |               |            |
// generated tasks <= task.val_size  | | checkpoint.every_steps           | int >= 0      | 0 |
// checkpoint every c steps, 0 = off | | checkpoint.dir                   | path          | "" |
// required when every_steps > 0     |
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "rl/importance.h"

namespace fp8rl::rl {

enum class Precision { kFp8, kBf16, kFp32 };
std::string_view precision_name(Precision precision);  // "fp8", "bf16", "fp32"
absl::StatusOr<Precision> parse_precision(std::string_view name);

struct ModelSpec {
  std::string checkpoint;  // non-empty: start from this checkpoint folder (then no init)
  // init (used when checkpoint is empty): exactly one of init_config_path / init_config_inline.
  std::string init_config_path;
  nlohmann::ordered_json init_config_inline;  // null unless the config was given inline (an object)
  uint64_t init_seed = 0;
  bool has_init() const { return checkpoint.empty(); }
  bool operator==(const ModelSpec&) const = default;
};

struct TaskConfig {
  std::string name;  // addition | multiplication | arithmetic | jsonl
  uint64_t seed = 1234;
  int64_t train_size = 10000;
  int64_t val_size = 200;
  double format_reward = 0.0;
  // task.params (only those of `name` are accepted, serialized and used):
  int64_t digits = 3;       // addition (default 3), multiplication (default 2, set by the parser)
  int64_t terms = 3;        // arithmetic
  int64_t max_operand = 9;  // arithmetic
  std::string train_path;   // jsonl (required)
  std::string val_path;     // jsonl (optional)
  std::string match = "line";  // jsonl: line | number
  bool operator==(const TaskConfig&) const = default;
};

struct AlgorithmConfig {
  int64_t steps = 100;
  int64_t prompts_per_step = 16;
  int64_t samples_per_prompt = 8;
  int64_t max_new_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  uint64_t seed = 1;
  double learning_rate = 1e-5;
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double grad_clip = 1.0;
  int64_t minibatches = 1;
  int64_t epochs = 1;
  double clip_eps = 0.2;
  double kl_beta = 0.0;
  IsConfig is;
  int64_t batch_size() const { return prompts_per_step * samples_per_prompt; }
  bool operator==(const AlgorithmConfig&) const = default;
};

struct SftConfig {
  int64_t steps = 50;
  double learning_rate = 1e-3;
  int64_t batch_size = 32;
  bool operator==(const SftConfig&) const = default;
};

struct PrecisionConfig {
  Precision generation = Precision::kFp8;
  Precision training = Precision::kFp8;
  Precision kv_cache = Precision::kFp8;
  bool pow2_scales = false;
  int64_t bf16_first_layers = 0;
  int64_t bf16_last_layers = 0;
  bool operator==(const PrecisionConfig&) const = default;
};

struct ValidationConfig {
  int64_t every_steps = 10;
  int64_t num_prompts = 0;
  bool operator==(const ValidationConfig&) const = default;
};

struct CheckpointConfig {
  int64_t every_steps = 0;
  std::string dir;
  bool operator==(const CheckpointConfig&) const = default;
};

struct JobConfig {
  std::string name;
  ModelSpec model;
  TaskConfig task;
  AlgorithmConfig algorithm;
  std::optional<SftConfig> sft;
  PrecisionConfig precision;
  ValidationConfig validation;
  CheckpointConfig checkpoint;
  bool operator==(const JobConfig&) const = default;
};

// Parses a job config given as YAML or JSON text (JSON when the first non-space character is
// '{'; YAML otherwise). Syntax errors: InvalidArgument "job config: ..." with the line.
absl::StatusOr<JobConfig> parse_job_config(std::string_view text);
// Same, from an already-parsed JSON document (e.g. a REST body).
absl::StatusOr<JobConfig> job_config_from_json(const nlohmann::ordered_json& json);
absl::StatusOr<JobConfig> job_config_from_json(const nlohmann::json& json);
// Reads and parses a file; errors are prefixed with the path.
absl::StatusOr<JobConfig> load_job_config_file(const std::string& path);

// The cross-field checks parse_job_config runs (exposed for configs built in code).
absl::Status validate_job_config(const JobConfig& config);

// The whole config with every default filled in; only the params of task.name are written.
nlohmann::ordered_json job_config_to_json(const JobConfig& config);

// The learning rate of RL step `step` (1-based): algorithm.learning_rate after a linear warmup
// over the first warmup_steps steps (step s < warmup gets learning_rate * s / warmup_steps).
double learning_rate_at(const AlgorithmConfig& algorithm, int64_t step);

// Makes relative input paths (model.checkpoint, model.init.config, task.params.train_path,
// task.params.val_path, checkpoint.dir) absolute against base_dir. The CLI calls it with its
// working directory before submitting, because the coordinator may run elsewhere.
void resolve_paths(JobConfig& config, const std::string& base_dir);

}  // namespace fp8rl::rl
