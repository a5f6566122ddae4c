// Tests of rl/job_config.h: every shipped configs/*.yaml parses, defaults, YAML/JSON equivalence,
// the JSON round trip, path resolution, and a table of bad configs with their exact errors.
#include "rl/job_config.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

std::string source_dir() {
  const char* dir = std::getenv("FP8RL_SOURCE_DIR");
  return dir != nullptr ? dir : FP8RL_TEST_SOURCE_DIR;
}

// configs/models/*.json is written by the model owners; until one exists the shipped job configs
// cannot point at a real file, so that one check waits for it.
bool have_model_configs() {
  const std::filesystem::path dir = std::filesystem::path(source_dir()) / "configs" / "models";
  if (!std::filesystem::is_directory(dir)) return false;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") return true;
  }
  return false;
}

constexpr char kMinimal[] = R"(
model:
  init:
    config: configs/models/tiny.json
task:
  name: addition
)";

TEST(JobConfig, EveryShippedConfigParsesAndRoundTrips) {
  const std::filesystem::path dir = std::filesystem::path(source_dir()) / "configs";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<JobConfig> config = load_job_config_file(entry.path().string());
    ASSERT_TRUE(config.ok()) << config.status();
    ++count;
    // The model config named by an init path must exist in the tree.
    if (!config->model.init_config_path.empty() && have_model_configs()) {
      JobConfig resolved = *config;
      resolve_paths(resolved, source_dir());
      EXPECT_TRUE(std::filesystem::exists(resolved.model.init_config_path))
          << resolved.model.init_config_path;
    }
    const std::string json = job_config_to_json(*config).dump();
    absl::StatusOr<JobConfig> again = parse_job_config(json);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *config);
  }
  EXPECT_GE(count, 4);  // smoke, demo, demo-bf16, demo-fp8-gen-only
}

TEST(JobConfig, ShippedConfigsSayWhatTheirNamesPromise) {
  const std::string dir = source_dir() + "/configs/";
  absl::StatusOr<JobConfig> demo = load_job_config_file(dir + "demo.yaml");
  absl::StatusOr<JobConfig> bf16 = load_job_config_file(dir + "demo-bf16.yaml");
  absl::StatusOr<JobConfig> gen_only = load_job_config_file(dir + "demo-fp8-gen-only.yaml");
  absl::StatusOr<JobConfig> smoke = load_job_config_file(dir + "smoke.yaml");
  ASSERT_TRUE(demo.ok() && bf16.ok() && gen_only.ok() && smoke.ok());
  absl::StatusOr<JobConfig> moe = load_job_config_file(dir + "demo-moe.yaml");
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_TRUE(moe->algorithm.routing_replay);
  EXPECT_GT(moe->algorithm.router_aux_loss_coef, 0.0);
  EXPECT_FALSE(demo->algorithm.routing_replay);
  EXPECT_TRUE(demo->sft.has_value());
  EXPECT_EQ(demo->precision.generation, Precision::kFP8);
  EXPECT_EQ(demo->precision.training, Precision::kFP8);
  EXPECT_EQ(demo->precision.kv_cache, Precision::kFP8);
  EXPECT_EQ(bf16->precision.generation, Precision::kBF16);
  EXPECT_EQ(bf16->precision.training, Precision::kBF16);
  EXPECT_EQ(bf16->precision.kv_cache, Precision::kBF16);
  EXPECT_EQ(gen_only->precision.generation, Precision::kFP8);
  EXPECT_EQ(gen_only->precision.training, Precision::kBF16);
  // The variants differ from the demo only in precision, name and checkpoint folder.
  for (JobConfig variant : {*bf16, *gen_only}) {
    variant.precision = demo->precision;
    variant.name = demo->name;
    variant.checkpoint.dir = demo->checkpoint.dir;
    EXPECT_EQ(variant, *demo);
  }
  EXPECT_LT(smoke->algorithm.steps * smoke->algorithm.batch_size(),
            demo->algorithm.steps * demo->algorithm.batch_size() / 20);
}

