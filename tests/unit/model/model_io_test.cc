// Checkpoints and weight sets in and out (F32, BF16, FP8 blocks with k/v scales), config.json
// parsing errors, and the `fp8rl init / score / generate` commands end to end with their errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "engine/cpu/train_ops.h"
#include "model/config.h"
#include "model/model.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

std::unique_ptr<Model> random_model(const PrecisionPolicy& policy, uint64_t seed = 4) {
  auto m = Model::Init(testing::make_config(70, 160, 272, 2, 4, 2, false, true), policy, seed);
  EXPECT_TRUE(m.ok());
  testing::randomize(**m, seed);
  return std::move(*m);
}

TEST(ModelIo, F32RoundTripIsExactAndBf16IsRounded) {
  auto m = random_model({});
  ASSERT_TRUE(m->set_kv_scales({{0.5f, 0.25f}, {0.125f, 2.0f}}).ok());
  testing::TempDir dir;
  ASSERT_TRUE(m->save(dir / "f32").ok());
  ASSERT_TRUE(m->save(dir / "bf16", WeightFormat::kBF16).ok());
  auto a = Model::Load(dir / "f32", {});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(std::equal(m->params().begin(), m->params().end(), (*a)->params().begin()));
  EXPECT_EQ((*a)->kv_scales().k, m->kv_scales().k);
  EXPECT_EQ((*a)->kv_scales().v, m->kv_scales().v);
  auto b = Model::Load(dir / "bf16", {});
  ASSERT_TRUE(b.ok()) << b.status();
  // One bf16 rounding: relative error at most 2^-8 per element, and not all values are exact.
  int64_t changed = 0;
  for (int64_t i = 0; i < m->num_params(); ++i) {
    const float x = m->params()[i], y = (*b)->params()[i];
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * 0x1p-8f) << i;
    changed += x != y;
  }
  EXPECT_GT(changed, m->num_params() / 2);
}

// FP8 payloads carry the codes and scales the sender computes with: a receiver in fp8 mode must
// produce bit-identical logprobs, and the payload must be ~1 byte per linear parameter.
TEST(ModelIo, Fp8WeightSetIsUsedAsIs) {
  PrecisionPolicy fp8{.linear = Precision::kFP8, .kv_cache = KvCacheDtype::kFP8};
  auto sender = random_model(fp8);
  ASSERT_TRUE(sender->set_kv_scales({{0.01f, 0.02f}, {0.03f, 0.04f}}).ok());
  auto set = sender->export_weights(WeightFormat::kFP8, 17);
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->version, 17);
  const NamedTensor* q = set->find("model.layers.1.mlp.down_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kF8E4M3);
  const NamedTensor* s = set->find("model.layers.1.mlp.down_proj.weight_scale_inv");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->shape, (std::vector<int64_t>{2, 3}));  // [ceil(160/128), ceil(272/128)]
  ASSERT_NE(set->find("model.layers.0.self_attn.k_scale"), nullptr);
  EXPECT_NE(set->config_json.find("quantization_config"), std::string::npos);
  auto receiver = Model::FromWeightSet(*set, fp8);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  EXPECT_EQ((*receiver)->kv_scales().v, sender->kv_scales().v);
  Rng rng(3);
  TokenBatch batch = {testing::random_tokens(rng, 20, 70), testing::random_tokens(rng, 7, 70)};
  auto a = engine::cpu_logprobs(*sender, batch, {});
  auto b = engine::cpu_logprobs(**receiver, batch, {});
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < batch.size(); ++i) EXPECT_EQ((*a)[i], (*b)[i]);
  // Through a checkpoint folder too (the FP8 checkpoint format on disk).
  testing::TempDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(add_to_writer(*set, &w).ok());
  ASSERT_TRUE(write_checkpoint(dir / "fp8", set->config_json, w).ok());
  auto c = Model::Load(dir / "fp8", fp8);
  ASSERT_TRUE(c.ok()) << c.status();
  auto lc = engine::cpu_logprobs(**c, batch, {});
  for (size_t i = 0; i < batch.size(); ++i) EXPECT_EQ((*a)[i], (*lc)[i]);
  // FP8 logprobs differ from fp32 ones, but only by quantization noise.
  auto f32 = Model::Load(dir / "fp8", {});
  ASSERT_TRUE(f32.ok());
  auto lf = engine::cpu_logprobs(*(*f32), batch, {});
  double d = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t j = 0; j < (*a)[i].size(); ++j)
      d = std::max(d, double(std::fabs((*a)[i][j] - (*lf)[i][j])));
  }
  EXPECT_GT(d, 1e-5);
  EXPECT_LT(d, 0.5);
}

