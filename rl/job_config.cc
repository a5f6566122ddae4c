// Job-config parsing (YAML or JSON -> JobConfig with defaults), validation with field paths,
// and serialization back to JSON. The schema table is in job_config.h.
#include "rl/job_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "common/json_util.h"
#include "common/status_macros.h"
#include "rl/job_limits.h"
#include "rl/tasks.h"
#include "yaml-cpp/yaml.h"

namespace fp8rl::rl {

using Json = nlohmann::ordered_json;

namespace {

absl::Status field_error(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

std::string join_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", std::string(key));
}

// ---- YAML -> JSON ------------------------------------------------------------------------------
// Plain (unquoted) scalars are typed as YAML 1.2's core schema does: null, bool, int, float, else
// string. Quoted scalars are always strings.

// Matchers of the core schema's plain scalars, written out rather than with std::regex: the
// libstdc++ regex executor recurses once per character, so a long scalar (100k digits) overflowed
// the stack and took the coordinator down (found while writing the job-config fuzz target;
// docs/results/history/2026-12-03-fuzzing.md).
bool is_one_of(std::string_view s, std::initializer_list<std::string_view> words) {
  return std::find(words.begin(), words.end(), s) != words.end();
}

std::string_view without_sign(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return s;
}

// Consumes [0-9]* from s at *i; returns how many digits it took.
size_t take_digits(std::string_view s, size_t* i) {
  const size_t begin = *i;
  while (*i < s.size() && s[*i] >= '0' && s[*i] <= '9') ++*i;
  return *i - begin;
}

// [-+]?[0-9]+
bool is_yaml_int(std::string_view s) {
  s = without_sign(s);
  size_t i = 0;
  return take_digits(s, &i) > 0 && i == s.size();
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool is_yaml_float(std::string_view s) {
  s = without_sign(s);
  size_t i = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (take_digits(s, &i) == 0) return false;
  } else {
    if (take_digits(s, &i) == 0) return false;
    if (i < s.size() && s[i] == '.') {
      ++i;
      take_digits(s, &i);
    }
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (take_digits(s, &i) == 0) return false;
  }
  return i == s.size();
}

absl::StatusOr<Json> yaml_scalar_to_json(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return Json(s);  // quoted
  if (is_one_of(s, {"~", "null", "Null", "NULL", ""})) return Json(nullptr);
  if (is_one_of(s, {"true", "True", "TRUE"})) return Json(true);
  if (is_one_of(s, {"false", "False", "FALSE"})) return Json(false);
  if (is_yaml_int(s)) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno == 0) return Json(static_cast<int64_t>(v));
    return Json(std::strtod(s.c_str(), nullptr));  // out of int64 range: a (large) number
  }
  if (is_yaml_float(s)) return Json(std::strtod(s.c_str(), nullptr));
  if (is_one_of(without_sign(s), {".inf", ".Inf", ".INF"})) {
    return Json(s[0] == '-' ? -std::numeric_limits<double>::infinity()
                            : std::numeric_limits<double>::infinity());
  }
  if (is_one_of(s, {".nan", ".NaN", ".NAN"})) return Json(std::numeric_limits<double>::quiet_NaN());
  return Json(s);
}

// True when `s` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points
// above U+10FFFF). yaml-cpp passes raw bytes through unchecked; a string that is not UTF-8 made
// the stored config's JSON dump throw, taking the coordinator down (found by
// fuzz/fuzz_job_config.cc).
bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

absl::Status check_utf8(const YAML::Node& node, const std::string& text, const std::string& path) {
  if (is_valid_utf8(text)) return absl::OkStatus();
  return field_error(path.empty() ? "job config" : path,
                     absl::StrCat("not valid UTF-8 (line ", node.Mark().line + 1, ")"));
}

absl::StatusOr<Json> yaml_to_json(const YAML::Node& node, const std::string& path) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return Json(nullptr);
    case YAML::NodeType::Scalar:
      FP8RL_RETURN_IF_ERROR(check_utf8(node, node.Scalar(), path));
      return yaml_scalar_to_json(node);
    case YAML::NodeType::Sequence: {
      Json array = Json::array();
      for (size_t i = 0; i < node.size(); ++i) {
        absl::StatusOr<Json> item = yaml_to_json(node[i], absl::StrCat(path, "[", i, "]"));
        if (!item.ok()) return item.status();
        array.push_back(*std::move(item));
      }
      return array;
    }
    case YAML::NodeType::Map: {
      Json object = Json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return field_error(path.empty() ? "job config" : path, "keys must be plain strings");
        }
        const std::string key = kv.first.Scalar();
        FP8RL_RETURN_IF_ERROR(check_utf8(kv.first, key, path));
        const std::string child = join_path(path, key);
        if (object.contains(key)) return field_error(child, "duplicate key");
        absl::StatusOr<Json> value = yaml_to_json(kv.second, child);
        if (!value.ok()) return value.status();
        object[key] = *std::move(value);
      }
      return object;
    }
  }
  return field_error(path, "unsupported YAML node");
}

