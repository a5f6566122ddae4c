// fp8rl-bench-sharding: per-rank memory of a Gloo trainer group (loopback) under trainer.shard
// none, grads_optimizer and params, beside the memory plan's expectation (train/memory_plan.h).
// Each rank is a separate process (this binary run again with --rank), so its peak RSS (VmHWM in
// /proc/self/status) is its own. A rank creates the learner (llama-100m by default, FP8
// training), joins the group, takes the shard mode, returns freed memory to the system, resets its
// peak (/proc/self/clear_refs "5") and runs a few SFT updates of a few tokens (one optimizer step
// each); the table shows its RSS after the setup, its peak during the updates and the gradient
// storage the learner held at most (Learner::gradient_peak_bytes). Not a test.
// Usage: fp8rl-bench-sharding [--config PATH] [--steps N (2)] [--ranks "1 2 4"]
//                             [--modes "none grads_optimizer params"]
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "model/config.h"
#include "model/rng.h"
#include "train/collectives.h"
#include "train/learner.h"
#include "train/memory_plan.h"

namespace fp8rl::train {
namespace {

constexpr int64_t kSequencesPerRank = 2, kTokens = 32;  // per sequence: 16 prompt + 16 response
constexpr int64_t kBucketBytes = int64_t{4} << 20;      // the trainer's gradient bucket
constexpr double kMiB = 1024.0 * 1024.0;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fp8rl-bench-sharding: %s\n", what.c_str());
  std::exit(1);
}

// A rendezvous store over a folder (one file per key, written then renamed), for ranks that are
// separate processes on one machine.
class FolderStore final : public RendezvousStore {
 public:
  explicit FolderStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status set(const std::string& key, const std::string& value) override {
    return write_file_atomic(path(key), value);
  }
  absl::StatusOr<std::string> get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!std::filesystem::exists(path(key))) {
      if (std::chrono::steady_clock::now() > until) {
        return absl::DeadlineExceededError("rendezvous key " + key + " never appeared");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return read_text_file(path(key));
  }

 private:
  std::string path(std::string key) const {
    for (char& c : key) {
      if (c == '/') c = '_';
    }
    return dir_ + "/" + key;
  }
  std::string dir_;
};

// A field of /proc/self/status in KiB (VmRSS, VmHWM).
int64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  }
  return -1;
}

std::vector<Sequence> batch(const model::ModelConfig& c, uint64_t seed, int64_t n) {
  model::Rng rng(seed);
  std::vector<Sequence> out(n);
  for (Sequence& s : out) {
    for (int64_t t = 0; t < kTokens; ++t) {
      s.tokens.push_back(static_cast<int32_t>(rng.next() % c.vocab_size));
    }
    s.prompt_length = kTokens / 2;
  }
  return out;
}

// One rank: prints "rss_setup_kib peak_steps_kib" and the plan's parts (bytes) on one line to
// `out_path`.
int run_rank(const std::string& config_path, const std::string& store_dir, const std::string& out,
             int rank, int ranks, ShardMode mode, int steps) {
  absl::StatusOr<std::string> config = read_text_file(config_path);
  if (!config.ok()) fail(std::string(config.status().message()));
  InitRequest init;
  init.job_id = "bench-sharding";
  init.model_config_json = *config;
  init.seed = 1;
  init.precision.training = Precision::kFP8;
  init.precision.generation = Precision::kFP8;
  init.precision.kv_cache = Precision::kFP8;
  init.adamw.lr = 1e-5;
  init.placement.max_step_tokens = kSequencesPerRank * kTokens;
  absl::StatusOr<std::unique_ptr<Learner>> learner = Learner::create(init);
  if (!learner.ok()) fail(std::string(learner.status().message()));
  std::unique_ptr<Collectives> group;
  if (ranks > 1) {
    GroupOptions o;
    o.rank = rank;
    o.size = ranks;
    o.prefix = std::string(shard_mode_name(mode)) + "-" + std::to_string(ranks);
    o.timeout = std::chrono::milliseconds(600000);
    absl::StatusOr<std::unique_ptr<Collectives>> g =
        make_gloo_collectives(std::make_shared<FolderStore>(store_dir), o);
    if (!g.ok()) fail(std::string(g.status().message()));
    group = std::move(*g);
    (*learner)->set_group(group.get(), kBucketBytes);
  }
  if (absl::Status s = (*learner)->set_shard_mode(mode); !s.ok()) fail(std::string(s.message()));
  malloc_trim(0);
  const int64_t rss_setup = status_kib("VmRSS");
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // the peak RSS restarts from the current RSS
  }
  int64_t grads_held = 0;  // Learner::gradient_peak_bytes, the most over the steps
  for (int s = 0; s < steps; ++s) {
    SftRequest r;
    r.batch = batch((*learner)->policy().config(), 100 + s, kSequencesPerRank * ranks);
    r.learning_rate = 1e-5;
    absl::StatusOr<SftResult> done = (*learner)->sft_update(r);
    if (!done.ok()) fail(std::string(done.status().message()));
    grads_held = std::max(grads_held, (*learner)->gradient_peak_bytes());
  }
  const int64_t peak = status_kib("VmHWM");
  MemoryPlanInput in;
  in.config = (*learner)->policy().config();
  in.policy = init.precision.training_policy();
  in.step_tokens = kSequencesPerRank * kTokens;
  in.kv_cache_tokens = 0;  // training allocates no KV cache
  in.trainers = ranks;
  in.shard = mode;
  in.grad_bucket_bytes = kBucketBytes;
  absl::StatusOr<MemoryPlan> plan = plan_training_memory(in);
  if (!plan.ok()) fail(std::string(plan.status().message()));
  std::ofstream f(out);
  f << rss_setup << " " << peak << " " << plan->weights << " " << plan->master << " "
    << plan->moments << " " << plan->grads << " " << plan->activations << " " << plan->total()
    << " " << (*learner)->policy().params().size() << " " << grads_held << " " << plan->gathered
    << "\n";
  return f.good() ? 0 : 1;
}

