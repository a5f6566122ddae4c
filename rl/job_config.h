// The job-config schema: what a user submits (a YAML file, or the same document as JSON over
// REST / gRPC) to describe one RL job. Parsed into JobConfig with defaults; unknown keys, wrong
// types and bad values are rejected with the field path (absl::InvalidArgumentError), e.g.
//   "algorithm.samples_per_prompt: must be >= 2"
//   "precision.kv_cache: must be one of fp8, bf16"
//   "algorithm.foo: unknown key"
// The coordinator stores job_config_to_json(config); parsing that JSON gives the same config.
//
// Keys: docs/guide.md "Job config reference" lists every key with its type, default and rule
// (validate_job_config enforces them; keep the two in agreement). Top-level sections: name,
// model (exactly one of checkpoint, init), task, algorithm, sft (optional warm start),
// precision, validation, checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/precision.h"
#include "nlohmann/json.hpp"
#include "rl/importance.h"

namespace fp8rl::rl {

// precision.*: the shared type of common/precision.h. Job configs take fp8 or bf16 for every
// format; fp32 is rejected (the services' weight formats cannot carry it yet).
using ::fp8rl::Precision;
using ::fp8rl::PrecisionConfig;

struct ModelSpec {
  std::string checkpoint;  // non-empty: start from this checkpoint folder (then no init)
  // Extra variables for the checkpoint's chat template (e.g. Qwen3's {"enable_thinking": false});
  // null unless given (an object; only with checkpoint).
  nlohmann::ordered_json chat_template_kwargs;
  // init (used when checkpoint is empty): exactly one of init_config_path / init_config_inline.
  std::string init_config_path;
  nlohmann::ordered_json init_config_inline;  // null unless the config was given inline (an object)
  uint64_t init_seed = 0;
  bool has_init() const { return checkpoint.empty(); }
  bool operator==(const ModelSpec&) const = default;
};

struct TaskConfig {
  std::string name;  // addition | multiplication | arithmetic | jsonl | math
  uint64_t seed = 1234;
  int64_t train_size = 10000;
  int64_t val_size = 200;
  double format_reward = 0.0;
  // task.params (only those of `name` are accepted, serialized and used):
  int64_t digits = 3;       // addition (default 3), multiplication (default 2, set by the parser)
  int64_t terms = 3;        // arithmetic
  int64_t max_operand = 9;  // arithmetic
  std::string train_path;   // jsonl, math (required)
  std::string val_path;     // jsonl, math (optional)
  std::string match = "line";  // jsonl: line | number
  // math (rl/math_task.h): dataset field names, how the reference answer is written, the
  // completion's answer extractors in order, and the prompt's optional system message and
  // instruction.
  std::string question_field = "question";
  std::string answer_field = "answer";
  std::string answer_format = "auto";  // auto | gsm8k | boxed | plain
  std::vector<std::string> extraction = {"boxed", "hash", "last_number"};
  std::string system_prompt;
  std::string instruction;
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
  double max_grad_norm = 1.0;  // clip the global gradient norm to this; 0 = no clipping
  int64_t minibatches = 1;
  int64_t epochs = 1;
  double clip_eps = 0.2;
  double kl_beta = 0.0;
  IsConfig is;
  // AdamW moment decay rates and denominator epsilon.
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  // Asynchronous RL (docs/design/rl-step.md "Asynchronous RL"): 0 = synchronous (each step
  // generates with the version the previous step published); K >= 1 = rollouts of the next K steps
  // run while the trainer trains, each sample at most K versions behind the version it trains.
  int64_t max_staleness = 0;
  // Mixture-of-experts policies: train with the experts generation chose (routing replay), and
  // the weight of the load-balancing loss (docs/design/model.md "Mixture of experts").
  bool routing_replay = false;
  double router_aux_loss_coef = 0.0;
  int64_t batch_size() const { return prompts_per_step * samples_per_prompt; }
  bool operator==(const AlgorithmConfig&) const = default;
};

struct SftConfig {
  int64_t steps = 50;
  double learning_rate = 1e-3;
  int64_t batch_size = 32;
  bool operator==(const SftConfig&) const = default;
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

// The trainers of a job (docs/design/training.md "Trainer groups").
struct TrainerConfig {
  // Trainers in the job's data-parallel group; the job waits until this many are registered.
  int64_t data_parallel = 1;
  // What the ranks of the group shard (docs/design/sharding.md "Shard modes"): "none",
  // "grads_optimizer" (ZeRO-2) or "params" (ZeRO-3, CPU trainers only). Sent to the
  // trainers when the group forms (JoinGroupRequest.shard); nothing is sharded with one trainer.
  std::string shard = "none";
  bool operator==(const TrainerConfig&) const = default;
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
  TrainerConfig trainer;
  bool operator==(const JobConfig&) const = default;
};

// Algorithm keys renamed to the spelling the proto (OptimizerParams) and the code share; a config
// with the old key is read as the new one, with a warning ("algorithm.grad_clip is deprecated:
// read as algorithm.max_grad_norm; use that name"); giving both is an error.
struct RenamedKey {
  std::string_view old_key;
  std::string_view new_key;
};
inline constexpr RenamedKey kRenamedAlgorithmKeys[] = {
    {"grad_clip", "max_grad_norm"},
    {"adam_eps", "adam_epsilon"},
};

// Parses a job config given as YAML or JSON text (JSON when the first non-space character is
// '{'; YAML otherwise). Syntax errors: InvalidArgument "job config: ..." with the line.
// `warnings` (may be null) receives one line per deprecated key the text uses.
absl::StatusOr<JobConfig> parse_job_config(std::string_view text,
                                           std::vector<std::string>* warnings = nullptr);
// Same, from an already-parsed JSON document (e.g. a REST body).
absl::StatusOr<JobConfig> job_config_from_json(const nlohmann::ordered_json& json,
                                               std::vector<std::string>* warnings = nullptr);
absl::StatusOr<JobConfig> job_config_from_json(const nlohmann::json& json,
                                               std::vector<std::string>* warnings = nullptr);
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
