// fp8rl-bench-model: CPU throughput of the model engine (prefill, KV-cache decode, training
// forward+backward) per precision for the ~10M and ~100M configs, next to the same model in
// PyTorch CPU eager (bench/model/torch_bench.py, run with /usr/bin/python3 in the same run).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/fs.h"
#include "engine/cpu/train_ops.h"
#include "model/model.h"
#include "model/nll.h"
#include "model/step_generator.h"

namespace fp8rl::model {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Shape {
  const char* name;
  int batch, prompt, decode;
};

int run(int argc, char** argv) {
  const std::string src =
      std::getenv("FP8RL_SOURCE_DIR") ? std::getenv("FP8RL_SOURCE_DIR") : FP8RL_BENCH_SOURCE_DIR;
  std::vector<Shape> shapes = {{"llama-10m", 4, 128, 16}, {"llama-100m", 2, 64, 8}};
  if (argc > 1 && std::string(argv[1]) == "--quick") shapes.resize(1);
  std::printf("%-11s %-5s %12s %12s %12s   %s\n", "model", "prec", "prefill t/s", "decode t/s",
              "train t/s", "ratio vs torch (prefill/decode/train)");
  for (const Shape& sh : shapes) {
    const std::string cfg_path = src + "/configs/models/" + sh.name + ".json";
    auto text = read_text_file(cfg_path);
    if (!text.ok()) {
      std::fprintf(stderr, "fp8rl-bench-model: %s\n", std::string(text.status().message()).c_str());
      return 1;
    }
    auto config = parse_model_config(*text);
    if (!config.ok()) return 1;
    const std::string cmd = "/usr/bin/python3 " + src + "/bench/model/torch_bench.py " + cfg_path +
                            " " + std::to_string(sh.batch) + " " + std::to_string(sh.prompt) + " " +
                            std::to_string(sh.decode);
    nlohmann::json torch_tps = {{"prefill", 0.0}, {"decode", 0.0}, {"train", 0.0}};
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[512] = {0};
      if (std::fgets(buf, sizeof buf, p)) torch_tps = nlohmann::json::parse(buf, nullptr, false);
      pclose(p);
    }
    std::printf("%-11s %-5s %12.0f %12.1f %12.0f\n", sh.name, "torch",
                torch_tps.value("prefill", 0.0), torch_tps.value("decode", 0.0),
                torch_tps.value("train", 0.0));
    for (Precision prec : {Precision::kF32, Precision::kBF16, Precision::kFP8}) {
      PrecisionPolicy policy{.linear = prec};
      auto made = Model::Init(*config, policy, 1);
      if (!made.ok()) return 1;
      std::shared_ptr<const Model> m = std::move(*made);
      Rng rng(2);
      TokenBatch prompts(sh.batch);
      for (auto& p : prompts) {
        for (int i = 0; i < sh.prompt; ++i) {
          p.push_back(static_cast<int32_t>(rng.next() % config->vocab_size));
        }
      }
      // Prefill + decode through the generator over the CPU backend (the decoder engine's step;
      // the first step is the batched prefill).
      auto backend = make_cpu_backend(m, {});
      if (!backend.ok()) return 1;
      BackendGenerator gen(*std::move(backend), 2048);
      SamplingParams sp{.temperature = 1.0f, .max_new_tokens = sh.decode + 1};
      for (size_t i = 0; i < prompts.size(); ++i) (void)gen.add(prompts[i], sp, i);
      double t0 = now();
      if (!gen.step().ok()) return 1;
      const double prefill = sh.batch * sh.prompt / (now() - t0);
      t0 = now();
      while (!gen.idle()) {
        if (!gen.step().ok()) return 1;
      }
      const double decode = sh.batch * sh.decode / (now() - t0);
      // Training: forward + backward of the token NLL.
      std::vector<float> grads(m->num_params(), 0.0f);
      t0 = now();
      engine::CpuTrainStep step;
      auto lp = step.forward(*m, prompts, {});
      if (!lp.ok()) return 1;
      TokenValues dlogp;
      token_nll(*lp, nullptr, &dlogp);
      if (!step.backward(*m, dlogp, grads.data()).ok()) return 1;
      const double train = sh.batch * sh.prompt / (now() - t0);
      auto ratio = [&](double ours, const char* key) {
        const double t = torch_tps.value(key, 0.0);
        return t > 0 ? ours / t : 0.0;
      };
      std::printf("%-11s %-5s %12.0f %12.1f %12.0f   %.2f / %.2f / %.2f\n", sh.name,
                  std::string(precision_name(prec)).c_str(), prefill, decode, train,
                  ratio(prefill, "prefill"), ratio(decode, "decode"), ratio(train, "train"));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace fp8rl::model

int main(int argc, char** argv) { return fp8rl::model::run(argc, argv); }