// ---- typed field reader ------------------------------------------------------------------------
// Reads one mapping: rejects unknown keys, checks types; absent or null keys keep the default.

class Fields {
 public:
  Fields(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

  absl::Status allow_only(std::initializer_list<std::string_view> keys,
                          std::string_view hint = "") const {
    for (const auto& [key, value] : object_.items()) {
      bool known = false;
      for (std::string_view k : keys) known = known || key == k;
      if (!known) {
        return field_error(path(key), hint.empty()
                                          ? std::string("unknown key")
                                          : absl::StrCat("unknown key (", std::string(hint), ")"));
      }
    }
    return absl::OkStatus();
  }

  bool has(std::string_view key) const {
    auto it = object_.find(std::string(key));
    return it != object_.end() && !it->is_null();
  }
  const Json& at(std::string_view key) const { return object_.at(std::string(key)); }
  std::string path(std::string_view key) const { return join_path(path_, key); }

  absl::Status get_int(std::string_view key, int64_t* out) const {
    if (!has(key)) return absl::OkStatus();
    const Json& v = at(key);
    if (!v.is_number_integer()) return type_error(key, "an integer", v);
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return field_error(path(key), "is too large");
    }
    *out = v.get<int64_t>();
    return absl::OkStatus();
  }

  absl::Status get_seed(std::string_view key, uint64_t* out) const {
    if (!has(key)) return absl::OkStatus();
    const Json& v = at(key);
    if (!v.is_number_integer()) return type_error(key, "an integer", v);
    if (v.is_number_unsigned()) {
      *out = v.get<uint64_t>();
    } else {
      const int64_t s = v.get<int64_t>();
      if (s < 0) return field_error(path(key), "must be >= 0");
      *out = static_cast<uint64_t>(s);
    }
    return absl::OkStatus();
  }

  absl::Status get_double(std::string_view key, double* out) const {
    if (!has(key)) return absl::OkStatus();
    const Json& v = at(key);
    if (!v.is_number()) return type_error(key, "a number", v);
    const double d = v.get<double>();
    if (!std::isfinite(d)) return field_error(path(key), "must be a finite number");
    *out = d;
    return absl::OkStatus();
  }

  absl::Status get_bool(std::string_view key, bool* out) const {
    if (!has(key)) return absl::OkStatus();
    const Json& v = at(key);
    if (!v.is_boolean()) return type_error(key, "a boolean", v);
    *out = v.get<bool>();
    return absl::OkStatus();
  }

  absl::Status get_string(std::string_view key, std::string* out) const {
    if (!has(key)) return absl::OkStatus();
    const Json& v = at(key);
    if (!v.is_string()) return type_error(key, "a string", v);
    *out = v.get<std::string>();
    return absl::OkStatus();
  }

  // A list of strings (a YAML sequence / JSON array).
  absl::Status get_string_list(std::string_view key, std::vector<std::string>* out) const {
    if (!has(key)) return absl::OkStatus();
    const Json& v = at(key);
    if (!v.is_array()) return type_error(key, "a list of strings", v);
    std::vector<std::string> items;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) {
        return field_error(absl::StrCat(path(key), "[", i, "]"),
                           absl::StrCat("must be a string, got ", v[i].type_name()));
      }
      items.push_back(v[i].get<std::string>());
    }
    *out = std::move(items);
    return absl::OkStatus();
  }

  // fp8 or bf16: the formats the services carry (fp32 is named in its own error).
  absl::Status get_precision(std::string_view key, Precision* out) const {
    std::string name(precision_name(*out));
    if (absl::Status s = get_string(key, &name); !s.ok()) return s;
    if (name == "fp32") {
      return field_error(path(key),
                         "fp32 is not supported in job configs (the trainer and generation "
                         "services carry fp8 or bf16 weights); use bf16");
    }
    if (name != "fp8" && name != "bf16") return field_error(path(key), "must be one of fp8, bf16");
    *out = name == "fp8" ? Precision::kFP8 : Precision::kBF16;
    return absl::OkStatus();
  }

  // A nested mapping (absent or null: an empty one, so defaults apply).
  absl::StatusOr<Fields> get_object(std::string_view key) const {
    static const Json kEmpty = Json::object();
    if (!has(key)) return Fields(kEmpty, path(key));
    const Json& v = at(key);
    if (!v.is_object()) return type_error(key, "a mapping", v);
    return Fields(v, path(key));
  }

  absl::Status type_error(std::string_view key, std::string_view expected, const Json& v) const {
    return field_error(path(key),
                       absl::StrCat("must be ", std::string(expected), ", got ", v.type_name()));
  }

 private:
  const Json& object_;
  std::string path_;
};

