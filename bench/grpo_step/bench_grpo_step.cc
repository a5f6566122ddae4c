// fp8rl-bench-grpo-step: whole GRPO steps in one process (train/grpo_step.h: generate P x G
// samples, score, train, publish) on random weights, in BF16, FP8 linears, and FP8 linears + FP8
// KV cache, with the per-phase times and each precision's whole-step ratio to BF16 from the same
// run. The reward is synthetic (the share of even token ids in a completion): the benchmark
// measures time, not learning.
//
//   fp8rl-bench-grpo-step [--shape tiny|llama-3.2-1b|qwen2.5-1.5b] [--device cpu|cuda]
//                         [--prompts 4] [--samples 4] [--prompt-tokens 32] [--new-tokens 64]
//                         [--steps 2] [--time-cap-seconds 120] [--gpu-memory-fraction 0.9]
//                         [--recompute none|layers] [--setup-only] [--layers N]
// Each precision runs one warm-up step (not reported) and then --steps steps, at least one and
// fewer when the time cap is reached (the table says how many ran); a precision reached past the
// cap is not set up. Each row is printed as its precision ends. The random fp32 master is drawn
// once and every precision's policy model is built from it (Model::FromWeightSet); "setup s" is the
// time from that build to the first published version (learner, backend, first export and install).
// --setup-only: times the host side of that setup (the random master once, then each precision's
// host model) and stops, without a backend or a step (docs/perf.md "GRPO step in one process").
// --layers N: the shape with N decoder layers instead of its own count (to time the setup of a
// large shape on a machine that cannot hold it whole).
// Exit: 0 done; 1 an error; 3 the device cannot train (cuda in a build without the CUDA training
// backend: the reason is printed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "model/config.h"
#include "model/device.h"
#include "model/rng.h"
#include "train/grpo_step.h"
#include "train/learner.h"

namespace {

using namespace fp8rl;  // NOLINT: benchmark main file
using Clock = std::chrono::steady_clock;

struct Options {
  std::string shape = "tiny";
  std::string device = "cpu";
  int64_t prompts = 4, samples = 4, prompt_tokens = 32, new_tokens = 64, steps = 2;
  double time_cap_seconds = 120, gpu_memory_fraction = 0.9;
  train::Recompute recompute = train::Recompute::kNone;
  bool setup_only = false;
  int64_t layers = 0;  // 0: the shape's own
};

// Llama-3.2-1B (meta-llama/Llama-3.2-1B config.json), Qwen2.5-1.5B (Qwen/Qwen2.5-1.5B), or a
// tiny Llama that runs on 2 CPU cores.
absl::StatusOr<model::ModelConfig> shape_config(const std::string& shape, int64_t positions) {
  model::ModelConfig c;
  c.rms_norm_eps = 1e-5;
  if (shape == "llama-3.2-1b") {
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.tie_word_embeddings = true;
    c.rope_theta = 500000.0;
    c.rope_scaling.rope_type = "llama3";
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
  } else if (shape == "qwen2.5-1.5b") {
    c.model_type = "qwen2";
    c.vocab_size = 151936;
    c.hidden_size = 1536;
    c.intermediate_size = 8960;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 12;
    c.num_key_value_heads = 2;
    c.head_dim = 128;
    c.tie_word_embeddings = true;
    c.attention_bias = true;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
  } else if (shape == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape: expected tiny, llama-3.2-1b or qwen2.5-1.5b, got '", shape, "'"));
  }
  c.max_position_embeddings = std::max<int64_t>(2048, positions);
  return c;
}

struct Variant {
  const char* name;
  Precision linear, kv;
};
constexpr Variant kVariants[] = {{"bf16", Precision::kBF16, Precision::kBF16},
                                 {"fp8", Precision::kFP8, Precision::kBF16},
                                 {"fp8+kv", Precision::kFP8, Precision::kFP8}};

struct Row {
  std::string name;
  int64_t steps = 0, tokens = 0;
  train::GrpoStepTimes t;    // means over the measured steps
  double setup_seconds = 0;  // policy model, learner and first publish
};

int fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "fp8rl-bench-grpo-step: %s\n", message.c_str());
  return code;
}

