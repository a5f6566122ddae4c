// Checkpoint folders: single-file and sharded reading, index consistency errors, atomic writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "common/fs.h"
#include "common/safetensors.h"
#include "tests/unit/common/temp_dir.h"

namespace fp8rl {
namespace {

using testing_util::TempDir;
namespace stdfs = std::filesystem;

constexpr char kConfig[] = R"({"model_type": "llama", "num_hidden_layers": 2})";

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(0.1f, 3.0f);
  std::vector<float> out(n);
  for (float& v : out) v = (rng() % 2 ? 1.0f : -1.0f) * dist(rng);
  return out;
}

// Writes shard files and an index mapping each tensor to its shard, into dir.
void write_sharded(const std::string& dir,
                   const std::vector<std::vector<std::pair<std::string, int>>>& shards,
                   const std::string& extra_weight_map = "") {
  std::string weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string shard = "model-0000" + std::to_string(s + 1) + "-of-0000" +
                              std::to_string(shards.size()) + ".safetensors";
    SafetensorsWriter w;
    for (const auto& [name, seed] : shards[s]) {
      ASSERT_TRUE(w.add_f32(name, {2, 4}, random_values(8, seed)).ok());
      if (weight_map.find("\"" + name + "\"") != std::string::npos) continue;  // first wins
      if (!weight_map.empty()) weight_map += ",";
      weight_map += "\"" + name + "\":\"" + shard + "\"";
    }
    ASSERT_TRUE(w.write(dir + "/" + shard).ok());
  }
  if (!extra_weight_map.empty()) weight_map += "," + extra_weight_map;
  ASSERT_TRUE(
      write_file_atomic(dir + "/model.safetensors.index.json",
                        R"({"metadata":{"total_size":1},"weight_map":{)" + weight_map + "}}")
          .ok());
  ASSERT_TRUE(write_file_atomic(dir + "/config.json", kConfig).ok());
}

void expect_error(const absl::StatusOr<Checkpoint>& c, const std::vector<std::string>& needles) {
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
}