TEST(JobConfig, DefaultsFromMinimalYaml) {
  absl::StatusOr<JobConfig> c = parse_job_config(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.init_config_path, "configs/models/tiny.json");
  EXPECT_EQ(c->model.init_seed, 0u);
  EXPECT_EQ(c->task.digits, 3);
  EXPECT_EQ(c->task.seed, 1234u);
  EXPECT_EQ(c->algorithm, AlgorithmConfig{});
  EXPECT_EQ(c->algorithm.is.rule, IsRule::kTis);
  EXPECT_EQ(c->algorithm.is.cap, 2.0);
  EXPECT_EQ(c->algorithm.adam_beta1, 0.9);
  EXPECT_EQ(c->algorithm.adam_beta2, 0.999);
  EXPECT_EQ(c->algorithm.adam_epsilon, 1e-8);
  EXPECT_EQ(c->algorithm.max_staleness, 0);  // synchronous unless asked
  EXPECT_FALSE(c->sft.has_value());
  EXPECT_EQ(c->precision, PrecisionConfig{});
  EXPECT_EQ(c->validation.every_steps, 10);
  EXPECT_EQ(c->checkpoint.every_steps, 0);
  EXPECT_EQ(c->trainer.data_parallel, 1);
  EXPECT_EQ(c->trainer.shard, "none");
  // Multiplication's own default digits.
  absl::StatusOr<JobConfig> m =
      parse_job_config("model: {checkpoint: /ckpt}\ntask: {name: multiplication, val_size: 100}\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->task.digits, 2);
  EXPECT_EQ(m->model.checkpoint, "/ckpt");
}

// Plain YAML scalars are typed by the core schema (null, bool, int, float, else string) for any
// length: a 200k-character scalar once overflowed the stack in std::regex (found while writing
// fuzz/fuzz_job_config.cc) and now gets its type or a field error like a short one.
TEST(JobConfig, PlainScalarsAreTypedAtAnyLength) {
  const std::string kLong(200000, '1');
  absl::StatusOr<JobConfig> named = parse_job_config(std::string(kMinimal) + "name: a" + kLong);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->name, "a" + kLong);
  // An integer beyond int64 becomes a number, which an integer field refuses by name.
  absl::StatusOr<JobConfig> big =
      parse_job_config(std::string(kMinimal) + "algorithm: {steps: " + kLong + "}");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("algorithm.steps"), std::string_view::npos) << big.status();
  absl::StatusOr<JobConfig> tiny =
      parse_job_config(std::string(kMinimal) + "algorithm: {temperature: 0." + kLong + "}");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_NEAR(tiny->algorithm.temperature, 0.1111111111111111, 1e-15);
  // The short forms of each type still parse as before.
  absl::StatusOr<JobConfig> forms = parse_job_config(
      std::string(kMinimal) +
      "algorithm: {temperature: .5, top_p: +1, learning_rate: 3E-4, steps: +7, kl_beta: 1.}\n"
      "sft: ~\n");
  ASSERT_TRUE(forms.ok()) << forms.status();
  EXPECT_EQ(forms->algorithm.temperature, 0.5);
  EXPECT_EQ(forms->algorithm.top_p, 1.0);
  EXPECT_EQ(forms->algorithm.learning_rate, 3e-4);
  EXPECT_EQ(forms->algorithm.steps, 7);
  EXPECT_EQ(forms->algorithm.kl_beta, 1.0);
  EXPECT_FALSE(forms->sft.has_value());
  for (const char* bad : {"temperature: .inf", "temperature: -.Inf", "temperature: .NaN",
                          "temperature: 1e", "temperature: 1.5.2", "temperature: true"}) {
    absl::StatusOr<JobConfig> c =
        parse_job_config(std::string(kMinimal) + "algorithm: {" + bad + "}");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("algorithm.temperature"), std::string_view::npos)
        << bad << ": " << c.status();
  }
}

