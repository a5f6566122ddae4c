// `fp8rl generate`: batched sampling from a checkpoint with the KV-cache engine the generation
// worker uses, printing the generated tokens and the logprob each was sampled with.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "model/inference_backend.h"
#include "model/model.h"
#include "model/step_generator.h"
#include "model/token_jsonl.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"
#include "tools/fp8rl/device_flags.h"

namespace fp8rl::cli {
namespace {

constexpr char kName[] = "generate";
constexpr int64_t kStepTokens = 2048;  // rows per forward, at least the longest prompt

// Runs every prompt through `gen` (model::BackendGenerator over the chosen device's backend) and
// stores the results in prompt order. A prompt is admitted when the generator has room:
// a backend's KV pool answers ResourceExhausted while its blocks are taken, and the prompt waits
// for running samples to finish; a prompt that does not fit an idle generator is an error naming
// its line. Sample i uses random stream i, as before, so the tokens do not depend on admission.
template <typename Gen, typename Lines>
absl::Status generate_all(Gen& gen, const Lines& lines, const model::SamplingParams& sp,
                          const std::string& in, std::vector<model::GenerationResult>* results) {
  results->assign(lines.rows.size(), model::GenerationResult{});
  std::unordered_map<int64_t, size_t> index_of;
  size_t next = 0;
  while (true) {
    while (next < lines.rows.size()) {
      absl::StatusOr<int64_t> id = gen.add(lines.rows[next], sp, next);
      if (!id.ok()) {
        if (id.status().code() == absl::StatusCode::kResourceExhausted && !gen.idle()) break;
        return absl::Status(id.status().code(),
                            absl::StrCat(in, ":", lines.line[next], ": ", id.status().message()));
      }
      index_of[*id] = next++;
    }
    for (auto& r : gen.take_finished()) (*results)[index_of.at(r.id)] = std::move(r);
    if (gen.idle() && next == lines.rows.size()) return absl::OkStatus();
    if (gen.idle()) continue;  // room again: admit the next prompts
    if (absl::Status s = gen.step(); !s.ok()) return s;
  }
}

}  // namespace

int generate_main(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.value_flags = {"model",
                      "precision",
                      "in",
                      "out",
                      "max-new-tokens",
                      "temperature",
                      "top-p",
                      "top-k",
                      "seed",
                      "kv-cache",
                      "stop-token",
                      "bf16-first-layers",
                      "bf16-last-layers",
                      "device",
                      "gpu-memory-fraction"};
  spec.bool_flags = {"pow2-scales"};
  auto args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  std::string v[5];
  const char* required[5] = {"model", "precision", "in", "out", "max-new-tokens"};
  for (int i = 0; i < 5; ++i) {
    auto r = args->required(required[i]);
    if (!r.ok()) return usage_error(kName, std::string(r.status().message()));
    v[i] = *r;
  }
  model::PrecisionPolicy policy;
  auto precision = model::parse_precision(v[1]);
  if (!precision.ok()) {
    return usage_error(kName, absl::StrCat("--precision: ", precision.status().message()));
  }
  policy.linear = *precision;
  auto kv = model::parse_kv_cache_dtype(args->get("kv-cache").value_or("fp32"));
  if (!kv.ok()) return usage_error(kName, absl::StrCat("--kv-cache: ", kv.status().message()));
  policy.kv_cache = *kv;
  policy.pow2_scales = args->has("pow2-scales");
  model::SamplingParams sp;
  auto max_new = args->get_int("max-new-tokens", 0);
  auto first = args->get_int("bf16-first-layers", 0);
  auto last = args->get_int("bf16-last-layers", 0);
  auto temperature = args->get_double("temperature", 1.0);
  auto top_p = args->get_double("top-p", 1.0);
  auto top_k = args->get_int("top-k", 0);
  auto seed = args->get_int("seed", 0);
  for (const absl::Status& s :
       {max_new.status(), first.status(), last.status(), temperature.status(), top_p.status(),
        top_k.status(), seed.status()}) {
    if (!s.ok()) return usage_error(kName, std::string(s.message()));
  }
  if (*max_new < 1) return usage_error(kName, "--max-new-tokens: must be >= 1");
  if (*first < 0 || *last < 0) return usage_error(kName, "--bf16-first/last-layers: must be >= 0");
  if (*seed < 0) return usage_error(kName, "--seed: must be >= 0");
  policy.bf16_first_layers = *first;
  policy.bf16_last_layers = *last;
  sp.max_new_tokens = *max_new;
  sp.temperature = static_cast<float>(*temperature);
  sp.top_p = static_cast<float>(*top_p);
  sp.top_k = *top_k;
  sp.seed = static_cast<uint64_t>(*seed);
  for (const std::string& s : args->get_all("stop-token")) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(s, &id)) {
      return usage_error(kName, absl::StrCat("--stop-token: expected an integer, got '", s, "'"));
    }
    sp.stop_tokens.push_back(id);
  }
  // cuda: offered only when this build has the CUDA inference backend.
  absl::StatusOr<CliDevice> device = resolve_device_flags(
      *args, kName,
      command_probe(model::cuda_backend_available() ? std::string()
                                                    : model::cuda_backend_unavailable_reason()));
  if (!device.ok()) return failure(kName, std::string(device.status().message()));
  auto lines = model::read_token_jsonl(v[2], "prompt_tokens");
  if (!lines.ok()) return failure(kName, std::string(lines.status().message()));
  auto loaded = model::Model::Load(v[0], policy);
  if (!loaded.ok()) return failure(kName, std::string(loaded.status().message()));
  std::shared_ptr<const model::Model> m = std::move(*loaded);
  if (auto s = model::validate_sampling_params(sp, m->config().vocab_size); !s.ok()) {
    return usage_error(kName, absl::StrCat("--", s.message()));
  }
  // model::BackendGenerator over the device's inference backend (the generation worker's loop):
  // on the CPU the decoder engine's step over its CPU ops (engine/cpu/cpu_backend.cc), whose
  // logprobs are the training forward's (decoder_step_test SamplerLearnerTest).
  model::BackendOptions options;
  options.max_step_tokens = kStepTokens;
  for (const auto& row : lines->rows) {
    options.max_step_tokens = std::max(options.max_step_tokens, static_cast<int64_t>(row.size()));
  }
  absl::StatusOr<std::unique_ptr<model::InferenceBackend>> made;
  if (device->selection.device == model::Device::kCuda) {
    options.memory_budget_bytes = device->gpu_memory_budget_bytes;
    made = model::make_cuda_backend(m, options);
  } else {
    made = model::make_cpu_backend(m, options);
  }
  if (!made.ok()) return failure(kName, std::string(made.status().message()));
  model::BackendGenerator gen(std::move(*made), options.max_step_tokens);
  std::vector<model::GenerationResult> results;
  const absl::Status generated = generate_all(gen, *lines, sp, v[2], &results);
  if (!generated.ok()) return failure(kName, std::string(generated.message()));
  std::string text;
  for (const auto& r : results) {
    nlohmann::json j;
    j["prompt_tokens"] = r.prompt;
    j["tokens"] = r.tokens;
    j["logprobs"] = nlohmann::json::array();
    for (float lp : r.logprobs) j["logprobs"].push_back(static_cast<double>(lp));
    text += j.dump() + "\n";
  }
  if (auto s = write_file_atomic(v[3], text); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  return 0;
}

}  // namespace fp8rl::cli