TEST(Checkpoint, ReadsSingleFileFolder) {
  TempDir tmp;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add_f32("model.embed_tokens.weight", {4, 3}, random_values(12, 1)).ok());
  ASSERT_TRUE(w.add_f32("lm_head.weight", {4, 3}, random_values(12, 2)).ok());
  ASSERT_TRUE(w.write(tmp.file("model.safetensors")).ok());
  ASSERT_TRUE(write_file_atomic(tmp.file("config.json"), kConfig).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::Open(tmp.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config_json(), kConfig);
  EXPECT_EQ(c->names(), (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight"}));
  EXPECT_EQ(*c->read_f32("lm_head.weight"), random_values(12, 2));
  EXPECT_EQ(c->info("model.embed_tokens.weight")->shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(c->raw("absent").status().code(), absl::StatusCode::kNotFound);
}

TEST(Checkpoint, ReadsShardedFolder) {
  TempDir tmp;
  write_sharded(tmp.path(), {{{"a.weight", 1}, {"b.weight", 2}}, {{"c.weight", 3}}});
  absl::StatusOr<Checkpoint> c = Checkpoint::Open(tmp.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->names(), (std::vector<std::string>{"a.weight", "b.weight", "c.weight"}));
  EXPECT_EQ(*c->read_f32("b.weight"), random_values(8, 2));
  EXPECT_EQ(*c->read_f32("c.weight"), random_values(8, 3));
  EXPECT_TRUE(c->has("a.weight"));
  EXPECT_FALSE(c->has("d.weight"));
}

TEST(Checkpoint, DuplicateNameAcrossShardsIsAnError) {
  TempDir tmp;
  write_sharded(tmp.path(), {{{"a.weight", 1}}, {{"a.weight", 2}, {"b.weight", 3}}});
  expect_error(Checkpoint::Open(tmp.path()),
               {"'a.weight'", "model-00001-of-00002", "model-00002-of-00002"});
}

TEST(Checkpoint, MissingShardIsAnError) {
  TempDir tmp;
  write_sharded(tmp.path(), {{{"a.weight", 1}}, {{"b.weight", 2}}});
  stdfs::remove(tmp.file("model-00002-of-00002.safetensors"));
  expect_error(Checkpoint::Open(tmp.path()), {"model-00002-of-00002.safetensors", "missing"});
}

TEST(Checkpoint, IndexMustMatchShards) {
  TempDir tmp;
  write_sharded(tmp.path(), {{{"a.weight", 1}}},
                R"("ghost.weight":"model-00001-of-00001.safetensors")");
  expect_error(Checkpoint::Open(tmp.path()), {"'ghost.weight'", "does not hold it"});

  TempDir tmp2;
  write_sharded(tmp2.path(), {{{"a.weight", 1}}});
  ASSERT_TRUE(write_file_atomic(tmp2.file("model.safetensors.index.json"),
                                R"({"weight_map":{"a.weight":"../x.safetensors"}})")
                  .ok());
  expect_error(Checkpoint::Open(tmp2.path()), {"'../x.safetensors'", "not a file name"});
  ASSERT_TRUE(write_file_atomic(tmp2.file("model.safetensors.index.json"), R"({"x":1})").ok());
  expect_error(Checkpoint::Open(tmp2.path()), {"weight_map"});
}

TEST(Checkpoint, MissingPiecesAreClearErrors) {
  TempDir tmp;
  expect_error(Checkpoint::Open(tmp.file("nope")), {"nope", "does not exist"});
  expect_error(Checkpoint::Open(tmp.path()), {"config.json", "not found"});
  ASSERT_TRUE(write_file_atomic(tmp.file("config.json"), "{\"a\": ").ok());
  expect_error(Checkpoint::Open(tmp.path()), {"config.json", "malformed JSON"});
  ASSERT_TRUE(write_file_atomic(tmp.file("config.json"), kConfig).ok());
  expect_error(Checkpoint::Open(tmp.path()), {"model.safetensors.index.json"});
  ASSERT_TRUE(write_file_atomic(tmp.file("model.safetensors"), "garbage!").ok());
  expect_error(Checkpoint::Open(tmp.path()), {"model.safetensors", "header length"});
}

TEST(Checkpoint, WriteCheckpointRoundTripsAndReplacesAtomically) {
  TempDir tmp;
  const std::string out = tmp.file("out");
  ASSERT_TRUE(write_file_atomic(tmp.file("tokenizer.json"), R"({"vocab": [1, 2]})").ok());
  SafetensorsWriter w;
  ASSERT_TRUE(w.add_f32("x.weight", {2, 4}, random_values(8, 9)).ok());
  ASSERT_TRUE(write_checkpoint(out, kConfig, w, {tmp.file("tokenizer.json")}).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::Open(out);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c->read_f32("x.weight"), random_values(8, 9));
  EXPECT_EQ(*read_text_file(out + "/tokenizer.json"), R"({"vocab": [1, 2]})");

  // A failed write (a file to copy is missing) leaves the previous checkpoint intact.
  SafetensorsWriter w2;
  ASSERT_TRUE(w2.add_f32("y.weight", {8}, random_values(8, 10)).ok());
  EXPECT_FALSE(write_checkpoint(out, kConfig, w2, {tmp.file("absent.txt")}).ok());
  EXPECT_TRUE(Checkpoint::Open(out)->has("x.weight"));
  EXPECT_EQ(tmp.entries(), (std::vector<std::string>{"out", "tokenizer.json"}));

  // A successful one replaces it.
  ASSERT_TRUE(write_checkpoint(out, kConfig, w2).ok());
  c = Checkpoint::Open(out);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->names(), std::vector<std::string>{"y.weight"});
  EXPECT_FALSE(stdfs::exists(out + "/tokenizer.json"));
  EXPECT_EQ(tmp.entries(), (std::vector<std::string>{"out", "tokenizer.json"}));
}

}  // namespace
}  // namespace fp8rl