// Job configs are UTF-8: a YAML string that is not (a raw byte, an overlong form) is an
// error naming the field instead of a config whose JSON dump throws later (found by
// fuzz/fuzz_job_config.cc); valid non-ASCII text is kept and round-trips.
TEST(JobConfig, StringsMustBeValidUtf8) {
  for (const std::string& bad : {std::string("name: run\xff"
                                             "1\n"),
                                 std::string("name: \xc0\xaf\n")}) {
    absl::StatusOr<JobConfig> c = parse_job_config(std::string(kMinimal) + bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("name: not valid UTF-8 (line 7)"), std::string_view::npos)
        << c.status();
  }
  absl::StatusOr<JobConfig> key = parse_job_config(std::string(kMinimal) +
                                                   "algorithm: {st\xff"
                                                   "eps: 1}\n");
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.status().message().find("algorithm: not valid UTF-8"), std::string_view::npos)
      << key.status();
  absl::StatusOr<JobConfig> good =
      parse_job_config(std::string(kMinimal) + "name: \"caf\xc3\xa9 \xe4\xb8\xad \\u00e9\"\n");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->name, "caf\xc3\xa9 \xe4\xb8\xad \xc3\xa9");
  absl::StatusOr<JobConfig> again = parse_job_config(job_config_to_json(*good).dump());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *good);
}

// model.chat_template_kwargs: template variables for a checkpoint's chat template, kept through
// the JSON round trip; not a mapping, or without a checkpoint, is an error naming the field.
TEST(JobConfig, ChatTemplateKwargs) {
  const std::string task = "task: {name: addition, val_size: 5}\n";
  absl::StatusOr<JobConfig> c = parse_job_config(
      "model: {checkpoint: /ckpt, chat_template_kwargs: {enable_thinking: false, n: 2}}\n" + task);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.chat_template_kwargs,
            (nlohmann::ordered_json{{"enable_thinking", false}, {"n", 2}}));
  absl::StatusOr<JobConfig> again = parse_job_config(job_config_to_json(*c).dump());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->model, c->model);
  EXPECT_TRUE(parse_job_config("model: {checkpoint: /ckpt}\n" + task)
                  ->model.chat_template_kwargs.is_null());
  const std::string not_mapping =
      std::string(parse_job_config("model: {checkpoint: /ckpt, chat_template_kwargs: [1]}\n" + task)
                      .status()
                      .message());
  EXPECT_TRUE(not_mapping.starts_with("model.chat_template_kwargs: ")) << not_mapping;
  const std::string no_checkpoint = std::string(
      parse_job_config(
          "model: {init: {config: {hidden_size: 64}}, chat_template_kwargs: {a: 1}}\n" + task)
          .status()
          .message());
  EXPECT_TRUE(no_checkpoint.starts_with("model.chat_template_kwargs: only with model.checkpoint"))
      << no_checkpoint;
}