int main_impl(int argc, char** argv) {
  std::string config = std::string(FP8RL_BENCH_SOURCE_DIR) + "/configs/models/llama-100m.json";
  if (const char* src = std::getenv("FP8RL_SOURCE_DIR")) {
    config = std::string(src) + "/configs/models/llama-100m.json";
  }
  int steps = 2, rank = -1, ranks = 1;
  std::string ranks_list = "1 2 4", store, out, mode_name = "none",
              modes_list = "none grads_optimizer params";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) fail("flag " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--config") {
      config = v;
    } else if (a == "--steps") {
      steps = std::atoi(v.c_str());
    } else if (a == "--ranks") {
      ranks_list = v;
    } else if (a == "--rank") {
      rank = std::atoi(v.c_str());
    } else if (a == "--size") {
      ranks = std::atoi(v.c_str());
    } else if (a == "--store") {
      store = v;
    } else if (a == "--out") {
      out = v;
    } else if (a == "--shard") {
      mode_name = v;
    } else if (a == "--modes") {
      modes_list = v;
    } else {
      fail("unknown flag " + a + " (--config, --steps, --ranks, --modes)");
    }
  }
  if (steps < 1) fail("--steps: must be >= 1");
  if (rank >= 0) {
    absl::StatusOr<ShardMode> mode = parse_shard_mode(mode_name, "--shard");
    if (!mode.ok()) fail(std::string(mode.status().message()));
    return run_rank(config, store, out, rank, ranks, *mode, steps);
  }
  std::vector<std::string> modes;
  std::istringstream mode_words(modes_list);
  for (std::string m; mode_words >> m;) {
    if (absl::StatusOr<ShardMode> parsed = parse_shard_mode(m, "--modes"); !parsed.ok()) {
      fail(std::string(parsed.status().message()));
    }
    modes.push_back(m);
  }
  std::vector<int> sizes;
  std::istringstream list(ranks_list);
  for (int n; list >> n;) {
    if (n < 1 || n > 16) fail("--ranks: each must be in [1, 16]");
    sizes.push_back(n);
  }
  char tmpl[] = "/tmp/fp8rl-bench-sharding-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) fail("cannot create a folder under /tmp");
  const std::string dir = tmpl;
  std::printf(
      "%s, FP8 training, %d SFT update(s) of %lld x %lld tokens per rank, Gloo loopback, "
      "%u cores; MiB per rank\n",
      std::filesystem::path(config).filename().c_str(), steps,
      static_cast<long long>(kSequencesPerRank), static_cast<long long>(kTokens),
      std::thread::hardware_concurrency());
  std::printf("%-16s %5s %4s %10s %10s %10s | %8s %8s %8s %8s %8s %8s %8s %12s\n", "shard", "ranks",
              "rank", "rss setup", "peak step", "grads held", "plan: wt", "gathered", "master",
              "moments", "grads", "act", "total", "master held");
  for (const std::string& mode_text : modes) {
    const char* mode = mode_text.c_str();
    for (int n : sizes) {
      const std::string run_dir = dir + "/" + mode + "-" + std::to_string(n);
      std::filesystem::create_directories(run_dir);
      std::vector<pid_t> pids;
      for (int r = 0; r < n; ++r) {
        const std::string out_path = run_dir + "/rank-" + std::to_string(r);
        const std::vector<std::string> args = {
            "/proc/self/exe", "--config",        config,   "--steps",         std::to_string(steps),
            "--rank",         std::to_string(r), "--size", std::to_string(n), "--store",
            run_dir,          "--out",           out_path, "--shard",         mode};
        const pid_t pid = fork();
        if (pid < 0) fail("fork failed");
        if (pid == 0) {
          std::vector<char*> cargs;
          for (const std::string& s : args) cargs.push_back(const_cast<char*>(s.c_str()));
          cargs.push_back(nullptr);
          execv("/proc/self/exe", cargs.data());
          std::_Exit(127);
        }
        pids.push_back(pid);
      }
      bool ok = true;
      for (pid_t pid : pids) {
        int status = 0;
        waitpid(pid, &status, 0);
        ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      if (!ok) fail(std::string("a rank failed (") + mode + ", " + std::to_string(n) + " ranks)");
      for (int r = 0; r < n; ++r) {
        std::ifstream in(run_dir + "/rank-" + std::to_string(r));
        int64_t rss = 0, peak = 0, wt = 0, master = 0, moments = 0, grads = 0, act = 0, total = 0,
                held = 0, grads_held = 0, gathered = 0;
        if (!(in >> rss >> peak >> wt >> master >> moments >> grads >> act >> total >> held >>
              grads_held >> gathered)) {
          fail("unreadable result of rank " + std::to_string(r));
        }
        std::printf(
            "%-16s %5d %4d %10.0f %10.0f %10.0f | %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f "
            "%12lld\n",
            mode, n, r, rss / 1024.0, peak / 1024.0, grads_held / kMiB, wt / kMiB, gathered / kMiB,
            master / kMiB, moments / kMiB, grads / kMiB, act / kMiB, total / kMiB,
            static_cast<long long>(held));
      }
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace fp8rl::train

int main(int argc, char** argv) { return fp8rl::train::main_impl(argc, argv); }
