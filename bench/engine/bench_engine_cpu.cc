// fp8rl-bench-engine-cpu: the decoder engine over its CPU ops (engine/cpu: decoder_step with
// CpuDecoderOps, train_forward / train_backward with CpuTrainOps) on one model and one batch, in
// one process. Generation (prefill + decode) is timed alone, and its last logits are checked
// against the training forward's logits of the same tokens. Training is timed two ways,
// alternating per repetition: keeping every activation, and with activation recomputation
// (recompute_layers: each layer's input only, the layer re-run in the backward). The first
// repetition checks that both give the same bytes (logprobs, gradients); exit status 2 when a
// check fails (logits: bit for bit for bf16 / FP8 linears; fp32 sgemm's last bits depend on the
// rows).
//
//   fp8rl-bench-engine-cpu [--config configs/models/llama-10m.json]
//                          [--precision fp8|fp8-kvf32|bf16|f32]
//                          [--seqs 8] [--prompt 96] [--decode 16] [--reps 3]
//
// Threads: $FP8RL_NUM_THREADS (default: every core). Prints one table: per phase, the median and
// min seconds of each way and recompute / keep.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "engine/cpu/decoder_ops.h"
#include "engine/cpu/train_ops.h"
#include "engine/decoder_step.h"
#include "model/config.h"
#include "model/inference_backend.h"
#include "model/model.h"
#include "model/rng.h"

