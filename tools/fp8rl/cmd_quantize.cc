// `fp8rl quantize`: turns a Hugging Face checkpoint into the FP8 block checkpoint of
// docs/design/fp8-recipe.md "FP8 checkpoint format" (E4M3 linear weights + 128x128 `_scale_inv`
// tensors + quantization_config).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_util.h"
#include "common/precision.h"
#include "common/safetensors.h"
#include "kernels/quantize.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"

namespace fp8rl::cli {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr char kName[] = "quantize";
constexpr char kScaleSuffix[] = "_scale_inv";

struct QuantizeOptions {
  std::string model_dir;
  std::string out_dir;
  bool pow2_scales = false;
  int64_t bf16_first_layers = 0;
  int64_t bf16_last_layers = 0;
};

// A Llama/Qwen2 linear weight: model.layers.{i}.self_attn.{q,k,v,o}_proj.weight or
// model.layers.{i}.mlp.{gate,up,down}_proj.weight, or a Qwen3-MoE/Qwen2-MoE expert's
// mlp.experts.{e}.{gate,up,down}_proj.weight / mlp.shared_expert.{gate,up,down}_proj.weight. The
// routers (mlp.gate.weight, mlp.shared_expert_gate.weight) never match: they stay BF16
// (docs/design/model.md "Mixture of experts").
struct LinearWeight {
  int64_t layer = 0;
  std::string module;  // the name without ".weight"
};

std::optional<LinearWeight> match_linear(const std::string& name) {
  static const std::regex kPattern(
      R"(^(model\.layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.|shared_expert\.)?(gate|up|down)_proj))\.weight$)");
  std::smatch m;
  if (!std::regex_match(name, m, kPattern)) return std::nullopt;
  LinearWeight w;
  w.module = m[1].str();
  w.layer = std::stoll(m[2].str());
  return w;
}

// Files beside the weights that are copied unchanged (tokenizer, generation config, ...): every
// regular file except config.json and weight files. Weights in other formats are skipped.
std::vector<std::string> side_files(const std::string& model_dir) {
  static const std::vector<std::string> kWeightExtensions = {
      ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf"};
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(model_dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || name.ends_with(".index.json")) continue;
    bool weights = false;
    for (const auto& ext : kWeightExtensions) weights = weights || name.ends_with(ext);
    if (weights) {
      if (!name.ends_with(".safetensors")) {
        std::fprintf(stderr, "fp8rl quantize: not copying %s (weights in another format)\n",
                     name.c_str());
      }
      continue;
    }
    out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<QuantizeOptions> parse_options(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.value_flags = {"model", "out", "bf16-first-layers", "bf16-last-layers"};
  spec.bool_flags = {"pow2-scales"};
  absl::StatusOr<Args> args = Args::Parse(argv, spec);
  if (!args.ok()) return args.status();
  QuantizeOptions o;
  absl::StatusOr<std::string> model = args->required("model");
  if (!model.ok()) return model.status();
  absl::StatusOr<std::string> out = args->required("out");
  if (!out.ok()) return out.status();
  o.model_dir = *model;
  o.out_dir = *out;
  if (o.model_dir.empty()) return absl::InvalidArgumentError("--model: empty path");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out: empty path");
  o.pow2_scales = args->has("pow2-scales");
  for (const char* flag : {"bf16-first-layers", "bf16-last-layers"}) {
    absl::StatusOr<int64_t> n = args->get_int(flag, 0);
    if (!n.ok()) return n.status();
    if (*n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": must be a non-negative layer count, got ", *n));
    }
    (std::string(flag) == "bf16-first-layers" ? o.bf16_first_layers : o.bf16_last_layers) = *n;
  }
  return o;
}

// --out must not be --model, nor a folder that contains it (replacing it would delete the input).
absl::Status check_paths(const QuantizeOptions& o) {
  std::error_code ec;
  if (!stdfs::exists(o.model_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("--model: folder ", o.model_dir, " does not exist"));
  }
  if (!stdfs::is_directory(o.model_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--model: ", o.model_dir, " is not a folder"));
  }
  // Absolute, normalized, without a trailing separator ("out/" names the folder "out").
  auto normalize = [&ec](const std::string& p) {
    stdfs::path n = stdfs::weakly_canonical(p, ec);
    return n.has_filename() || !n.has_parent_path() ? n : n.parent_path();
  };
  const stdfs::path model = normalize(o.model_dir);
  const stdfs::path out = normalize(o.out_dir);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--out: bad path ", o.out_dir));
  if (model == out) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out: must differ from --model (both are ", model.string(), ")"));
  }
  const std::string model_s = model.string() + "/";
  const std::string out_s = out.string() + "/";
  if (model_s.starts_with(out_s)) {
    return absl::InvalidArgumentError(absl::StrCat("--out: ", o.out_dir,
                                                   " contains the --model folder; replacing it "
                                                   "would delete the input"));
  }
  const stdfs::path parent = out.parent_path();
  if (!parent.empty() && !stdfs::is_directory(parent, ec)) {
    return absl::NotFoundError(
        absl::StrCat("--out: parent folder ", parent.string(), " does not exist"));
  }
  if (stdfs::exists(out, ec) && !stdfs::is_directory(out, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out: ", o.out_dir, " exists and is not a folder"));
  }
  return absl::OkStatus();
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A weight to quantize must be a non-empty 2-D float tensor that is not FP8 already.
absl::Status check_quantizable(const TensorInfo& info) {
  if (info.dtype == DType::kF8E4M3 || !is_float_dtype(info.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name, "': dtype ", std::string(dtype_name(info.dtype)),
                     " cannot be quantized (expected F32, BF16, F16 or F64)"));
  }
  if (info.shape.size() != 2 || info.shape[0] == 0 || info.shape[1] == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name, "': expected a non-empty 2-D weight [N, K], got shape ",
                     shape_string(info.shape)));
  }
  return absl::OkStatus();
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

absl::Status run_quantize(const QuantizeOptions& o) {
  if (absl::Status s = check_paths(o); !s.ok()) return s;
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(o.model_dir);
  if (!ckpt.ok()) return ckpt.status();

  const std::string config_path = (stdfs::path(o.model_dir) / "config.json").string();
  absl::StatusOr<Json> config = parse_json_strict(ckpt->config_json(), config_path);
  if (!config.ok()) return config.status();
  auto layers_it = config->find("num_hidden_layers");
  if (layers_it == config->end() || !layers_it->is_number_integer() ||
      layers_it->get<int64_t>() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": num_hidden_layers missing or not a positive integer"));
  }
  if (config->contains("quantization_config")) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": already has a quantization_config (checkpoint already quantized?)"));
  }
  const int64_t num_layers = layers_it->get<int64_t>();
  for (const auto& [flag, n] : {std::pair{"bf16-first-layers", o.bf16_first_layers},
                                std::pair{"bf16-last-layers", o.bf16_last_layers}}) {
    if (n > num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": ", n, " exceeds num_hidden_layers ", num_layers));
    }
  }
  // The same layer rule the engine runs (common/precision.h): a layer whose linears the FP8
  // policy keeps in bf16 stays unquantized.
  PrecisionPolicy policy;
  policy.linear = Precision::kFP8;
  policy.bf16_first_layers = o.bf16_first_layers;
  policy.bf16_last_layers = o.bf16_last_layers;
  auto keep_layer = [&](int64_t layer) {
    return policy.layer_linear(layer, num_layers) != Precision::kFP8;
  };

  const std::vector<std::string> names = ckpt->names();
  // Check every weight to quantize before the (slow) work starts, so bad input fails at once.
  int64_t to_quantize = 0;
  for (const std::string& name : names) {
    const std::optional<LinearWeight> linear = match_linear(name);
    if (!linear) continue;
    if (linear->layer >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': layer ", linear->layer,
                                                     " but config.json num_hidden_layers is ",
                                                     num_layers));
    }
    if (keep_layer(linear->layer)) continue;
    absl::StatusOr<TensorInfo> info = ckpt->info(name);
    if (!info.ok()) return info.status();
    if (absl::Status s = check_quantizable(*info); !s.ok()) return s;
    if (ckpt->has(name + kScaleSuffix)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, kScaleSuffix,
                                                     "' already exists (checkpoint already "
                                                     "quantized?)"));
    }
    ++to_quantize;
  }
  if (to_quantize == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.model_dir,
                     ": no linear weight to quantize (expected Llama/Qwen2 names such as "
                     "model.layers.0.mlp.up_proj.weight, outside the layers kept unquantized)"));
  }

  SafetensorsWriter writer;
  std::vector<std::string> kept_modules;
  int64_t quantized = 0;
  int64_t copied = 0;
  int64_t input_bytes = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    absl::StatusOr<TensorInfo> info = ckpt->info(name);
    if (!info.ok()) return info.status();
    input_bytes += info->nbytes();
    const std::optional<LinearWeight> linear = match_linear(name);
    if (!linear || keep_layer(linear->layer)) {
      absl::StatusOr<std::vector<uint8_t>> bytes = ckpt->raw(name);
      if (!bytes.ok()) return bytes.status();
      if (absl::Status s = writer.add(name, info->dtype, info->shape, std::move(*bytes)); !s.ok()) {
        return s;
      }
      if (linear) kept_modules.push_back(linear->module);
      ++copied;
      std::printf("[%zu/%zu] %s: %s %s %s\n", i + 1, names.size(), name.c_str(),
                  std::string(dtype_name(info->dtype)).c_str(), shape_string(info->shape).c_str(),
                  linear ? "(kept unquantized)" : "(copied)");
      continue;
    }

    absl::StatusOr<std::vector<float>> w = ckpt->read_f32(name);
    if (!w.ok()) return w.status();
    for (size_t k = 0; k < w->size(); ++k) {
      if (!std::isfinite((*w)[k])) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "': non-finite value ", (*w)[k], " at flat index ", k));
      }
    }
    const int64_t rows = info->shape[0];
    const int64_t cols = info->shape[1];
    kernels::Fp8Matrix q =
        kernels::quantize(w->data(), rows, cols, kernels::ScalingMode::kBlock128x128,
                          kernels::QuantOptions{.pow2_scales = o.pow2_scales});
    const std::vector<int64_t> scale_shape = {q.scale_rows(), q.scale_cols()};
    if (absl::Status s = writer.add(name, DType::kF8E4M3, info->shape, std::move(q.data));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = writer.add_f32(name + kScaleSuffix, scale_shape, q.scale_inv); !s.ok()) {
      return s;
    }
    ++quantized;
    std::printf("[%zu/%zu] %s: %s %s -> F8_E4M3 + %s%s F32 %s\n", i + 1, names.size(), name.c_str(),
                std::string(dtype_name(info->dtype)).c_str(), shape_string(info->shape).c_str(),
                name.c_str(), kScaleSuffix, shape_string(scale_shape).c_str());
  }
  Json qc = Json::object();
  qc["quant_method"] = "fp8";
  qc["fmt"] = "e4m3";
  qc["activation_scheme"] = "dynamic";
  qc["weight_block_size"] = {kernels::kBlock, kernels::kBlock};
  if (!kept_modules.empty()) {
    // Hugging Face reads modules_to_not_convert; vLLM's fp8 config reads ignored_layers.
    qc["modules_to_not_convert"] = kept_modules;
    qc["ignored_layers"] = kept_modules;
  }
  (*config)["quantization_config"] = std::move(qc);
  const std::string config_text = config->dump(2) + "\n";

  if (absl::Status s = write_checkpoint(o.out_dir, config_text, writer, side_files(o.model_dir));
      !s.ok()) {
    return s;
  }
  std::printf(
      "fp8rl quantize: %lld linear weights -> F8_E4M3 (128x128 blocks%s), %zu kept "
      "unquantized, %lld other tensors copied; wrote %s (%.1f MiB, input %.1f MiB)\n",
      static_cast<long long>(quantized), o.pow2_scales ? ", pow2 scales" : "", kept_modules.size(),
      static_cast<long long>(copied) - static_cast<long long>(kept_modules.size()),
      o.out_dir.c_str(), mib(writer.data_bytes()), mib(input_bytes));
  return absl::OkStatus();
}

}  // namespace

int quantize_main(const std::vector<std::string>& argv) {
  absl::StatusOr<QuantizeOptions> options = parse_options(argv);
  if (!options.ok()) return usage_error(kName, std::string(options.status().message()));
  if (absl::Status s = run_quantize(*options); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  return 0;
}

}  // namespace fp8rl::cli