TEST(JobConfig, YamlAndJsonGiveTheSameConfig) {
  const std::string yaml = R"(
name: "quoted 123"
model:
  init:
    config: {hidden_size: 64, num_hidden_layers: 2}
    seed: 5
task: {name: arithmetic, seed: 3, params: {terms: 4, max_operand: 12}, format_reward: 0.1}
algorithm:
  steps: 7
  temperature: 0.7
  learning_rate: 3e-6
  adam_beta2: 0.95
  is: {rule: icepop, lo: 0.25, hi: 4}
sft: {steps: 10}
precision: {generation: bf16, pow2_scales: true, bf16_last_layers: 1}
checkpoint: {every_steps: 2, dir: out}
trainer: {data_parallel: 3, shard: grads_optimizer}
)";
  const std::string json = R"({"name": "quoted 123",
    "model": {"init": {"config": {"hidden_size": 64, "num_hidden_layers": 2}, "seed": 5}},
    "task": {"name": "arithmetic", "seed": 3, "params": {"terms": 4, "max_operand": 12},
             "format_reward": 0.1},
    "algorithm": {"steps": 7, "temperature": 0.7, "learning_rate": 3e-6, "adam_beta2": 0.95,
                  "is": {"rule": "icepop", "lo": 0.25, "hi": 4}},
    "sft": {"steps": 10},
    "precision": {"generation": "bf16", "pow2_scales": true, "bf16_last_layers": 1},
    "checkpoint": {"every_steps": 2, "dir": "out"}, "trainer": {"data_parallel": 3, "shard": "grads_optimizer"}})";
  absl::StatusOr<JobConfig> a = parse_job_config(yaml);
  absl::StatusOr<JobConfig> b = parse_job_config(json);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->name, "quoted 123");
  EXPECT_EQ(a->model.init_config_inline["hidden_size"], 64);
  EXPECT_EQ(a->task.terms, 4);
  EXPECT_EQ(a->algorithm.is.rule, IsRule::kIcepop);
  EXPECT_EQ(a->algorithm.is.hi, 4.0);
  EXPECT_EQ(a->algorithm.learning_rate, 3e-6);
  EXPECT_EQ(a->algorithm.adam_beta2, 0.95);
  EXPECT_EQ(a->sft->steps, 10);
  EXPECT_EQ(a->sft->batch_size, 32);
  EXPECT_EQ(a->precision.generation, Precision::kBF16);
  EXPECT_TRUE(a->precision.pow2_scales);
  EXPECT_EQ(a->trainer.data_parallel, 3);
  EXPECT_EQ(a->trainer.shard, "grads_optimizer");
  // Round trip through the stored JSON, also via nlohmann::json (the REST body type).
  const nlohmann::ordered_json stored = job_config_to_json(*a);
  EXPECT_EQ(stored["task"]["params"],
            nlohmann::ordered_json::parse(R"({"terms": 4, "max_operand": 12})"));
  EXPECT_EQ(*parse_job_config(stored.dump()), *a);
  EXPECT_EQ(*job_config_from_json(nlohmann::json::parse(stored.dump())), *a);
}