TEST(ModelIo, BadInputsAreNamed) {
  EXPECT_EQ(parse_model_config("{").status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = parse_model_config(R"({"vocab_size": 10, "hidden_size": 8})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("intermediate_size"), std::string::npos);
  auto gqa = parse_model_config(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3})");
  ASSERT_FALSE(gqa.ok());
  EXPECT_NE(gqa.status().message().find("num_key_value_heads"), std::string::npos);
  EXPECT_FALSE(parse_precision("fp16").ok());
  EXPECT_FALSE(Model::Load("/nonexistent/ckpt", {}).ok());
  auto m = random_model({});
  auto set = m->export_weights(WeightFormat::kF32);
  ASSERT_TRUE(set.ok());
  set->tensors.erase(set->tensors.begin() + 3);
  auto broken = Model::FromWeightSet(*set, {});
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("missing tensor"), std::string::npos);
  EXPECT_FALSE(engine::cpu_logprobs(*m, {{1, 2, 500}}, {}).ok());
  EXPECT_FALSE(engine::cpu_logprobs(*m, {{1, 2}}, {.temperature = 0.0f}).ok());
}

// --- CLI ---

// $FP8RL_BIN_DIR/fp8rl when that exists, else the build tree's (set at configure time).
std::string bin() {
  const char* b = std::getenv("FP8RL_BIN_DIR");
  if (b && std::filesystem::exists(std::string(b) + "/fp8rl")) return std::string(b) + "/fp8rl";
  return FP8RL_TEST_BIN_DIR "/fp8rl";
}

