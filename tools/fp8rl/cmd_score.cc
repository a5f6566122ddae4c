// `fp8rl score`: per-token logprobs of token sequences under a checkpoint, through the same
// training forward the trainer uses (so users can check generation logprobs against it).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "engine/cpu/train_ops.h"
#include "model/inference_backend.h"
#include "model/model.h"
#include "model/token_jsonl.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"
#include "tools/fp8rl/device_flags.h"

namespace fp8rl::cli {
namespace {

constexpr char kName[] = "score";
constexpr int64_t kBatchTokens = 4096;  // tokens per training forward

}  // namespace

int score_main(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.value_flags = {"model",
                      "precision",
                      "in",
                      "out",
                      "temperature",
                      "kv-cache",
                      "bf16-first-layers",
                      "bf16-last-layers",
                      "device",
                      "gpu-memory-fraction"};
  spec.bool_flags = {"pow2-scales", "no-kv-fake-quant"};
  auto args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  std::string flag_values[4];
  const char* required[4] = {"model", "precision", "in", "out"};
  for (int i = 0; i < 4; ++i) {
    auto v = args->required(required[i]);
    if (!v.ok()) return usage_error(kName, std::string(v.status().message()));
    flag_values[i] = *v;
  }
  const std::string &model_dir = flag_values[0], &in = flag_values[2], &out = flag_values[3];
  model::PrecisionPolicy policy;
  auto precision = model::parse_precision(flag_values[1]);
  if (!precision.ok()) {
    return usage_error(kName, absl::StrCat("--precision: ", precision.status().message()));
  }
  policy.linear = *precision;
  auto kv = model::parse_kv_cache_dtype(args->get("kv-cache").value_or("fp32"));
  if (!kv.ok()) return usage_error(kName, absl::StrCat("--kv-cache: ", kv.status().message()));
  policy.kv_cache = *kv;
  auto first = args->get_int("bf16-first-layers", 0);
  auto last = args->get_int("bf16-last-layers", 0);
  if (!first.ok()) return usage_error(kName, std::string(first.status().message()));
  if (!last.ok()) return usage_error(kName, std::string(last.status().message()));
  if (*first < 0 || *last < 0) return usage_error(kName, "--bf16-first/last-layers: must be >= 0");
  policy.bf16_first_layers = *first;
  policy.bf16_last_layers = *last;
  policy.pow2_scales = args->has("pow2-scales");
  policy.train_kv_fake_quant = !args->has("no-kv-fake-quant");
  auto temperature = args->get_double("temperature", 1.0);
  if (!temperature.ok()) return usage_error(kName, std::string(temperature.status().message()));
  if (!(*temperature > 0)) return usage_error(kName, "--temperature: must be > 0");

  // cuda: the CUDA inference backend's score() (model/inference_backend.h), offered only when this
  // build has one.
  absl::StatusOr<CliDevice> device = resolve_device_flags(
      *args, kName,
      command_probe(model::cuda_backend_available() ? std::string()
                                                    : model::cuda_backend_unavailable_reason()));
  if (!device.ok()) return failure(kName, std::string(device.status().message()));
  auto lines = model::read_token_jsonl(in, "tokens");
  if (!lines.ok()) return failure(kName, std::string(lines.status().message()));
  auto m = model::Model::Load(model_dir, policy);
  if (!m.ok()) return failure(kName, std::string(m.status().message()));
  for (size_t i = 0; i < lines->rows.size(); ++i) {
    const std::string where = absl::StrCat(in, ":", lines->line[i]);
    if (lines->rows[i].empty()) return failure(kName, where + ": tokens: must not be empty");
    if (auto s = (*m)->check_tokens(lines->rows[i]); !s.ok()) {
      return failure(kName, absl::StrCat(where, ": tokens: ", s.message()));
    }
  }
  std::unique_ptr<model::InferenceBackend> backend;
  if (device->selection.device == model::Device::kCuda) {
    model::BackendOptions options;
    options.memory_budget_bytes = device->gpu_memory_budget_bytes;
    options.max_step_tokens = kBatchTokens;
    for (const auto& row : lines->rows) {
      options.max_step_tokens = std::max(options.max_step_tokens, static_cast<int64_t>(row.size()));
    }
    auto made =
        model::make_cuda_backend(std::shared_ptr<const model::Model>(std::move(*m)), options);
    if (!made.ok()) return failure(kName, std::string(made.status().message()));
    backend = std::move(*made);
  }
  std::string text;
  for (size_t b = 0; b < lines->rows.size();) {
    model::TokenBatch batch;
    int64_t tokens = 0;
    while (
        b < lines->rows.size() &&
        (batch.empty() || tokens + static_cast<int64_t>(lines->rows[b].size()) <= kBatchTokens)) {
      tokens += static_cast<int64_t>(lines->rows[b].size());
      batch.push_back(lines->rows[b++]);
    }
    auto lp =
        backend != nullptr
            ? backend->score(batch, static_cast<float>(*temperature))
            : engine::cpu_logprobs(**m, batch, {.temperature = static_cast<float>(*temperature)});
    if (!lp.ok()) return failure(kName, std::string(lp.status().message()));
    for (const auto& row : *lp) {
      nlohmann::json j;
      j["logprobs"] = nlohmann::json::array();
      for (float v : row) j["logprobs"].push_back(static_cast<double>(v));
      text += j.dump() + "\n";
    }
  }
  if (auto s = write_file_atomic(out, text); !s.ok())
    return failure(kName, std::string(s.message()));
  return 0;
}

}  // namespace fp8rl::cli