#define FP8RL_ASSIGN_OR_RETURN_FIELDS(lhs, expr) \
  absl::StatusOr<Fields> lhs##_or = (expr);      \
  if (!lhs##_or.ok()) return lhs##_or.status();  \
  const Fields& lhs = *lhs##_or

absl::Status read_model(const Fields& top, ModelSpec* model) {
  if (!top.has("model")) return field_error("model", "required");
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("model"));
  FP8RL_RETURN_IF_ERROR(f.allow_only({"checkpoint", "init", "chat_template_kwargs"}));
  const bool has_checkpoint = f.has("checkpoint");
  const bool has_init = f.has("init");
  if (has_checkpoint && has_init) {
    return field_error("model", "give either checkpoint or init, not both");
  }
  if (!has_checkpoint && !has_init)
    return field_error("model", "one of checkpoint, init is required");
  if (has_checkpoint) {
    FP8RL_RETURN_IF_ERROR(f.get_string("checkpoint", &model->checkpoint));
    if (model->checkpoint.empty()) return field_error("model.checkpoint", "must not be empty");
    if (f.has("chat_template_kwargs")) {
      const Json& kwargs = f.at("chat_template_kwargs");
      if (!kwargs.is_object()) {
        return f.type_error("chat_template_kwargs", "a mapping of template variables", kwargs);
      }
      model->chat_template_kwargs = kwargs;
    }
    return absl::OkStatus();
  }
  if (f.has("chat_template_kwargs")) {
    return field_error("model.chat_template_kwargs",
                       "only with model.checkpoint (its chat template takes them)");
  }
  FP8RL_ASSIGN_OR_RETURN_FIELDS(init, f.get_object("init"));
  FP8RL_RETURN_IF_ERROR(init.allow_only({"config", "seed"}));
  if (!init.has("config")) return field_error("model.init.config", "required");
  const Json& config = init.at("config");
  if (config.is_string()) {
    model->init_config_path = config.get<std::string>();
    if (model->init_config_path.empty()) {
      return field_error("model.init.config", "must not be empty");
    }
  } else if (config.is_object()) {
    model->init_config_inline = config;
  } else {
    return init.type_error("config", "a path string or a mapping", config);
  }
  return init.get_seed("seed", &model->init_seed);
}

absl::Status read_task(const Fields& top, TaskConfig* task) {
  if (!top.has("task")) return field_error("task", "required");
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("task"));
  FP8RL_RETURN_IF_ERROR(
      f.allow_only({"name", "seed", "train_size", "val_size", "format_reward", "params"}));
  if (!f.has("name")) return field_error("task.name", "required");
  FP8RL_RETURN_IF_ERROR(f.get_string("name", &task->name));
  FP8RL_RETURN_IF_ERROR(f.get_seed("seed", &task->seed));
  FP8RL_RETURN_IF_ERROR(f.get_int("train_size", &task->train_size));
  FP8RL_RETURN_IF_ERROR(f.get_int("val_size", &task->val_size));
  FP8RL_RETURN_IF_ERROR(f.get_double("format_reward", &task->format_reward));
  FP8RL_ASSIGN_OR_RETURN_FIELDS(params, f.get_object("params"));
  if (task->name == "addition") {
    FP8RL_RETURN_IF_ERROR(params.allow_only({"digits"}, "addition takes digits"));
    FP8RL_RETURN_IF_ERROR(params.get_int("digits", &task->digits));
  } else if (task->name == "multiplication") {
    task->digits = 2;
    FP8RL_RETURN_IF_ERROR(params.allow_only({"digits"}, "multiplication takes digits"));
    FP8RL_RETURN_IF_ERROR(params.get_int("digits", &task->digits));
  } else if (task->name == "arithmetic") {
    FP8RL_RETURN_IF_ERROR(
        params.allow_only({"terms", "max_operand"}, "arithmetic takes terms, max_operand"));
    FP8RL_RETURN_IF_ERROR(params.get_int("terms", &task->terms));
    FP8RL_RETURN_IF_ERROR(params.get_int("max_operand", &task->max_operand));
  } else if (task->name == "jsonl") {
    FP8RL_RETURN_IF_ERROR(params.allow_only({"train_path", "val_path", "match"},
                                            "jsonl takes train_path, val_path, match"));
    FP8RL_RETURN_IF_ERROR(params.get_string("train_path", &task->train_path));
    FP8RL_RETURN_IF_ERROR(params.get_string("val_path", &task->val_path));
    FP8RL_RETURN_IF_ERROR(params.get_string("match", &task->match));
  } else if (task->name == "math") {
    FP8RL_RETURN_IF_ERROR(params.allow_only(
        {"train_path", "val_path", "question_field", "answer_field", "answer_format", "extraction",
         "system_prompt", "instruction"},
        "math takes train_path, val_path, question_field, answer_field, answer_format, "
        "extraction, system_prompt, instruction"));
    FP8RL_RETURN_IF_ERROR(params.get_string("train_path", &task->train_path));
    FP8RL_RETURN_IF_ERROR(params.get_string("val_path", &task->val_path));
    FP8RL_RETURN_IF_ERROR(params.get_string("question_field", &task->question_field));
    FP8RL_RETURN_IF_ERROR(params.get_string("answer_field", &task->answer_field));
    FP8RL_RETURN_IF_ERROR(params.get_string("answer_format", &task->answer_format));
    FP8RL_RETURN_IF_ERROR(params.get_string_list("extraction", &task->extraction));
    FP8RL_RETURN_IF_ERROR(params.get_string("system_prompt", &task->system_prompt));
    FP8RL_RETURN_IF_ERROR(params.get_string("instruction", &task->instruction));
  } else {
    return field_error("task.name",
                       "must be one of addition, multiplication, arithmetic, jsonl, math");
  }
  return absl::OkStatus();
}