TEST(JobConfig, ResolvePathsMakesInputsAbsolute) {
  absl::StatusOr<JobConfig> c = parse_job_config(
      "model: {checkpoint: ckpt/a}\ntask: {name: jsonl, params: {train_path: d/t.jsonl}}\n"
      "checkpoint: {dir: /abs/out}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  resolve_paths(*c, "/work/x");
  EXPECT_EQ(c->model.checkpoint, "/work/x/ckpt/a");
  EXPECT_EQ(c->task.train_path, "/work/x/d/t.jsonl");
  EXPECT_EQ(c->task.val_path, "");
  EXPECT_EQ(c->checkpoint.dir, "/abs/out");
}

struct BadConfig {
  const char* yaml;  // appended to a valid base (model + task) unless it replaces them
  const char* error;
};

TEST(JobConfig, BadConfigsNameTheField) {
  const std::string base =
      "model: {init: {config: configs/models/tiny.json}}\ntask: {name: addition}\n";
  const std::vector<BadConfig> cases = {
      {"algorithm: {samples_per_prompt: 1}", "algorithm.samples_per_prompt: must be >= 2"},
      {"precision: {kv_cache: fp4}", "precision.kv_cache: must be one of fp8, bf16"},
      {"precision: {training: fp32}",
       "precision.training: fp32 is not supported in job configs (th"
       "e trainer and generation services carry fp8 or bf16 weights); use bf16"},
      {"precision: {generation: fp32}",
       "precision.generation: fp32 is not supported in job configs (th"
       "e trainer and generation services carry fp8 or bf16 weights); use bf16"},
      {"algorithm: {adam_beta1: 1}", "algorithm.adam_beta1: must be in [0, 1)"},
      {"algorithm: {adam_beta2: -0.5}", "algorithm.adam_beta2: must be in [0, 1)"},
      {"algorithm: {adam_epsilon: 0}", "algorithm.adam_epsilon: must be > 0"},
      {"algorithm: {max_staleness: -1}", "algorithm.max_staleness: must be in [0, 16]"},
      {"algorithm: {max_staleness: 17}", "algorithm.max_staleness: must be in [0, 16]"},
      {"algorithm: {max_staleness: 1.5}",
       "algorithm.max_staleness: must be an integer, got number"},
      {"algorithm: {router_aux_loss_coef: -0.1}", "algorithm.router_aux_loss_coef: must be >= 0"},
      {"algorithm: {foo: 1}", "algorithm.foo: unknown key"},
      {"bogus: 1", "bogus: unknown key"},
      {"algorithm: {steps: ten}", "algorithm.steps: must be an integer, got string"},
      {"algorithm: {steps: 2.5}", "algorithm.steps: must be an integer, got number"},
      {"algorithm: {steps: 0}", "algorithm.steps: must be >= 1"},
      {"algorithm: {temperature: 0}", "algorithm.temperature: must be > 0"},
      {"algorithm: {temperature: .nan}", "algorithm.temperature: must be a finite number"},
      {"algorithm: {top_p: 1.5}", "algorithm.top_p: must be in (0, 1]"},
      {"algorithm: {learning_rate: \"1e-5\"}",
       "algorithm.learning_rate: must be a number, got string"},
      {"algorithm: {clip_eps: 1}", "algorithm.clip_eps: must be in (0, 1)"},
      {"algorithm: {kl_beta: -0.1}", "algorithm.kl_beta: must be >= 0"},
      {"algorithm: {max_new_tokens: 5000}", "algorithm.max_new_tokens: must be in [1, 4096]"},
      {"algorithm: {prompts_per_step: 2, samples_per_prompt: 2, minibatches: 5}",
       "algorithm.minibatches: must be <= prompts_per_step * samples_per_prompt (4)"},
      {"algorithm: {is: {rule: tis3}}",
       "algorithm.is.rule: must be one of none, tis, icepop, seq_mask_tis"},
      {"algorithm: {is: {rule: icepop, lo: 1.2}}", "algorithm.is.lo: must be in [0, 1], got 1.2"},
      {"algorithm: {is: {cap: 0}}",
       "algorithm.is.cap: must be >= 1 and finite (a cap below 1 truncates on-policy tokens), got "
       "0"},
      {"algorithm: {is: {rule: tis, cap: 0.8}}",
       "algorithm.is.cap: must be >= 1 and finite (a cap below 1 truncates on-policy tokens), got "
       "0.8"},
      {"algorithm: {is: {rule: seq_mask_tis, lo: 1.01}}",
       "algorithm.is.lo: must be in [0, 1], got 1.01"},
      {"algorithm: {is: {rule: seq_mask_tis, hi: 0.9995}}",
       "algorithm.is.hi: must be >= 1 and finite, got 0.9995"},
      {"algorithm: {is: {bounds: [1, 2]}}", "algorithm.is.bounds: unknown key"},
      {"algorithm: [1, 2]", "algorithm: must be a mapping, got array"},
      {"sft: {steps: 0}", "sft.steps: must be >= 1"},
      {"sft: {batch: 4}", "sft.batch: unknown key"},
      {"precision: {pow2_scales: 1}", "precision.pow2_scales: must be a boolean, got number"},
      {"precision: {bf16_first_layers: -1}", "precision.bf16_first_layers: must be >= 0"},
      {"validation: {num_prompts: 500}", "validation.num_prompts: must be <= task.val_size (200)"},
      {"checkpoint: {every_steps: 5}", "checkpoint.dir: required when checkpoint.every_steps > 0"},
      {"trainer: {data_parallel: 0}", "trainer.data_parallel: must be in [1, 64]"},
      {"trainer: {data_parallel: 65}", "trainer.data_parallel: must be in [1, 64]"},
      {"trainer: {ranks: 2}", "trainer.ranks: unknown key"},
      {"trainer: {shard: zero2}",
       "trainer.shard: must be none, grads_optimizer or params, got 'zero2'"},
      {"trainer: {shard: 2}", "trainer.shard: must be a string, got number"},
      {"name: [a]", "name: must be a string, got array"},
  };
  for (const BadConfig& c : cases) {
    absl::StatusOr<JobConfig> parsed = parse_job_config(base + c.yaml + "\n");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_EQ(parsed.status().message(), c.error) << c.yaml;
  }
  // Every shard mode is taken (ZeRO-3 included).
  for (const char* mode : {"none", "grads_optimizer", "params"}) {
    absl::StatusOr<JobConfig> parsed =
        parse_job_config(base + "trainer: {data_parallel: 2, shard: " + mode + "}\n");
    ASSERT_TRUE(parsed.ok()) << mode << ": " << parsed.status();
    EXPECT_EQ(parsed->trainer.shard, mode);
  }
  // Whole-document and model/task errors.
  const std::vector<BadConfig> whole = {
      {"task: {name: addition}", "model: required"},
      {"model: {checkpoint: a}", "task: required"},
      {"model: {checkpoint: a, init: {config: b}}\ntask: {name: addition}",
       "model: give either checkpoint or init, not both"},
      {"model: {}\ntask: {name: addition}", "model: one of checkpoint, init is required"},
      {"model: {init: {seed: 1}}\ntask: {name: addition}", "model.init.config: required"},
      {"model: {init: {config: [1]}}\ntask: {name: addition}",
       "model.init.config: must be a path string or a mapping, got array"},
      {"model: {init: {config: c, seed: -1}}\ntask: {name: addition}",
       "model.init.seed: must be >= 0"},
      {"model: {checkpoint: a}\ntask: {seed: 1}", "task.name: required"},
      {"model: {checkpoint: a}\ntask: {name: sudoku}",
       "task.name: must be one of addition, multiplication, arithmetic, jsonl, math"},
      {"model: {checkpoint: a}\ntask: {name: addition, params: {terms: 3}}",
       "task.params.terms: unknown key (addition takes digits)"},
      {"model: {checkpoint: a}\ntask: {name: addition, params: {digits: 12}}",
       "task.params.digits: must be in [1, 9]"},
      {"model: {checkpoint: a}\ntask: {name: jsonl}", "task.params.train_path: required"},
      {"model: {checkpoint: a}\ntask: {name: addition, format_reward: 1}",
       "task.format_reward: must be in [0, 1)"},
      {"model: {checkpoint: a}\nmodel: {checkpoint: b}\ntask: {name: addition}",
       "model: duplicate key"},
      {"- 1\n- 2", "job config: must be a mapping, got array"},
      {"   \n", "job config: empty"},
      {"model: {checkpoint: a\n",
       "job config: YAML syntax error at line 2: end of map flow not found"},
  };
  for (const BadConfig& c : whole) {
    EXPECT_EQ(parse_job_config(c.yaml).status().message(), c.error) << c.yaml;
  }
  // JSON input: syntax errors and duplicate keys are caught by the strict JSON reader.
  EXPECT_TRUE(std::string(parse_job_config("{\"model\": ").status().message())
                  .starts_with("job config: malformed JSON"));
  EXPECT_EQ(parse_job_config(R"({"model": {"checkpoint": "a"}, "task": {"name": "addition",
      "val_size": 5}, "algorithm": {"steps": -3}})")
                .status()
                .message(),
            "algorithm.steps: must be >= 1");
  EXPECT_EQ(parse_job_config(R"({"name": "a", "name": "b"})").status().message(),
            "job config: malformed JSON: duplicate key 'name'");
  // A file that does not parse names the file.
  EXPECT_TRUE(load_job_config_file("/nonexistent/job.yaml")
                  .status()
                  .message()
                  .find("/nonexistent/job.yaml") != std::string::npos);
}