int run(const std::string& args, std::string* err = nullptr) {
  testing::TempDir tmp;
  const int rc = std::system((bin() + " " + args + " 2>" + tmp / "err").c_str());
  if (err) {
    std::ifstream f(tmp / "err");
    std::stringstream ss;
    ss << f.rdbuf();
    *err = ss.str();
  }
  return WEXITSTATUS(rc);
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Cli, InitGenerateScoreAgreeAndErrorsAreOneLine) {
  testing::TempDir dir;
  std::ofstream(dir / "config.json")
      << model_config_to_json(testing::make_config(40, 64, 96, 2, 4, 2, true));
  ASSERT_EQ(run(absl::StrCat("init --config ", dir / "config.json", " --out ", dir / "m",
                             " --seed 3 --init-std 0.1")),
            0);
  std::ofstream(dir / "prompts.jsonl") << "{\"prompt_tokens\": [1, 2, 3]}\n"
                                       << "{\"prompt_tokens\": [7]}\n";
  for (const char* precision : {"fp32", "bf16", "fp8"}) {
    const std::string gen =
        absl::StrCat("generate --model ", dir / "m", " --precision ", precision, " --in ",
                     dir / "prompts.jsonl", " --out ", dir / "gen.jsonl",
                     " --max-new-tokens 6 --temperature 0.9 --seed 5 --kv-cache bf16");
    ASSERT_EQ(run(gen), 0) << precision;
    const auto g = read_lines(dir / "gen.jsonl");
    ASSERT_EQ(g.size(), 2u);
    ASSERT_EQ(run(gen.substr(0, gen.find("--out")) + "--out " + dir / "gen2.jsonl" +
                  gen.substr(gen.find(" --max-new"))),
              0);
    EXPECT_EQ(read_lines(dir / "gen2.jsonl"), g) << "same seed, same output";
    {
      std::ofstream s(dir / "score_in.jsonl");
      for (const auto& r : g) {
        std::vector<int> t = r["prompt_tokens"];
        for (int x : r["tokens"]) t.push_back(x);
        s << nlohmann::json{{"tokens", t}}.dump() << "\n";
      }
    }
    ASSERT_EQ(run(absl::StrCat("score --model ", dir / "m", " --precision ", precision,
                               " --kv-cache bf16 --temperature 0.9 --in ", dir / "score_in.jsonl",
                               " --out ", dir / "score.jsonl")),
              0);
    const auto s = read_lines(dir / "score.jsonl");
    ASSERT_EQ(s.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const size_t p = g[i]["prompt_tokens"].size();
      std::vector<double> gl = g[i]["logprobs"], sl = s[i]["logprobs"];
      ASSERT_EQ(sl.size(), p - 1 + gl.size());
      for (size_t j = 0; j < gl.size(); ++j) EXPECT_NEAR(sl[p - 1 + j], gl[j], 1e-4) << precision;
    }
  }
  std::string err;
  const std::string base = absl::StrCat("score --model ", dir / "m", " --out ", dir / "x.jsonl");
  EXPECT_NE(run(base + " --precision fp16 --in " + dir / "score_in.jsonl", &err), 0);
  EXPECT_NE(err.find("unknown precision 'fp16'"), std::string::npos) << err;
  std::ofstream(dir / "bad.jsonl") << "{\"tokens\": [1, 2]}\n{\"tokens\": [1, \"a\"]}\n";
  EXPECT_NE(run(base + " --precision fp32 --in " + dir / "bad.jsonl", &err), 0);
  EXPECT_NE(err.find("bad.jsonl:2"), std::string::npos) << err;
  std::ofstream(dir / "range.jsonl") << "{\"tokens\": [1, 40]}\n";
  EXPECT_NE(run(base + " --precision fp32 --in " + dir / "range.jsonl", &err), 0);
  EXPECT_NE(err.find("token id 40"), std::string::npos) << err;
  EXPECT_NE(run(absl::StrCat("score --model ", dir / "nope", " --precision fp32 --in ",
                             dir / "score_in.jsonl", " --out ", dir / "x.jsonl"),
                &err),
            0);
  EXPECT_NE(err.find("nope"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_FALSE(std::ifstream(dir / "x.jsonl").good()) << "no output on failure";

  // --device / --gpu-memory-fraction: cpu runs; cuda without an sm_90 device (or in a build
  // without the CUDA backend) is a one-line error; bad values name the flag; nothing is written.
  // (On a machine with a device, GenerateOnCudaMatchesTheCpuGreedily runs the cuda path.)
  const std::string gen = absl::StrCat("generate --model ", dir / "m", " --precision fp8 --in ",
                                       dir / "prompts.jsonl", " --max-new-tokens 3 --out ");
  EXPECT_EQ(run(gen + dir / "cpu.jsonl" + " --device cpu --gpu-memory-fraction 0.5", &err), 0)
      << err;
  EXPECT_EQ(read_lines(dir / "cpu.jsonl").size(), 2u);
  EXPECT_EQ(run(gen + dir / "auto.jsonl" + " --device auto", &err), 0) << err;
  EXPECT_EQ(read_lines(dir / "auto.jsonl"), read_lines(dir / "cpu.jsonl"));
  if (run(gen + dir / "x.jsonl" + " --device cuda", &err) != 0) {
    EXPECT_EQ(err.rfind("fp8rl generate: --device cuda: no sm_90 CUDA device (", 0), 0u) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  std::filesystem::remove(dir / "x.jsonl");
  EXPECT_NE(run(gen + dir / "x.jsonl" + " --device gpu", &err), 0);
  EXPECT_NE(err.find("--device: expected cuda, cpu or auto, got 'gpu'"), std::string::npos) << err;
  for (const char* f : {"0", "1.5", "x"}) {
    EXPECT_NE(run(base + " --precision fp32 --in " + dir / "score_in.jsonl" +
                      " --gpu-memory-fraction " + f,
                  &err),
              0);
    EXPECT_NE(err.find("--gpu-memory-fraction: expected a number in (0, 1]"), std::string::npos)
        << err;
  }
  EXPECT_FALSE(std::ifstream(dir / "x.jsonl").good()) << "no output on failure";
}

// `fp8rl generate --device cuda` (generation::BackendGenerator over the CUDA inference backend)
// against the CPU: fp32 weights and KV cache, top-k 1 (the argmax at every step), so the tokens
// must be equal; the CUDA fp32 GEMM accumulates in double like the CPU. Skips where `--device
// auto` does not choose cuda (no sm_90 device, or a build without the CUDA backend).
TEST(Cli, GenerateOnCudaMatchesTheCpuGreedily) {
  testing::TempDir dir;
  std::ofstream(dir / "config.json")
      << model_config_to_json(testing::make_config(40, 64, 96, 2, 4, 2, true));
  ASSERT_EQ(run(absl::StrCat("init --config ", dir / "config.json", " --out ", dir / "m",
                             " --seed 3 --init-std 0.1")),
            0);
  std::ofstream(dir / "prompts.jsonl") << "{\"prompt_tokens\": [1, 2, 3]}\n"
                                       << "{\"prompt_tokens\": [7]}\n"
                                       << "{\"prompt_tokens\": [5, 9, 11, 2, 30]}\n";
  const std::string gen =
      absl::StrCat("generate --model ", dir / "m", " --precision fp32 --kv-cache fp32 --in ",
                   dir / "prompts.jsonl", " --max-new-tokens 12 --top-k 1 --seed 5 --out ");
  std::string err;
  ASSERT_EQ(run(gen + dir / "auto.jsonl" + " --device auto", &err), 0) << err;
  if (err.find("cuda") == std::string::npos) GTEST_SKIP() << "fp8rl generate chose the CPU";
  ASSERT_EQ(run(gen + dir / "cpu.jsonl" + " --device cpu", &err), 0) << err;
  const auto gpu = read_lines(dir / "auto.jsonl");
  const auto cpu = read_lines(dir / "cpu.jsonl");
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu[i]["tokens"], cpu[i]["tokens"]) << "prompt " << i;
  }
}

}  // namespace
}  // namespace fp8rl::model