bool flag_value(const std::vector<std::string>& args, size_t* i, std::string* out) {
  if (*i + 1 >= args.size()) return false;
  *out = args[++*i];
  return true;
}

int run(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string v;
    auto int_flag = [&](int64_t* out) {
      return flag_value(args, &i, &v) && absl::SimpleAtoi(v, out) && *out >= 1;
    };
    bool ok = true;
    if (a == "--shape") {
      ok = flag_value(args, &i, &o.shape);
    } else if (a == "--device") {
      ok = flag_value(args, &i, &o.device);
    } else if (a == "--prompts") {
      ok = int_flag(&o.prompts);
    } else if (a == "--samples") {
      ok = int_flag(&o.samples) && o.samples >= 2;
    } else if (a == "--prompt-tokens") {
      ok = int_flag(&o.prompt_tokens);
    } else if (a == "--new-tokens") {
      ok = int_flag(&o.new_tokens);
    } else if (a == "--steps") {
      ok = int_flag(&o.steps);
    } else if (a == "--time-cap-seconds") {
      ok = flag_value(args, &i, &v) && absl::SimpleAtod(v, &o.time_cap_seconds) &&
           o.time_cap_seconds > 0;
    } else if (a == "--gpu-memory-fraction") {
      ok = flag_value(args, &i, &v);
      if (ok) {
        absl::StatusOr<double> f = model::parse_gpu_memory_fraction(v);
        if (!f.ok()) return fail(std::string(f.status().message()));
        o.gpu_memory_fraction = *f;
      }
    } else if (a == "--layers") {
      ok = int_flag(&o.layers);
    } else if (a == "--setup-only") {
      o.setup_only = true;
    } else if (a == "--recompute") {
      ok = flag_value(args, &i, &v);
      if (ok) {
        absl::StatusOr<train::Recompute> r = train::parse_recompute(v, "--recompute");
        if (!r.ok()) return fail(std::string(r.status().message()));
        o.recompute = *r;
      }
    } else {
      return fail(absl::StrCat("unknown flag '", a, "'"));
    }
    if (!ok) return fail(absl::StrCat(a, ": missing or bad value"));
  }
  absl::StatusOr<model::Device> device = model::parse_device(o.device);
  if (!device.ok()) return fail(absl::StrCat("--device: ", device.status().message()));
  absl::StatusOr<model::ModelConfig> config =
      shape_config(o.shape, o.prompt_tokens + o.new_tokens + 1);
  if (!config.ok()) return fail(std::string(config.status().message()));
  if (o.layers > 0) config->num_hidden_layers = o.layers;
  setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come, also into a log file

  int64_t budget = 0;
  std::string where = "cpu";
  if (*device == model::Device::kCuda) {
    const model::DeviceProbeResult probe = model::probe_cuda_device();
    if (!probe.device.has_value())
      return fail(absl::StrCat("no sm_90 device (", probe.detail, ")"), 3);
    if (!train::cuda_train_backend_available()) {
      return fail(absl::StrCat("--device cuda: ", train::cuda_train_backend_unavailable_reason()),
                  3);
    }
    budget = model::gpu_memory_budget_bytes(*probe.device, o.gpu_memory_fraction);
    where = probe.device->name;
  }
  // Prompts: random ids (the same for every precision).
  model::Rng rng(17);
  std::vector<std::vector<int32_t>> prompts(o.prompts);
  for (auto& p : prompts) {
    for (int64_t t = 0; t < o.prompt_tokens; ++t) {
      p.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(config->vocab_size)));
    }
  }
  // Four optimizer steps per GRPO step (when there are 4 samples): the largest training forward
  // is a quarter of the batch, which the memory plan budgets for.
  const int64_t samples = o.prompts * o.samples;
  const int64_t minibatches = std::min<int64_t>(4, samples);
  const int64_t step_tokens =
      (samples + minibatches - 1) / minibatches * (o.prompt_tokens + o.new_tokens);
  std::printf(
      "fp8rl-bench-grpo-step: %s shapes (random weights), device %s, P=%lld prompts x G=%lld "
      "samples, %lld prompt + %lld new tokens, %lld minibatches, recompute %s, %lld layers\n",
      o.shape.c_str(), where.c_str(), static_cast<long long>(o.prompts),
      static_cast<long long>(o.samples), static_cast<long long>(o.prompt_tokens),
      static_cast<long long>(o.new_tokens), static_cast<long long>(minibatches),
      std::string(train::recompute_name(o.recompute)).c_str(),
      static_cast<long long>(config->num_hidden_layers));
  const auto bench_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - bench_start).count(); };
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto training_policy = [](const Variant& v) {
    PrecisionConfig p;
    p.training = v.linear;
    p.generation = v.linear;
    p.kv_cache = v.kv;
    return p.training_policy();
  };
  // The random master weights, once for every precision (drawing them is the slow part of a host
  // init: one normal sample per parameter).
  auto init_start = Clock::now();
  absl::StatusOr<model::WeightSet> master;
  {
    absl::StatusOr<std::unique_ptr<model::Model>> m =
        model::Model::Init(*config, training_policy(kVariants[0]), 3);
    if (!m.ok()) return fail(absl::StrCat("init: ", m.status().message()));
    master = (*m)->export_weights(model::WeightFormat::kF32);
    if (!master.ok()) return fail(absl::StrCat("init: ", master.status().message()));
  }
  const double init_seconds = seconds_since(init_start);
  std::printf("host setup: random fp32 master %.3g s (once)\n", init_seconds);
  if (o.setup_only) {
    for (const Variant& variant : kVariants) {
      const auto start = Clock::now();
      absl::StatusOr<std::unique_ptr<model::Model>> m =
          model::Model::FromWeightSet(*master, training_policy(variant));
      if (!m.ok()) return fail(absl::StrCat(variant.name, ": ", m.status().message()));
      const double build = seconds_since(start);
      const double bytes = static_cast<double>((*m)->weight_bytes());
      m->reset();
      std::printf("host setup: %s policy model from the master %.3g s (%.3g GB host weights)\n",
                  variant.name, build, bytes / 1e9);
    }
    std::printf("host setup total (%s): %.3g s\n", o.shape.c_str(), elapsed());
    return 0;
  }
  std::printf(
      "\n| precision | steps | generate s | train logprobs s | train fwd+bwd s | optimizer s | "
      "requant s | calibrate s | export s | install s | step s | step x vs bf16 | "
      "(requant+calibrate)/step | setup s |\n");
  std::printf(
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  // Each variant's row is printed (and flushed) as it ends, so a run stopped by a timeout keeps
  // the rows it finished; bf16 runs first and is the ratio's base.
  double bf16_step = 0;
  auto print_row = [&bf16_step](const Row& r) {
    if (r.steps == 0) {
      std::printf("| %s | 0 (time cap) | | | | | | | | | | | | |\n", r.name.c_str());
      std::fflush(stdout);
      return;
    }
    const double step = r.t.total();
    if (r.name == "bf16") bf16_step = step;
    std::printf(
        "| %s | %lld | %.3g | %.3g | %.3g | %.3g | %.3g | %.3g | %.3g | %.3g | %.3g | %.2f | "
        "%.2f%% | %.3g |\n",
        r.name.c_str(), static_cast<long long>(r.steps), r.t.generate, r.t.logprobs,
        r.t.forward_backward, r.t.optimizer, r.t.requantize, r.t.calibrate, r.t.export_weights,
        r.t.install, step, bf16_step > 0 ? bf16_step / step : 0.0,
        100.0 * (r.t.requantize + r.t.calibrate) / step, r.setup_seconds);
    std::fflush(stdout);
  };
  for (const Variant& variant : kVariants) {
    if (elapsed() > o.time_cap_seconds) {  // past the cap: not even a warm-up
      Row skipped;
      skipped.name = variant.name;
      print_row(skipped);
      continue;
    }
    train::InitRequest init;
    init.job_id = "bench";
    init.model_config_json = model::model_config_to_json(*config);
    init.seed = 3;
    init.precision.training = variant.linear;
    init.precision.generation = variant.linear;
    init.precision.kv_cache = variant.kv;
    init.adamw.lr = 1e-5;
    init.placement.device = *device;
    init.placement.memory_budget_bytes = budget - budget / 4;  // generation takes the rest
    init.placement.recompute = o.recompute;
    init.placement.max_step_tokens = step_tokens;
    init.calibration.emplace_back();
    init.calibration.back().tokens = prompts[0];
    const auto setup_start = Clock::now();
    absl::StatusOr<std::unique_ptr<model::Model>> policy_model =
        model::Model::FromWeightSet(*master, init.precision.training_policy());
    if (!policy_model.ok()) {
      return fail(absl::StrCat(variant.name, ": ", policy_model.status().message()));
    }
    absl::StatusOr<std::unique_ptr<train::Learner>> learner =
        train::Learner::create(init, std::move(*policy_model));
    if (!learner.ok()) return fail(absl::StrCat(variant.name, ": ", learner.status().message()));
    if (variant.linear == Precision::kBF16) {
      std::printf("%s\n", (*learner)->memory_plan().describe().c_str());
    }
    train::GrpoStepConfig sc;
    sc.samples_per_prompt = o.samples;
    sc.new_tokens = o.new_tokens;
    sc.generation_device = *device;
    sc.generation_memory_bytes = budget / 4;  // the trainer holds the rest
    sc.minibatches = minibatches;
    sc.max_step_tokens = std::max<int64_t>(4096, o.prompts * o.samples * o.prompt_tokens);
    auto reward = [](std::span<const int32_t>, std::span<const int32_t> completion) {
      int64_t even = 0;
      for (int32_t t : completion) even += t % 2 == 0;
      return completion.empty() ? 0.0f
                                : static_cast<float>(even) / static_cast<float>(completion.size());
    };
    absl::StatusOr<std::unique_ptr<train::InProcessGrpo>> grpo =
        train::InProcessGrpo::create(learner->get(), sc, reward);
    if (!grpo.ok()) return fail(absl::StrCat(variant.name, ": ", grpo.status().message()));
    Row row;
    row.name = variant.name;
    row.setup_seconds = seconds_since(setup_start);
    for (int64_t s = 0; s <= o.steps; ++s) {
      if (s > 1 && elapsed() > o.time_cap_seconds) break;  // a variant set up runs one step
      absl::StatusOr<train::GrpoStepReport> r = (*grpo)->step(prompts);
      if (!r.ok()) return fail(absl::StrCat(variant.name, ": ", r.status().message()));
      if (s == 0) continue;  // warm-up
      ++row.steps;
      row.tokens += r->generated_tokens;
      train::GrpoStepTimes& t = row.t;
      const train::GrpoStepTimes& x = r->times;
      t.generate += x.generate;
      t.score += x.score;
      t.logprobs += x.logprobs;
      t.forward_backward += x.forward_backward;
      t.optimizer += x.optimizer;
      t.requantize += x.requantize;
      t.calibrate += x.calibrate;
      t.export_weights += x.export_weights;
      t.install += x.install;
    }
    if (row.steps > 0) {
      const double n = static_cast<double>(row.steps);
      for (double* v : {&row.t.generate, &row.t.score, &row.t.logprobs, &row.t.forward_backward,
                        &row.t.optimizer, &row.t.requantize, &row.t.calibrate,
                        &row.t.export_weights, &row.t.install}) {
        *v /= n;
      }
    }
    print_row(row);
  }
  std::printf(
      "\nstep = generate + score + train (logprobs, fwd+bwd, optimizer incl. its requant) + "
      "publish (calibrate, export, install); requant is timed alone once more after the step "
      "(not added); x vs bf16 = bf16 step time / this step time; setup = policy model from the "
      "shared random master, learner and backend, first publish (not in the step).\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(std::vector<std::string>(argv + 1, argv + argc)); }
