// fp8rl-bench-moe: the mixture-of-experts model on the CPU reference path.
//   1. Training step time (forward + backward) of configs/models/small-moe.json against its dense
//      twin at equal active parameters (same attention, one SwiGLU of width top_k x expert width),
//      per linear precision.
//   2. Routing disagreement and logprob mismatch between a sampler and a learner that differ in
//      precision (FP8 generation, BF16 training from the same master weights), with routing
//      replay off and on: the mismatch MoE adds and what replay removes.
// Prints tables; not a test. --quick: fewer repetitions. Runs on one thread (FP8RL_NUM_THREADS).
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/fs.h"
#include "engine/cpu/train_ops.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/step_generator.h"

namespace fp8rl::model {
namespace {

// Process CPU seconds: the step times are CPU time with FP8RL_NUM_THREADS=1 (set in main), so a
// loaded shared machine changes them little (wall time there mostly measures the other jobs).
double now() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

TokenBatch random_batch(uint64_t seed, int n, int len, int64_t vocab) {
  Rng rng(seed);
  TokenBatch b(n);
  for (auto& s : b) {
    s.resize(len);
    for (auto& t : s) t = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
  }
  return b;
}

// Median seconds of forward + backward over `reps` runs.
double step_seconds(const Model& m, const TokenBatch& batch, int reps) {
  TokenValues dlogp;
  Rng rng(5);
  for (const auto& s : batch) {
    dlogp.emplace_back(s.size() - 1);
    for (auto& v : dlogp.back()) v = static_cast<float>(rng.normal() * 0.1);
  }
  std::vector<double> t;
  std::vector<float> grads(m.num_params());
  for (int r = 0; r < reps; ++r) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    const double t0 = now();
    engine::CpuTrainStep step;
    if (!step.forward(m, batch, {}).ok() || !step.backward(m, dlogp, grads.data()).ok()) {
      std::fprintf(stderr, "fp8rl-bench-moe: forward/backward failed\n");
      std::exit(1);
    }
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int64_t active_params(const ModelConfig& c) {
  ParamLayout layout(c);
  if (!c.is_moe()) return layout.total();
  // Subtract the experts a token does not run: (E - k) of each sparse layer's E.
  const int64_t per_expert = 3 * c.hidden_size * c.moe.moe_intermediate_size;
  return layout.total() -
         c.num_sparse_layers() * (c.moe.num_experts - c.moe.num_experts_per_tok) * per_expert;
}

int run(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const std::string src =
      std::getenv("FP8RL_SOURCE_DIR") ? std::getenv("FP8RL_SOURCE_DIR") : FP8RL_BENCH_SOURCE_DIR;
  auto text = read_text_file(src + "/configs/models/small-moe.json");
  if (!text.ok()) {
    std::fprintf(stderr, "fp8rl-bench-moe: %s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  auto moe_config = parse_model_config(*text);
  if (!moe_config.ok()) {
    std::fprintf(stderr, "fp8rl-bench-moe: %s\n",
                 std::string(moe_config.status().message()).c_str());
    return 1;
  }
  ModelConfig dense = *moe_config;
  dense.model_type = "qwen3";
  dense.moe = {};
  dense.intermediate_size =
      moe_config->moe.num_experts_per_tok * moe_config->moe.moe_intermediate_size;

  // 1. Step time at equal active parameters.
  const TokenBatch batch = random_batch(1, 16, 24, moe_config->vocab_size);
  const int reps = quick ? 3 : 7;
  std::printf(
      "Training step (forward + backward), 16 sequences x 24 tokens, CPU ms on one thread, median "
      "of %d\n",
      reps);
  std::printf("%-6s %-5s %12s %12s %10s\n", "model", "prec", "params", "active", "step ms");
  for (Precision p : {Precision::kBF16, Precision::kFP8}) {
    for (const ModelConfig* c : {&dense, &*moe_config}) {
      auto m = Model::Init(*c, {.linear = p}, 3);
      if (!m.ok()) return 1;
      const double s = step_seconds(**m, batch, reps);
      std::printf("%-6s %-5s %12lld %12lld %10.1f\n", c->is_moe() ? "moe" : "dense",
                  std::string(precision_name(p)).c_str(),
                  static_cast<long long>((*m)->num_params()),
                  static_cast<long long>(active_params(*c)), s * 1e3);
    }
  }

  // 2. Sampler FP8, learner BF16 (same master weights): routing disagreement and mismatch.
  std::printf("\nFP8 generation vs BF16 training, same weights (random init, std 0.02)\n");
  std::printf("%-7s %8s %14s %14s %14s\n", "replay", "tokens", "route differ", "mean|dlogp|",
              "max|dlogp|");
  auto master = Model::Init(*moe_config, {.linear = Precision::kFP8}, 7);
  if (!master.ok()) return 1;
  auto set = (*master)->export_weights(WeightFormat::kF32);
  if (!set.ok()) return 1;
  auto gen_model =
      Model::FromWeightSet(*set, {.linear = Precision::kFP8, .kv_cache = KvCacheDtype::kBF16});
  auto train_model = Model::FromWeightSet(*set, {.linear = Precision::kBF16});
  if (!gen_model.ok() || !train_model.ok()) return 1;
  std::vector<std::vector<int32_t>> prompts;
  Rng rng(11);
  for (int i = 0; i < (quick ? 16 : 64); ++i) {
    std::vector<int32_t> p(8);
    for (auto& t : p) t = static_cast<int32_t>(rng.next() % 256);
    prompts.push_back(p);
  }
  SamplingParams sp{.temperature = 1.0f, .max_new_tokens = 16, .seed = 3};
  auto results = generate(std::shared_ptr<const Model>(std::move(*gen_model)), prompts, sp);
  if (!results.ok()) return 1;
  TokenBatch seqs;
  TokenRouting recorded;
  for (const auto& r : *results) {
    seqs.push_back(r.prompt);
    seqs.back().insert(seqs.back().end(), r.tokens.begin(), r.tokens.end());
    recorded.push_back(r.routing);
  }
  const int64_t width = (*train_model)->routing_width(), k = moe_config->moe.num_experts_per_tok;
  for (bool replay : {false, true}) {
    ForwardRouting routed;
    auto lp = engine::cpu_logprobs(
        **train_model, seqs, {.replay = replay ? &recorded : nullptr, .routing_out = &routed});
    if (!lp.ok()) return 1;
    double sum = 0, mx = 0;
    int64_t n = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const size_t pl = (*results)[s].prompt.size();
      for (size_t j = 0; j < (*results)[s].tokens.size(); ++j) {
        const double d = std::fabs((*lp)[s][pl - 1 + j] - (*results)[s].full_logprobs[j]);
        sum += d;
        mx = std::max(mx, d);
        ++n;
      }
    }
    // The learner's own routing choice vs the sampler's (with replay: where replay overrode it).
    const RoutingDifference d =
        replay ? RoutingDifference{routed.replayed_tokens, routed.replay_overrode}
               : routing_difference(routed.used, recorded, width, k);
    const RoutingDifference used = routing_difference(routed.used, recorded, width, k);
    std::printf("%-7s %8lld %8.4f (%3lld) %14.3e %14.3e   routing used differs: %lld\n",
                replay ? "on" : "off", static_cast<long long>(d.tokens),
                static_cast<double>(d.differ) / std::max<int64_t>(1, d.tokens),
                static_cast<long long>(d.differ), sum / n, mx, static_cast<long long>(used.differ));
  }
  return 0;
}

}  // namespace
}  // namespace fp8rl::model

int main(int argc, char** argv) {
  setenv("FP8RL_NUM_THREADS", "1", 1);  // before the pool starts: CPU time of one thread
  return fp8rl::model::run(argc, argv);
}