absl::Status read_algorithm(const Fields& top, AlgorithmConfig* a) {
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("algorithm"));
  FP8RL_RETURN_IF_ERROR(f.allow_only({"steps",
                                      "prompts_per_step",
                                      "samples_per_prompt",
                                      "max_new_tokens",
                                      "temperature",
                                      "top_p",
                                      "seed",
                                      "learning_rate",
                                      "warmup_steps",
                                      "weight_decay",
                                      "max_grad_norm",
                                      "minibatches",
                                      "epochs",
                                      "clip_eps",
                                      "kl_beta",
                                      "is",
                                      "adam_beta1",
                                      "adam_beta2",
                                      "adam_epsilon",
                                      "max_staleness",
                                      "routing_replay",
                                      "router_aux_loss_coef"}));
  FP8RL_RETURN_IF_ERROR(f.get_int("steps", &a->steps));
  FP8RL_RETURN_IF_ERROR(f.get_int("prompts_per_step", &a->prompts_per_step));
  FP8RL_RETURN_IF_ERROR(f.get_int("samples_per_prompt", &a->samples_per_prompt));
  FP8RL_RETURN_IF_ERROR(f.get_int("max_new_tokens", &a->max_new_tokens));
  FP8RL_RETURN_IF_ERROR(f.get_double("temperature", &a->temperature));
  FP8RL_RETURN_IF_ERROR(f.get_double("top_p", &a->top_p));
  FP8RL_RETURN_IF_ERROR(f.get_seed("seed", &a->seed));
  FP8RL_RETURN_IF_ERROR(f.get_double("learning_rate", &a->learning_rate));
  FP8RL_RETURN_IF_ERROR(f.get_int("warmup_steps", &a->warmup_steps));
  FP8RL_RETURN_IF_ERROR(f.get_double("weight_decay", &a->weight_decay));
  FP8RL_RETURN_IF_ERROR(f.get_double("max_grad_norm", &a->max_grad_norm));
  FP8RL_RETURN_IF_ERROR(f.get_int("minibatches", &a->minibatches));
  FP8RL_RETURN_IF_ERROR(f.get_int("epochs", &a->epochs));
  FP8RL_RETURN_IF_ERROR(f.get_double("clip_eps", &a->clip_eps));
  FP8RL_RETURN_IF_ERROR(f.get_double("kl_beta", &a->kl_beta));
  FP8RL_RETURN_IF_ERROR(f.get_double("adam_beta1", &a->adam_beta1));
  FP8RL_RETURN_IF_ERROR(f.get_double("adam_beta2", &a->adam_beta2));
  FP8RL_RETURN_IF_ERROR(f.get_double("adam_epsilon", &a->adam_epsilon));
  FP8RL_RETURN_IF_ERROR(f.get_int("max_staleness", &a->max_staleness));
  FP8RL_RETURN_IF_ERROR(f.get_bool("routing_replay", &a->routing_replay));
  FP8RL_RETURN_IF_ERROR(f.get_double("router_aux_loss_coef", &a->router_aux_loss_coef));
  FP8RL_ASSIGN_OR_RETURN_FIELDS(is, f.get_object("is"));
  FP8RL_RETURN_IF_ERROR(is.allow_only({"rule", "cap", "lo", "hi"}));
  std::string rule(is_rule_name(a->is.rule));
  FP8RL_RETURN_IF_ERROR(is.get_string("rule", &rule));
  absl::StatusOr<IsRule> parsed = parse_is_rule(rule);
  if (!parsed.ok()) return field_error("algorithm.is.rule", std::string(parsed.status().message()));
  // Bounds not given take the rule's defaults (seq_mask_tis has its own); a given 0 stays 0.
  a->is = default_is_config(*parsed);
  FP8RL_RETURN_IF_ERROR(is.get_double("cap", &a->is.cap));
  FP8RL_RETURN_IF_ERROR(is.get_double("lo", &a->is.lo));
  FP8RL_RETURN_IF_ERROR(is.get_double("hi", &a->is.hi));
  return absl::OkStatus();
}

