// fp8rl-bench-data-parallel: one GRPO step of the llama-10m config on one trainer and on a group of
// two (two threads of this process, Gloo over loopback: the same collectives and the same CPU
// sharing as two trainer processes on one machine), the group with one gradient all-reduce after
// the backward and with buckets reduced while it runs. Prints the step time, the time inside
// all-reduces and its share, the time the step waited for the gradient all-reduce after the
// backward, and the bytes all-reduced per step. Not a test.
// Usage: fp8rl-bench-data-parallel [steps (3)] [bucket MiB ... (0 4 1)]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "model/rng.h"
#include "train/collectives.h"
#include "train/learner.h"

namespace fp8rl::train {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// `n` sequences of a 32-token prompt and a 32-token response.
std::vector<Sequence> batch(const model::ModelConfig& c, uint64_t seed, int n) {
  model::Rng rng(seed);
  std::vector<Sequence> out(n);
  for (int i = 0; i < n; ++i) {
    for (int t = 0; t < 64; ++t) {
      out[i].tokens.push_back(static_cast<int32_t>(rng.next() % c.vocab_size));
    }
    out[i].prompt_length = 32;
    out[i].advantage = i % 2 == 0 ? 1.0f : -1.0f;
    for (int t = 0; t < 32; ++t) {
      out[i].gen_logprobs.push_back(static_cast<float>(-0.5 - 3.0 * rng.uniform()));
    }
  }
  return out;
}

struct Timing {
  double step = 0, all_reduce = 0, waited = 0;
  int64_t bytes = 0;
};

// Runs `steps` GRPO steps after one warm-up step; per-step means of rank 0.
Timing run(const std::string& config_json, Collectives* group, int steps, int sequences,
           int64_t bucket_bytes = 0) {
  InitRequest init;
  init.job_id = "bench";
  init.model_config_json = config_json;
  init.seed = 1;
  init.precision.training = Precision::kFP8;
  init.precision.generation = Precision::kFP8;
  init.precision.kv_cache = Precision::kFP8;
  init.adamw.lr = 1e-5;
  absl::StatusOr<std::unique_ptr<Learner>> learner = Learner::create(init);
  if (!learner.ok()) {
    std::fprintf(stderr, "fp8rl-bench-data-parallel: %s\n",
                 std::string(learner.status().message()).c_str());
    std::exit(1);
  }
  (*learner)->set_group(group, bucket_bytes);
  Timing t;
  for (int s = 0; s <= steps; ++s) {
    GrpoRequest r;
    r.batch = batch((*learner)->policy().config(), 100 + s, sequences);
    r.loss.clip_eps = 0.2;
    r.minibatches = 2;
    const double start = now();
    absl::StatusOr<GrpoResult> result = (*learner)->grpo_update(r);
    if (!result.ok()) {
      std::fprintf(stderr, "fp8rl-bench-data-parallel: %s\n",
                   std::string(result.status().message()).c_str());
      std::exit(1);
    }
    if (s == 0) continue;  // warm-up
    t.step += (now() - start) / steps;
    t.all_reduce += result->all_reduce_seconds / steps;
    t.waited += result->gradient_wait_seconds / steps;
    t.bytes = result->all_reduce_bytes;
  }
  return t;
}

int main_impl(int argc, char** argv) {
  const std::string src =
      std::getenv("FP8RL_SOURCE_DIR") ? std::getenv("FP8RL_SOURCE_DIR") : FP8RL_BENCH_SOURCE_DIR;
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  std::vector<double> buckets_mb;
  for (int i = 2; i < argc; ++i) buckets_mb.push_back(std::atof(argv[i]));
  if (buckets_mb.empty()) buckets_mb = {0, 4, 1};
  const int sequences = 16;
  absl::StatusOr<std::string> config = read_text_file(src + "/configs/models/llama-10m.json");
  if (!config.ok()) {
    std::fprintf(stderr, "fp8rl-bench-data-parallel: %s\n",
                 std::string(config.status().message()).c_str());
    return 1;
  }
  std::printf("llama-10m, FP8 training, GRPO step of %d x 64 tokens, 2 minibatches, %u cores\n",
              sequences, std::thread::hardware_concurrency());
  std::printf("%-9s %9s %10s %14s %10s %10s %12s %9s\n", "trainers", "bucket", "step s",
              "all-reduce s", "share", "waited s", "MB reduced", "speedup");
  const Timing alone = run(*config, nullptr, steps, sequences);
  std::printf("%-9d %9s %10.3f %14.3f %9.1f%% %10.3f %12.1f %9s\n", 1, "-", alone.step, 0.0, 0.0,
              0.0, 0.0, "1.00");
  constexpr int kSize = 2;
  for (double mb : buckets_mb) {
    const auto bucket_bytes = static_cast<int64_t>(mb * 1024 * 1024);
    std::shared_ptr<RendezvousStore> store = make_memory_store();
    std::vector<Timing> timings(kSize);
    std::vector<std::thread> threads;
    for (int r = 0; r < kSize; ++r) {
      threads.emplace_back([&, r] {
        GroupOptions o;
        o.rank = r;
        o.size = kSize;
        o.prefix = "bench";
        absl::StatusOr<std::unique_ptr<Collectives>> g = make_gloo_collectives(store, o);
        if (!g.ok()) {
          std::fprintf(stderr, "fp8rl-bench-data-parallel: %s\n",
                       std::string(g.status().message()).c_str());
          std::exit(1);
        }
        timings[r] = run(*config, g->get(), steps, sequences, bucket_bytes);
      });
    }
    for (std::thread& t : threads) t.join();
    const Timing& t = timings[0];
    const std::string bucket = bucket_bytes > 0 ? std::to_string(mb).substr(0, 4) + " MiB" : "none";
    std::printf("%-9d %9s %10.3f %14.3f %9.1f%% %10.3f %12.1f %9.2f\n", kSize, bucket.c_str(),
                t.step, t.all_reduce, 100.0 * t.all_reduce / t.step, t.waited,
                static_cast<double>(t.bytes) / 1e6, alone.step / t.step);
  }
  return 0;
}

}  // namespace
}  // namespace fp8rl::train

int main(int argc, char** argv) { return fp8rl::train::main_impl(argc, argv); }
