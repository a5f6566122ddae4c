// fp8rl-bench-model-real: one real-size model (default configs/models/qwen3-0.6b.json, Qwen3-0.6B's
// shapes and vocabulary) with random weights: resident memory and time of init, of writing a BF16
// checkpoint and of loading it back, and one training forward of a short sequence. Prints a table;
// not a test (tens of seconds and several GB).
//   fp8rl-bench-model-real [CONFIG.json] [--precision f32|bf16|fp8] [--tokens N]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/fs.h"
#include "engine/cpu/train_ops.h"
#include "model/model.h"
#include "model/rng.h"

namespace fp8rl::model {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Current and peak resident set size of this process, GiB (Linux /proc/self/status).
double rss_gib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atof(line.c_str() + std::strlen(field)) / (1 << 20);
  }
  return 0;
}

// Process CPU seconds (all threads): the wall time of a loaded shared machine is mostly waiting.
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// Restarts the peak (VmHWM) at the current RSS, so each phase reports its own peak.
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

double phase_cpu0 = 0;

void row(const char* what, double seconds, const std::string& note) {
  const double cpu = cpu_seconds();
  std::printf("%-26s %8.2f s wall %8.2f s cpu   rss %6.2f GiB   peak %6.2f GiB   %s\n", what,
              seconds, cpu - phase_cpu0, rss_gib("VmRSS:"), rss_gib("VmHWM:"), note.c_str());
  std::fflush(stdout);
  reset_peak();
  phase_cpu0 = cpu_seconds();
}

int fail(const absl::Status& s) {
  std::fprintf(stderr, "fp8rl-bench-model-real: %s\n", std::string(s.message()).c_str());
  return 1;
}

int run(int argc, char** argv) {
  const std::string src =
      std::getenv("FP8RL_SOURCE_DIR") ? std::getenv("FP8RL_SOURCE_DIR") : FP8RL_BENCH_SOURCE_DIR;
  std::string cfg_path = src + "/configs/models/qwen3-0.6b.json";
  std::string precision = "f32";
  int64_t tokens = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--precision" && i + 1 < argc) {
      precision = argv[++i];
    } else if (a == "--tokens" && i + 1 < argc) {
      tokens = std::atoll(argv[++i]);
    } else {
      cfg_path = a;
    }
  }
  auto text = read_text_file(cfg_path);
  if (!text.ok()) return fail(text.status());
  auto config = parse_model_config(*text);
  if (!config.ok()) return fail(config.status());
  auto prec = parse_precision(precision);
  if (!prec.ok()) return fail(prec.status());
  const PrecisionPolicy policy{.linear = *prec};
  std::printf(
      "%s: %s, hidden %ld, %ld layers, %ld/%ld heads, head_dim %ld, vocab %ld, linears %s\n",
      cfg_path.c_str(), config->model_type.c_str(), static_cast<long>(config->hidden_size),
      static_cast<long>(config->num_hidden_layers), static_cast<long>(config->num_attention_heads),
      static_cast<long>(config->num_key_value_heads), static_cast<long>(config->head_dim),
      static_cast<long>(config->vocab_size), precision.c_str());
  row("start", 0, "");

  double t0 = now();
  auto made = Model::Init(*config, policy, 1);
  if (!made.ok()) return fail(made.status());
  std::unique_ptr<Model> m = std::move(*made);
  row("init (random weights)", now() - t0,
      std::to_string(m->num_params()) + " parameters, fp32 master " +
          std::to_string(m->num_params() * 4.0 / (1 << 30)).substr(0, 4) + " GiB");

  const std::string dir =
      (std::filesystem::temp_directory_path() / ("fp8rl_bench_real_" + std::to_string(getpid())))
          .string();
  t0 = now();
  if (auto s = m->save(dir, WeightFormat::kBF16); !s.ok()) return fail(s);
  int64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  }
  row("save BF16 checkpoint", now() - t0,
      std::to_string(bytes / (1 << 20)) + " MiB on disk in " + dir);
  m.reset();
  row("after freeing the model", 0, "");

  t0 = now();
  auto loaded = Model::Load(dir, policy);
  if (!loaded.ok()) return fail(loaded.status());
  m = std::move(*loaded);
  row("load BF16 checkpoint", now() - t0, "");
  std::filesystem::remove_all(dir);

  Rng rng(3);
  std::vector<int32_t> seq(tokens);
  for (auto& t : seq) t = static_cast<int32_t>(rng.next() % config->vocab_size);
  t0 = now();
  auto lp = engine::cpu_logprobs(*m, {seq});
  if (!lp.ok()) return fail(lp.status());
  double sum = 0;
  bool finite = true;
  for (float v : (*lp)[0]) {
    sum += v;
    finite = finite && std::isfinite(v);
  }
  const double mean = sum / static_cast<double>(lp->at(0).size());
  row("forward (layer inputs)", now() - t0,
      std::to_string(tokens) + " tokens, mean logprob " + std::to_string(mean) + " (log 1/vocab " +
          std::to_string(-std::log(static_cast<double>(config->vocab_size))) + ")" +
          (finite ? "" : " NON-FINITE"));
  return finite ? 0 : 1;
}

}  // namespace
}  // namespace fp8rl::model

int main(int argc, char** argv) { return fp8rl::model::run(argc, argv); }