absl::Status read_sft(const Fields& top, std::optional<SftConfig>* sft) {
  if (!top.has("sft")) return absl::OkStatus();
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("sft"));
  FP8RL_RETURN_IF_ERROR(f.allow_only({"steps", "learning_rate", "batch_size"}));
  SftConfig s;
  FP8RL_RETURN_IF_ERROR(f.get_int("steps", &s.steps));
  FP8RL_RETURN_IF_ERROR(f.get_double("learning_rate", &s.learning_rate));
  FP8RL_RETURN_IF_ERROR(f.get_int("batch_size", &s.batch_size));
  *sft = s;
  return absl::OkStatus();
}

absl::Status read_precision(const Fields& top, PrecisionConfig* p) {
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("precision"));
  FP8RL_RETURN_IF_ERROR(f.allow_only({"generation", "training", "kv_cache", "pow2_scales",
                                      "bf16_first_layers", "bf16_last_layers"}));
  FP8RL_RETURN_IF_ERROR(f.get_precision("generation", &p->generation));
  FP8RL_RETURN_IF_ERROR(f.get_precision("training", &p->training));
  FP8RL_RETURN_IF_ERROR(f.get_precision("kv_cache", &p->kv_cache));
  FP8RL_RETURN_IF_ERROR(f.get_bool("pow2_scales", &p->pow2_scales));
  FP8RL_RETURN_IF_ERROR(f.get_int("bf16_first_layers", &p->bf16_first_layers));
  return f.get_int("bf16_last_layers", &p->bf16_last_layers);
}

absl::Status read_validation(const Fields& top, ValidationConfig* v) {
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("validation"));
  FP8RL_RETURN_IF_ERROR(f.allow_only({"every_steps", "num_prompts"}));
  FP8RL_RETURN_IF_ERROR(f.get_int("every_steps", &v->every_steps));
  return f.get_int("num_prompts", &v->num_prompts);
}

absl::Status read_checkpoint(const Fields& top, CheckpointConfig* c) {
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("checkpoint"));
  FP8RL_RETURN_IF_ERROR(f.allow_only({"every_steps", "dir"}));
  FP8RL_RETURN_IF_ERROR(f.get_int("every_steps", &c->every_steps));
  return f.get_string("dir", &c->dir);
}

absl::Status read_trainer(const Fields& top, TrainerConfig* t) {
  FP8RL_ASSIGN_OR_RETURN_FIELDS(f, top.get_object("trainer"));
  FP8RL_RETURN_IF_ERROR(f.allow_only({"data_parallel", "shard"}));
  FP8RL_RETURN_IF_ERROR(f.get_int("data_parallel", &t->data_parallel));
  return f.get_string("shard", &t->shard);
}

// Value checks: `ok` false -> "<path>: <message>".
absl::Status require(bool ok, std::string_view path, std::string_view message) {
  return ok ? absl::OkStatus() : field_error(std::string(path), std::string(message));
}

}  // namespace

