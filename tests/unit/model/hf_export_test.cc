// Hugging Face / block-FP8 export (model/hf_export.h): shard planning, sharded folders with their
// index read back by the checkpoint reader, BF16 and FP8 tensors exactly as the engine holds them,
// tokenizer files copied, nothing left behind on failure; and loading a sharded F16 checkpoint in
// the Hugging Face layout (tied embeddings, no k/v scales, extra tensors).
#include "model/hf_export.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/dtype.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "engine/cpu/train_ops.h"
#include "kernels/formats.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::json;

std::unique_ptr<Model> random_model(const PrecisionPolicy& policy, bool tied, uint64_t seed) {
  ModelConfig c = testing::make_config(70, 160, 272, 2, 4, 2, tied, /*qwen2=*/true);
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  auto m = Model::Init(c, policy, seed);
  EXPECT_TRUE(m.ok()) << m.status();
  testing::randomize(**m, seed);
  return std::move(*m);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : stdfs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

NamedTensor tensor_of_bytes(const std::string& name, int64_t n) {
  return {name, DType::kU8, {n}, std::vector<uint8_t>(n, 7)};
}

TEST(HfExport, PlanShardsClosesAShardBeforeItOverflows) {
  const std::vector<NamedTensor> t = {tensor_of_bytes("a", 40), tensor_of_bytes("b", 50),
                                      tensor_of_bytes("c", 30), tensor_of_bytes("d", 200),
                                      tensor_of_bytes("e", 10)};
  // 40+50 fit in 100; +30 would not; d alone exceeds the limit and gets its own shard.
  const std::vector<std::vector<size_t>> want = {{0, 1}, {2}, {3}, {4}};
  EXPECT_EQ(plan_shards(t, 100), want);
  EXPECT_EQ(plan_shards(t, 1000), std::vector<std::vector<size_t>>({{0, 1, 2, 3, 4}}));
  EXPECT_EQ(shard_file_name(2, 13), "model-00002-of-00013.safetensors");
  EXPECT_FALSE(parse_export_format("bf16").ok());
  EXPECT_EQ(*parse_export_format("fp8"), ExportFormat::kFp8);
}

TEST(HfExport, ShardedBf16FolderReadsBackAsTheRoundedMaster) {
  auto m = random_model({}, /*tied=*/false, 3);
  ASSERT_TRUE(m->set_kv_scales({{0.5f, 0.25f}, {0.125f, 2.0f}}).ok());
  testing::TempDir tmp;
  const std::string out = tmp / "hf";
  HfExportOptions o;
  o.max_shard_bytes = 40000;  // the embedding (70x160 BF16 = 22400 bytes) fits, two of them not
  auto summary = export_hf_checkpoint(*m, out, o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GT(summary->shards, 3);
  EXPECT_EQ(summary->tensors, static_cast<int64_t>(m->layout().params().size()));
  EXPECT_FALSE(stdfs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(stdfs::exists(temp_path_for(out)));

  // The index names every tensor once, its shard holds it, total_size adds up.
  const Json index = Json::parse(slurp(out + "/model.safetensors.index.json"));
  int64_t total = 0;
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    auto f = SafetensorsFile::Open(out + "/" + file.get<std::string>());
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE(f->has(name)) << name;
    auto info = f->info(name);
    EXPECT_EQ(info->dtype, DType::kBF16) << name;
    EXPECT_EQ(f->metadata().at("format"), "pt");
    total += info->nbytes();
    shards.insert(file.get<std::string>());
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_EQ(static_cast<int64_t>(shards.size()), summary->shards);
  EXPECT_EQ(index["weight_map"].size(), m->layout().params().size());  // no k/v scales
  for (const auto& [name, file] : index["weight_map"].items()) {
    EXPECT_EQ(name.find("_scale"), std::string::npos) << name;
  }

  const Json config = Json::parse(slurp(out + "/config.json"));
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_FALSE(config.contains("quantization_config"));
  const Json gen = Json::parse(slurp(out + "/generation_config.json"));
  EXPECT_EQ(gen["bos_token_id"], 1);
  EXPECT_EQ(gen["eos_token_id"], 2);

  auto back = Model::Load(out, {});
  ASSERT_TRUE(back.ok()) << back.status();
  int64_t changed = 0;
  for (int64_t i = 0; i < m->num_params(); ++i) {
    const float want = kernels::round_bf16(m->params()[i]);
    ASSERT_EQ((*back)->params()[i], want) << i;
    changed += want != m->params()[i];
  }
  EXPECT_GT(changed, m->num_params() / 2);  // the rounding happened
}

TEST(HfExport, Fp8FolderCarriesTheEngineCodesAndScales) {
  PrecisionPolicy fp8{.linear = Precision::kFP8, .kv_cache = KvCacheDtype::kFP8};
  auto m = random_model(fp8, /*tied=*/true, 5);
  ASSERT_TRUE(m->set_kv_scales({{0.01f, 0.02f}, {0.03f, 0.04f}}).ok());
  testing::TempDir tmp;
  const std::string out = tmp / "fp8";
  HfExportOptions o;
  o.format = ExportFormat::kFp8;
  o.max_shard_bytes = 30000;
  auto summary = export_hf_checkpoint(*m, out, o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GT(summary->shards, 1);
  const Json qc = Json::parse(slurp(out + "/config.json"))["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "fp8");
  EXPECT_EQ(qc["fmt"], "e4m3");
  EXPECT_EQ(qc["activation_scheme"], "dynamic");
  EXPECT_EQ(qc["weight_block_size"], Json::array({128, 128}));

  auto ckpt = Checkpoint::Open(out);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto want = m->export_weights(WeightFormat::kFP8);
  ASSERT_TRUE(want.ok());
  int64_t fp8_tensors = 0;
  for (const NamedTensor& t : want->tensors) {
    ASSERT_TRUE(ckpt->has(t.name)) << t.name;
    auto info = ckpt->info(t.name);
    EXPECT_EQ(info->dtype, t.dtype) << t.name;
    EXPECT_EQ(info->shape, t.shape) << t.name;
    EXPECT_EQ(*ckpt->raw(t.name), t.bytes) << t.name;
    fp8_tensors += t.dtype == DType::kF8E4M3;
  }
  EXPECT_EQ(fp8_tensors, 2 * 7);
  EXPECT_EQ(ckpt->names().size(), want->tensors.size());
  // 272x160 up_proj: scale_inv is [3, 2].
  EXPECT_EQ(ckpt->info("model.layers.0.mlp.up_proj.weight_scale_inv")->shape,
            std::vector<int64_t>({3, 2}));

  // An FP8 model loaded from it runs the same codes: identical logits.
  auto back = Model::Load(out, fp8);
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<int32_t> tokens = {5, 9, 13, 2, 44, 61};
  auto a = engine::cpu_logits(*m, tokens);
  auto b = engine::cpu_logits(**back, tokens);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(HfExport, CopiesTokenizerFilesAndKeepsTheirGenerationConfig) {
  auto m = random_model({}, /*tied=*/true, 7);
  testing::TempDir tmp;
  const std::string src = tmp / "src";
  stdfs::create_directory(src);
  const std::string gen = R"({"bos_token_id": 1, "eos_token_id": [2, 5, 6]})";
  ASSERT_TRUE(write_file_atomic(src + "/tokenizer.json", R"({"model": {"type": "BPE"}})").ok());
  ASSERT_TRUE(write_file_atomic(src + "/tokenizer_config.json", R"({"eos_token": "x"})").ok());
  ASSERT_TRUE(write_file_atomic(src + "/generation_config.json", gen).ok());
  ASSERT_TRUE(write_file_atomic(src + "/notes.txt", "not a tokenizer file").ok());
  HfExportOptions o;
  o.side_files_dir = src;
  auto summary = export_hf_checkpoint(*m, tmp / "out", o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->shards, 1);
  EXPECT_EQ(summary->copied_files,
            std::vector<std::string>(
                {"generation_config.json", "tokenizer.json", "tokenizer_config.json"}));
  EXPECT_EQ(listing(tmp / "out"),
            std::vector<std::string>({"config.json", "generation_config.json", "model.safetensors",
                                      "tokenizer.json", "tokenizer_config.json"}));
  EXPECT_EQ(slurp(tmp / "out/generation_config.json"), gen);
  EXPECT_EQ(slurp(tmp / "out/tokenizer.json"), slurp(src + "/tokenizer.json"));
  // Tied: no lm_head tensor, as Hugging Face writes tied checkpoints.
  auto ckpt = Checkpoint::Open(tmp / "out");
  ASSERT_TRUE(ckpt.ok());
  EXPECT_FALSE(ckpt->has("lm_head.weight"));
}

TEST(HfExport, BadOptionsFailAndLeaveNothing) {
  auto m = random_model({}, false, 9);
  testing::TempDir tmp;
  HfExportOptions o;
  o.max_shard_bytes = 0;
  auto s = export_hf_checkpoint(*m, tmp / "a", o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("max_shard_bytes"), std::string::npos) << s.status();
  o.max_shard_bytes = 1000;
  o.side_files_dir = tmp / "missing";
  s = export_hf_checkpoint(*m, tmp / "a", o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("side_files_dir"), std::string::npos) << s.status();
  o.side_files_dir.clear();
  s = export_hf_checkpoint(*m, tmp / "no/such/parent", o);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(listing(tmp.path()), std::vector<std::string>());
}

// Encodes x (exactly representable) as IEEE binary16: the test picks values k * 2^-10 with
// |k| < 2048, so no rounding decision is needed.
uint16_t exact_f16(int k) {
  if (k == 0) return 0;
  const uint16_t sign = k < 0 ? 0x8000 : 0;
  int a = k < 0 ? -k : k;
  int e = 0;  // a = 1.m * 2^e
  while ((a >> (e + 1)) != 0) ++e;
  const int mant = (a << (10 - e)) & 0x3FF;
  const int exp = e - 10 + 15;  // value = a * 2^-10
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

// A Hugging Face style checkpoint: F16, three shards with an index, tied embeddings without
// lm_head, no k/v scales, plus a tensor the engine does not use (rotary inv_freq).
TEST(HfLoad, ShardedF16CheckpointLoads) {
  ModelConfig c = testing::make_config(50, 64, 96, 2, 4, 2, /*tied=*/true, /*qwen2=*/true);
  ParamLayout layout(c);
  testing::TempDir tmp;
  const std::string dir = tmp / "f16";
  stdfs::create_directory(dir);
  ASSERT_TRUE(write_file_atomic(dir + "/config.json", model_config_to_json(c)).ok());
  Rng rng(11);
  std::vector<float> want(layout.total());
  std::vector<SafetensorsWriter> shards(3);
  Json weight_map = Json::object();
  size_t i = 0;
  for (const ParamInfo& p : layout.params()) {
    std::vector<uint8_t> bytes(2 * p.numel);
    for (int64_t j = 0; j < p.numel; ++j) {
      const int k = static_cast<int>(rng.next() % 4001) - 2000;
      want[p.offset + j] = static_cast<float>(k) / 1024.0f;
      const uint16_t h = exact_f16(k);
      ASSERT_EQ(f16_to_f32(h), want[p.offset + j]);
      std::memcpy(bytes.data() + 2 * j, &h, 2);
    }
    const size_t s = i++ % 3;
    ASSERT_TRUE(shards[s].add(p.name, DType::kF16, p.shape, std::move(bytes)).ok());
    weight_map[p.name] = shard_file_name(s + 1, 3);
  }
  ASSERT_TRUE(shards[0].add_f32("model.rotary_emb.inv_freq", {8}, std::vector<float>(8, 1)).ok());
  weight_map["model.rotary_emb.inv_freq"] = shard_file_name(1, 3);
  for (size_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(shards[s].write(dir + "/" + shard_file_name(s + 1, 3)).ok());
  }
  const Json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  ASSERT_TRUE(write_file_atomic(dir + "/model.safetensors.index.json", index.dump()).ok());

  auto m = Model::Load(dir, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(std::equal(want.begin(), want.end(), (*m)->params().begin()));
  EXPECT_EQ((*m)->kv_scales().k, std::vector<float>(2, 1.0f));

  // A shard missing from the folder is an error naming it.
  stdfs::remove(dir + "/" + shard_file_name(3, 3));
  auto bad = Model::Load(dir, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(shard_file_name(3, 3)), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace fp8rl::model