namespace {

using namespace fp8rl;  // NOLINT: benchmark main file
using Clock = std::chrono::steady_clock;

struct Options {
  std::string config = "configs/models/llama-10m.json";
  std::string precision = "fp8";
  int64_t seqs = 8, prompt = 96, decode = 16, reps = 3;
};

int fail(const std::string& what) {
  std::fprintf(stderr, "fp8rl-bench-engine-cpu: %s\n", what.c_str());
  return 1;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Times {
  std::vector<double> keep, recompute;
};

// Prefill of every sequence in one step, then `decode` one-token steps, through the engine.
absl::Status engine_generate(const model::Model& m, const std::vector<std::vector<int32_t>>& seqs,
                             int64_t prompt, int64_t decode, std::vector<float>* logits) {
  const model::ModelConfig& c = m.config();
  constexpr int64_t kBlock = 16;
  const int64_t cap = prompt + decode, per_seq = (cap + kBlock - 1) / kBlock;
  const int64_t n = static_cast<int64_t>(seqs.size());
  std::vector<std::vector<int32_t>> blocks(n);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t b = 0; b < per_seq; ++b)
      blocks[s].push_back(static_cast<int32_t>(s * per_seq + b));
  }
  engine::CpuDecoderOps ops(m, n * per_seq, kBlock);
  engine::CpuStepBuffers buf(c, n * prompt);
  logits->assign(n * c.vocab_size, 0.0f);
  for (int64_t step = 0; step <= decode; ++step) {
    std::vector<engine::SegmentBlocks> segs;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t pos0 = step == 0 ? 0 : prompt + step - 1, len = step == 0 ? prompt : 1;
      segs.push_back({&blocks[s], cap, seqs[s].data() + pos0, len, pos0});
    }
    auto t = engine::build_step_tables(segs, kBlock, c.vocab_size, c.max_position_embeddings,
                                       engine::OutputRows::kLastOfSegment);
    if (!t.ok()) return t.status();
    const engine::StepBuffers b = buf.view();
    if (auto st = engine::decoder_step(c, m.policy(), m.layout(), ops, b, *t, nullptr); !st.ok()) {
      return st;
    }
    if (auto st = ops.linear(-1, 0, b.sel, t->n_seg, nullptr, logits->data()); !st.ok()) return st;
  }
  return absl::OkStatus();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(const model::TokenValues& a, const model::TokenValues& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same_bits(a[i], b[i])) return false;
  }
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
double minimum(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return fail(absl::StrCat(a, ": expected a value"));
    const std::string v = argv[++i];
    int64_t* num = a == "--seqs"     ? &o.seqs
                   : a == "--prompt" ? &o.prompt
                   : a == "--decode" ? &o.decode
                   : a == "--reps"   ? &o.reps
                                     : nullptr;
    if (a == "--config") {
      o.config = v;
    } else if (a == "--precision") {
      o.precision = v;
    } else if (num == nullptr) {
      return fail(absl::StrCat("unknown flag '", a, "'"));
    } else if (!absl::SimpleAtoi(v, num) || *num < 1) {
      return fail(absl::StrCat(a, ": expected a positive integer, got '", v, "'"));
    }
  }
  std::ifstream in(o.config);
  if (!in) return fail(absl::StrCat("--config: cannot read '", o.config, "'"));
  std::stringstream text;
  text << in.rdbuf();
  auto config = model::parse_model_config(text.str());
  if (!config.ok()) return fail(absl::StrCat("--config: ", config.status().message()));
  if (o.prompt + o.decode > config->max_position_embeddings) {
    return fail("--prompt + --decode exceeds the config's max_position_embeddings");
  }
  model::PrecisionPolicy policy;
  if (o.precision == "fp8") {
    policy.linear = model::Precision::kFP8;
    policy.kv_cache = model::KvCacheDtype::kFP8;
  } else if (o.precision == "fp8-kvf32") {
    policy.linear = model::Precision::kFP8;
    policy.kv_cache = model::KvCacheDtype::kF32;
  } else if (o.precision == "bf16") {
    policy.linear = model::Precision::kBF16;
    policy.kv_cache = model::KvCacheDtype::kBF16;
  } else if (o.precision == "f32") {
    policy.linear = model::Precision::kF32;
    policy.kv_cache = model::KvCacheDtype::kF32;
  } else {
    return fail(
        absl::StrCat("--precision: must be fp8, fp8-kvf32, bf16 or f32, got '", o.precision, "'"));
  }
  auto made = model::Model::Init(*config, policy, 7, 0.05f);
  if (!made.ok()) return fail(std::string(made.status().message()));
  model::Model& m = **made;
  if (policy.kv_cache == model::KvCacheDtype::kFP8) {
    model::KvScales s = m.kv_scales();
    for (auto& k : s.k) k = 0.05f;
    for (auto& v : s.v) v = 0.05f;
    if (auto st = m.set_kv_scales(s); !st.ok()) return fail(std::string(st.message()));
  }
  model::Rng rng(3);
  std::vector<std::vector<int32_t>> seqs(o.seqs);
  for (auto& s : seqs) {
    s.resize(o.prompt + o.decode);
    for (auto& t : s) t = static_cast<int32_t>(rng.next() % config->vocab_size);
  }
  model::TokenBatch batch(seqs.begin(), seqs.end());

  Times gen, fwd, bwd;
  bool same_logits = true, same_logprobs = true, same_grads = true;
  const int64_t n_params = m.num_params();
  model::TokenValues dlogp(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    dlogp[s].resize(batch[s].size() - 1);
    for (float& v : dlogp[s]) v = static_cast<float>(rng.normal());
  }
  for (int64_t r = 0; r < o.reps; ++r) {
    {
      std::vector<float> logits;
      auto t0 = Clock::now();
      absl::Status st = engine_generate(m, seqs, o.prompt, o.decode, &logits);
      if (!st.ok()) return fail(absl::StrCat("generate: ", st.message()));
      gen.keep.push_back(seconds_since(t0));
      if (r == 0) {
        // The training forward's logits of each whole sequence, last row: the step's last logits.
        const int64_t vocab = config->vocab_size;
        int64_t differ = 0;
        double worst = 0;
        for (size_t q = 0; q < seqs.size(); ++q) {
          auto want = engine::cpu_logits(m, seqs[q]);
          if (!want.ok()) return fail(absl::StrCat("logits: ", want.status().message()));
          const float* w = want->data() + want->size() - vocab;
          for (int64_t v = 0; v < vocab; ++v) {
            const float g = logits[q * vocab + v];
            if (std::bit_cast<uint32_t>(g) != std::bit_cast<uint32_t>(w[v])) ++differ;
            worst = std::max(worst, static_cast<double>(std::fabs(g - w[v])));
          }
        }
        same_logits = differ == 0;
        if (!same_logits) {
          std::printf("logits vs the training forward: %lld of %zu differ, max |diff| %.3g\n",
                      static_cast<long long>(differ), logits.size(), worst);
        }
      }
    }
    // Alternate which way goes first, so drift in the machine's load hits both.
    for (int path = 0; path < 2; ++path) {
      const bool keep = (path == 0) == (r % 2 == 0);
      std::vector<float> grads(n_params, 0.0f);
      model::TokenValues lp;
      engine::CpuTrainStep step;
      auto t0 = Clock::now();
      auto got = step.forward(m, batch, {.temperature = 1.0f, .recompute_layers = !keep});
      if (!got.ok()) return fail(absl::StrCat("forward: ", got.status().message()));
      (keep ? fwd.keep : fwd.recompute).push_back(seconds_since(t0));
      lp = *std::move(got);
      t0 = Clock::now();
      if (auto s2 = step.backward(m, dlogp, grads.data()); !s2.ok()) {
        return fail(absl::StrCat("backward: ", s2.message()));
      }
      (keep ? bwd.keep : bwd.recompute).push_back(seconds_since(t0));
      static model::TokenValues first_lp;
      static std::vector<float> first_grads;
      if (r == 0 && path == 0) {
        first_lp = lp;
        first_grads = grads;
      } else if (r == 0) {
        same_logprobs = same_bits(first_lp, lp);
        same_grads = same_bits(first_grads, grads);
      }
    }
  }
  std::printf(
      "fp8rl-bench-engine-cpu: %s (%lld parameters), %s, %d threads, %lld sequences x %lld "
      "prompt tokens + %lld decode steps, %lld repetitions\n",
      o.config.c_str(), static_cast<long long>(n_params), o.precision.c_str(),
      global_thread_pool().num_threads(), static_cast<long long>(o.seqs),
      static_cast<long long>(o.prompt), static_cast<long long>(o.decode),
      static_cast<long long>(o.reps));
  std::printf("| phase | keep median (min) s | recompute median (min) s | recompute / keep |\n");
  std::printf("|---|---|---|---|\n");
  auto row = [](const char* name, const Times& t) {
    std::printf("| %s | %.3f (%.3f) | %.3f (%.3f) | %.2f |\n", name, median(t.keep),
                minimum(t.keep), median(t.recompute), minimum(t.recompute),
                median(t.recompute) / std::max(median(t.keep), 1e-9));
  };
  std::printf("| prefill + decode | %.3f (%.3f) | - | - |\n", median(gen.keep), minimum(gen.keep));
  row("training forward", fwd);
  row("training backward", bwd);
  const bool f32 = policy.linear == model::Precision::kF32;
  std::printf(
      "same bytes: generation logits vs the training forward %s, recompute vs keep: "
      "logprobs %s, gradients %s\n",
      same_logits ? "yes" : (f32 ? "no (fp32 rows, see above)" : "NO"),
      same_logprobs ? "yes" : "NO", same_grads ? "yes" : "NO");
  return (same_logits || f32) && same_logprobs && same_grads ? 0 : 2;
}