absl::Status validate_job_config(const JobConfig& c) {
  // model
  if (c.model.checkpoint.empty()) {
    const bool has_path = !c.model.init_config_path.empty();
    const bool has_inline = !c.model.init_config_inline.is_null();
    if (has_path == has_inline) {
      return field_error("model.init.config", "exactly one of a path or an inline mapping");
    }
    if (has_inline && !c.model.init_config_inline.is_object()) {
      return field_error("model.init.config", "an inline config must be a mapping");
    }
  }
  // task
  FP8RL_RETURN_IF_ERROR(validate_task_config(c.task));
  // algorithm
  const AlgorithmConfig& a = c.algorithm;
  FP8RL_RETURN_IF_ERROR(require(a.steps >= 1, "algorithm.steps", "must be >= 1"));
  FP8RL_RETURN_IF_ERROR(
      require(a.prompts_per_step >= 1, "algorithm.prompts_per_step", "must be >= 1"));
  FP8RL_RETURN_IF_ERROR(
      require(a.samples_per_prompt >= 2, "algorithm.samples_per_prompt", "must be >= 2"));
  FP8RL_RETURN_IF_ERROR(require(a.max_new_tokens >= 1 && a.max_new_tokens <= 4096,
                                "algorithm.max_new_tokens", "must be in [1, 4096]"));
  FP8RL_RETURN_IF_ERROR(require(a.temperature > 0.0 && std::isfinite(a.temperature),
                                "algorithm.temperature", "must be > 0"));
  FP8RL_RETURN_IF_ERROR(
      require(a.top_p > 0.0 && a.top_p <= 1.0, "algorithm.top_p", "must be in (0, 1]"));
  FP8RL_RETURN_IF_ERROR(require(a.learning_rate > 0.0 && std::isfinite(a.learning_rate),
                                "algorithm.learning_rate", "must be > 0"));
  FP8RL_RETURN_IF_ERROR(require(a.warmup_steps >= 0, "algorithm.warmup_steps", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(require(a.weight_decay >= 0.0 && std::isfinite(a.weight_decay),
                                "algorithm.weight_decay", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(require(a.max_grad_norm >= 0.0 && std::isfinite(a.max_grad_norm),
                                "algorithm.max_grad_norm", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(require(a.minibatches >= 1, "algorithm.minibatches", "must be >= 1"));
  FP8RL_RETURN_IF_ERROR(require(
      a.minibatches <= a.batch_size(), "algorithm.minibatches",
      absl::StrCat("must be <= prompts_per_step * samples_per_prompt (", a.batch_size(), ")")));
  FP8RL_RETURN_IF_ERROR(require(a.epochs >= 1, "algorithm.epochs", "must be >= 1"));
  FP8RL_RETURN_IF_ERROR(require(a.epochs <= 64, "algorithm.epochs", "must be <= 64"));
  FP8RL_RETURN_IF_ERROR(
      require(a.clip_eps > 0.0 && a.clip_eps < 1.0, "algorithm.clip_eps", "must be in (0, 1)"));
  FP8RL_RETURN_IF_ERROR(
      require(a.kl_beta >= 0.0 && std::isfinite(a.kl_beta), "algorithm.kl_beta", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(validate_is_config(a.is, "algorithm.is"));
  FP8RL_RETURN_IF_ERROR(
      require(a.router_aux_loss_coef >= 0.0 && std::isfinite(a.router_aux_loss_coef),
              "algorithm.router_aux_loss_coef", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(require(a.adam_beta1 >= 0.0 && a.adam_beta1 < 1.0, "algorithm.adam_beta1",
                                "must be in [0, 1)"));
  FP8RL_RETURN_IF_ERROR(require(a.adam_beta2 >= 0.0 && a.adam_beta2 < 1.0, "algorithm.adam_beta2",
                                "must be in [0, 1)"));
  FP8RL_RETURN_IF_ERROR(require(a.adam_epsilon > 0.0 && std::isfinite(a.adam_epsilon),
                                "algorithm.adam_epsilon", "must be > 0"));
  // Each step of staleness keeps one more step's rollout in the coordinator's memory.
  FP8RL_RETURN_IF_ERROR(require(a.max_staleness >= 0 && a.max_staleness <= 16,
                                "algorithm.max_staleness", "must be in [0, 16]"));
  // sft
  if (c.sft.has_value()) {
    FP8RL_RETURN_IF_ERROR(require(c.sft->steps >= 1, "sft.steps", "must be >= 1"));
    FP8RL_RETURN_IF_ERROR(require(c.sft->learning_rate > 0.0 && std::isfinite(c.sft->learning_rate),
                                  "sft.learning_rate", "must be > 0"));
    FP8RL_RETURN_IF_ERROR(require(c.sft->batch_size >= 1, "sft.batch_size", "must be >= 1"));
  }
  // precision
  FP8RL_RETURN_IF_ERROR(
      require(c.precision.bf16_first_layers >= 0, "precision.bf16_first_layers", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(
      require(c.precision.bf16_last_layers >= 0, "precision.bf16_last_layers", "must be >= 0"));
  // validation
  FP8RL_RETURN_IF_ERROR(
      require(c.validation.every_steps >= 0, "validation.every_steps", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(
      require(c.validation.num_prompts >= 0, "validation.num_prompts", "must be >= 0"));
  if (c.task.name != "jsonl" && c.task.name != "math") {
    FP8RL_RETURN_IF_ERROR(
        require(c.validation.num_prompts <= c.task.val_size, "validation.num_prompts",
                absl::StrCat("must be <= task.val_size (", c.task.val_size, ")")));
  }
  // checkpoint
  FP8RL_RETURN_IF_ERROR(
      require(c.checkpoint.every_steps >= 0, "checkpoint.every_steps", "must be >= 0"));
  FP8RL_RETURN_IF_ERROR(require(c.checkpoint.every_steps == 0 || !c.checkpoint.dir.empty(),
                                "checkpoint.dir", "required when checkpoint.every_steps > 0"));
  // trainer
  FP8RL_RETURN_IF_ERROR(require(c.trainer.data_parallel >= 1 && c.trainer.data_parallel <= 64,
                                "trainer.data_parallel", "must be in [1, 64]"));
  FP8RL_RETURN_IF_ERROR(require(
      c.trainer.shard == "none" || c.trainer.shard == "grads_optimizer" ||
          c.trainer.shard == "params",
      "trainer.shard",
      absl::StrCat("must be none, grads_optimizer or params, got '", c.trainer.shard, "'")));
  // upper bounds of the numeric fields (rl/job_limits.h)
  return validate_job_limits(c);
}

namespace {

// Reads the old spellings of kRenamedAlgorithmKeys as the new ones: a copy of `json` with the
// keys renamed (or nullopt when it uses none), one warning per old key.
absl::StatusOr<std::optional<Json>> rename_old_keys(const Json& json,
                                                    std::vector<std::string>* warnings) {
  auto algorithm = json.find("algorithm");
  if (algorithm == json.end() || !algorithm->is_object()) return std::nullopt;
  std::optional<Json> renamed;
  for (const RenamedKey& key : kRenamedAlgorithmKeys) {
    if (!algorithm->contains(std::string(key.old_key))) continue;
    const std::string old_path = join_path("algorithm", key.old_key);
    const std::string new_path = join_path("algorithm", key.new_key);
    if (algorithm->contains(std::string(key.new_key))) {
      return field_error(old_path, absl::StrCat("renamed ", new_path, ", which is also given"));
    }
    if (!renamed) renamed = json;
    Json& a = (*renamed)["algorithm"];
    a[std::string(key.new_key)] = a[std::string(key.old_key)];
    a.erase(std::string(key.old_key));
    if (warnings != nullptr) {
      warnings->push_back(
          absl::StrCat(old_path, " is deprecated: read as ", new_path, "; use that name"));
    }
  }
  return renamed;
}

}  // namespace

absl::StatusOr<JobConfig> job_config_from_json(const Json& json,
                                               std::vector<std::string>* warnings) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job config: must be a mapping, got ", json.type_name()));
  }
  absl::StatusOr<std::optional<Json>> renamed = rename_old_keys(json, warnings);
  if (!renamed.ok()) return renamed.status();
  if (renamed->has_value()) return job_config_from_json(**renamed, nullptr);
  const Fields top(json, "");
  FP8RL_RETURN_IF_ERROR(top.allow_only({"name", "model", "task", "algorithm", "sft", "precision",
                                        "validation", "checkpoint", "trainer"}));
  JobConfig c;
  FP8RL_RETURN_IF_ERROR(top.get_string("name", &c.name));
  FP8RL_RETURN_IF_ERROR(read_model(top, &c.model));
  FP8RL_RETURN_IF_ERROR(read_task(top, &c.task));
  FP8RL_RETURN_IF_ERROR(read_algorithm(top, &c.algorithm));
  FP8RL_RETURN_IF_ERROR(read_sft(top, &c.sft));
  FP8RL_RETURN_IF_ERROR(read_precision(top, &c.precision));
  FP8RL_RETURN_IF_ERROR(read_validation(top, &c.validation));
  FP8RL_RETURN_IF_ERROR(read_checkpoint(top, &c.checkpoint));
  FP8RL_RETURN_IF_ERROR(read_trainer(top, &c.trainer));
  FP8RL_RETURN_IF_ERROR(validate_job_config(c));
  return c;
}

absl::StatusOr<JobConfig> job_config_from_json(const nlohmann::json& json,
                                               std::vector<std::string>* warnings) {
  return job_config_from_json(Json::parse(json.dump()), warnings);
}

absl::StatusOr<JobConfig> parse_job_config(std::string_view text,
                                           std::vector<std::string>* warnings) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return absl::InvalidArgumentError("job config: empty");
  if (text[first] == '{') {
    absl::StatusOr<Json> json = parse_json_strict(text, "job config");
    if (!json.ok()) return json.status();
    return job_config_from_json(*json, warnings);
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("job config: YAML syntax error at line ", e.mark.line + 1, ": ", e.msg));
  }
  absl::StatusOr<Json> json = yaml_to_json(root, "");
  if (!json.ok()) return json.status();
  return job_config_from_json(*json, warnings);
}

absl::StatusOr<JobConfig> load_job_config_file(const std::string& path) {
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<JobConfig> config = parse_job_config(*text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

Json job_config_to_json(const JobConfig& c) {
  Json j = Json::object();
  j["name"] = c.name;
  Json model = Json::object();
  if (!c.model.checkpoint.empty()) {
    model["checkpoint"] = c.model.checkpoint;
    if (!c.model.chat_template_kwargs.is_null()) {
      model["chat_template_kwargs"] = c.model.chat_template_kwargs;
    }
  } else {
    Json init = Json::object();
    if (!c.model.init_config_path.empty()) {
      init["config"] = c.model.init_config_path;
    } else {
      init["config"] = c.model.init_config_inline;
    }
    init["seed"] = c.model.init_seed;
    model["init"] = init;
  }
  j["model"] = model;

  const TaskConfig& t = c.task;
  Json params = Json::object();
  if (t.name == "addition" || t.name == "multiplication") {
    params["digits"] = t.digits;
  } else if (t.name == "arithmetic") {
    params["terms"] = t.terms;
    params["max_operand"] = t.max_operand;
  } else if (t.name == "jsonl") {
    params["train_path"] = t.train_path;
    params["val_path"] = t.val_path;
    params["match"] = t.match;
  } else if (t.name == "math") {
    params["train_path"] = t.train_path;
    params["val_path"] = t.val_path;
    params["question_field"] = t.question_field;
    params["answer_field"] = t.answer_field;
    params["answer_format"] = t.answer_format;
    params["extraction"] = t.extraction;
    params["system_prompt"] = t.system_prompt;
    params["instruction"] = t.instruction;
  }
  j["task"] = Json{{"name", t.name},
                   {"seed", t.seed},
                   {"train_size", t.train_size},
                   {"val_size", t.val_size},
                   {"format_reward", t.format_reward},
                   {"params", params}};

  const AlgorithmConfig& a = c.algorithm;
  j["algorithm"] = Json{{"steps", a.steps},
                        {"prompts_per_step", a.prompts_per_step},
                        {"samples_per_prompt", a.samples_per_prompt},
                        {"max_new_tokens", a.max_new_tokens},
                        {"temperature", a.temperature},
                        {"top_p", a.top_p},
                        {"seed", a.seed},
                        {"learning_rate", a.learning_rate},
                        {"warmup_steps", a.warmup_steps},
                        {"weight_decay", a.weight_decay},
                        {"max_grad_norm", a.max_grad_norm},
                        {"minibatches", a.minibatches},
                        {"epochs", a.epochs},
                        {"clip_eps", a.clip_eps},
                        {"kl_beta", a.kl_beta},
                        {"is", Json{{"rule", std::string(is_rule_name(a.is.rule))},
                                    {"cap", a.is.cap},
                                    {"lo", a.is.lo},
                                    {"hi", a.is.hi}}},
                        {"adam_beta1", a.adam_beta1},
                        {"adam_beta2", a.adam_beta2},
                        {"adam_epsilon", a.adam_epsilon},
                        {"max_staleness", a.max_staleness},
                        {"routing_replay", a.routing_replay},
                        {"router_aux_loss_coef", a.router_aux_loss_coef}};
  if (c.sft.has_value()) {
    j["sft"] = Json{{"steps", c.sft->steps},
                    {"learning_rate", c.sft->learning_rate},
                    {"batch_size", c.sft->batch_size}};
  }
  j["precision"] = precision_config_to_json(c.precision);
  j["validation"] =
      Json{{"every_steps", c.validation.every_steps}, {"num_prompts", c.validation.num_prompts}};
  j["checkpoint"] = Json{{"every_steps", c.checkpoint.every_steps}, {"dir", c.checkpoint.dir}};
  j["trainer"] = Json{{"data_parallel", c.trainer.data_parallel}, {"shard", c.trainer.shard}};
  return j;
}

void resolve_paths(JobConfig& config, const std::string& base_dir) {
  auto resolve = [&](std::string& path) {
    if (path.empty()) return;
    std::filesystem::path p(path);
    if (p.is_absolute()) return;
    path = (std::filesystem::path(base_dir) / p).lexically_normal().string();
  };
  resolve(config.model.checkpoint);
  resolve(config.model.init_config_path);
  resolve(config.task.train_path);
  resolve(config.task.val_path);
  resolve(config.checkpoint.dir);
}

double learning_rate_at(const AlgorithmConfig& algorithm, int64_t step) {
  if (algorithm.warmup_steps <= 0 || step >= algorithm.warmup_steps) {
    return algorithm.learning_rate;
  }
  const int64_t s = std::max<int64_t>(step, 1);
  return algorithm.learning_rate * static_cast<double>(s) /
         static_cast<double>(algorithm.warmup_steps);
}

}  // namespace fp8rl::rl