TEST(JobConfig, LearningRateWarmsUpLinearlyThenHolds) {
  AlgorithmConfig a;
  a.learning_rate = 3e-4;
  a.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 1), 0.75e-4);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 2), 1.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 3), 2.25e-4);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 4), 3e-4);
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 40), 3e-4);
  a.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate_at(a, 1), 3e-4);
}

TEST(JobConfig, IsBoundsDefaultPerRuleAndZeroIsKept) {
  const std::string base =
      "model: {init: {config: configs/models/tiny.json}}\ntask: {name: addition}\n";
  // seq_mask_tis without bounds gets [0.999, 1.002], not the token rules' [0.5, 2].
  absl::StatusOr<JobConfig> seq = parse_job_config(base + "algorithm: {is: {rule: seq_mask_tis}}");
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(seq->algorithm.is, (IsConfig{IsRule::kSeqMaskTis, 2.0, 0.999, 1.002}));
  // Given bounds win, one at a time.
  absl::StatusOr<JobConfig> seq_hi =
      parse_job_config(base + "algorithm: {is: {rule: seq_mask_tis, hi: 1.01}}");
  ASSERT_TRUE(seq_hi.ok()) << seq_hi.status();
  EXPECT_EQ(seq_hi->algorithm.is.lo, 0.999);
  EXPECT_EQ(seq_hi->algorithm.is.hi, 1.01);
  // icepop keeps [0.5, 2]; lo: 0 stays 0 and survives the stored-JSON round trip.
  absl::StatusOr<JobConfig> ice = parse_job_config(base + "algorithm: {is: {rule: icepop, lo: 0}}");
  ASSERT_TRUE(ice.ok()) << ice.status();
  EXPECT_EQ(ice->algorithm.is, (IsConfig{IsRule::kIcepop, 2.0, 0.0, 2.0}));
  absl::StatusOr<JobConfig> again = parse_job_config(job_config_to_json(*ice).dump());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->algorithm.is.lo, 0.0);
  // tis with a cap of exactly 1 is valid (never up-weights).
  EXPECT_TRUE(parse_job_config(base + "algorithm: {is: {rule: tis, cap: 1}}").ok());
}

