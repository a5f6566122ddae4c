// `fp8rl init`: a randomly initialised checkpoint in Hugging Face layout from a config.json, so
// jobs and tests can start from a model without downloading one.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "model/config.h"
#include "model/model.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"

namespace fp8rl::cli {
namespace {

constexpr char kName[] = "init";

}  // namespace

int init_main(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.value_flags = {"config", "out", "seed", "init-std", "dtype"};
  auto args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  auto config_path = args->required("config");
  if (!config_path.ok()) return usage_error(kName, std::string(config_path.status().message()));
  auto out = args->required("out");
  if (!out.ok()) return usage_error(kName, std::string(out.status().message()));
  auto seed = args->get_int("seed", 0);
  if (!seed.ok()) return usage_error(kName, std::string(seed.status().message()));
  if (*seed < 0) return usage_error(kName, "--seed: must be >= 0");
  auto init_std = args->get_double("init-std", 0.02);
  if (!init_std.ok()) return usage_error(kName, std::string(init_std.status().message()));
  auto format = model::parse_weight_format(args->get("dtype").value_or("f32"));
  if (!format.ok() || *format == model::WeightFormat::kFP8) {
    return usage_error(kName, "--dtype: expected f32 or bf16 (use `fp8rl quantize` for fp8)");
  }
  auto text = read_text_file(*config_path);
  if (!text.ok()) return failure(kName, std::string(text.status().message()));
  auto config = model::parse_model_config(*text);
  if (!config.ok()) {
    return failure(kName, absl::StrCat(*config_path, ": ", config.status().message()));
  }
  auto m =
      model::Model::Init(*config, {}, static_cast<uint64_t>(*seed), static_cast<float>(*init_std));
  if (!m.ok()) return failure(kName, std::string(m.status().message()));
  if (auto s = (*m)->save(*out, *format); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  std::printf("wrote %s (%ld parameters)\n", out->c_str(), static_cast<long>((*m)->num_params()));
  return 0;
}

}  // namespace fp8rl::cli