// Each renamed algorithm key (kRenamedAlgorithmKeys) still reads, as the new key, with one
// warning line naming both; old and new together are an error naming the old key.
TEST(JobConfig, OldAlgorithmKeysReadWithAWarning) {
  const struct {
    const char* old_key;
    const char* new_key;
    double value;
    double AlgorithmConfig::*field;
  } cases[] = {
      {"grad_clip", "max_grad_norm", 0.37, &AlgorithmConfig::max_grad_norm},
      {"adam_eps", "adam_epsilon", 0.001, &AlgorithmConfig::adam_epsilon},
  };
  ASSERT_EQ(std::size(cases), std::size(kRenamedAlgorithmKeys));
  for (const auto& c : cases) {
    SCOPED_TRACE(c.old_key);
    const std::string text = std::string(kMinimal) + "algorithm:\n  " + c.old_key + ": " +
                             std::to_string(c.value) + "\n";
    std::vector<std::string> warnings;
    absl::StatusOr<JobConfig> old_config = parse_job_config(text, &warnings);
    ASSERT_TRUE(old_config.ok()) << old_config.status();
    EXPECT_DOUBLE_EQ(old_config->algorithm.*c.field, c.value);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0], std::string("algorithm.") + c.old_key +
                               " is deprecated: read as algorithm." + c.new_key +
                               "; use that name");
    // Same config as with the new key, and the stored form uses the new key.
    std::vector<std::string> none;
    absl::StatusOr<JobConfig> new_config =
        parse_job_config(std::string(kMinimal) + "algorithm:\n  " + c.new_key + ": " +
                             std::to_string(c.value) + "\n",
                         &none);
    ASSERT_TRUE(new_config.ok()) << new_config.status();
    EXPECT_TRUE(none.empty());
    EXPECT_EQ(*old_config, *new_config);
    const nlohmann::ordered_json stored = job_config_to_json(*old_config);
    EXPECT_TRUE(stored["algorithm"].contains(c.new_key));
    EXPECT_FALSE(stored["algorithm"].contains(c.old_key));
    // Both spellings at once.
    absl::StatusOr<JobConfig> both = parse_job_config(std::string(kMinimal) + "algorithm:\n  " +
                                                      c.old_key + ": 1\n  " + c.new_key + ": 1\n");
    EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(both.status().message().find(std::string("algorithm.") + c.old_key + ": renamed"),
              std::string::npos)
        << both.status();
  }
}

}  // namespace
}  // namespace fp8rl::rl
