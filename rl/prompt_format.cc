// Prompt tokens and completion text for byte and Hugging Face tokenizers (prompt_format.h).
#include "rl/prompt_format.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "rl/hf_tokenizer.h"
#include "rl/tokenizer.h"

namespace fp8rl::rl {

namespace {

class BytePromptTokenizer final : public PromptTokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> encode(std::string_view text) const override {
    return tokenizer_.encode(text);
  }
  std::string decode(std::span<const int32_t> ids) const override { return tokenizer_.decode(ids); }
  int32_t vocab_size() const override { return tokenizer_.vocab_size(); }

 private:
  ByteTokenizer tokenizer_;
};

class HfPromptTokenizer final : public PromptTokenizer {
 public:
  explicit HfPromptTokenizer(HfTokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {}
  absl::StatusOr<std::vector<int32_t>> encode(std::string_view text) const override {
    return tokenizer_.encode(text, /*add_special_tokens=*/false);
  }
  std::string decode(std::span<const int32_t> ids) const override {
    // Runs of valid ids are decoded together (a character may span tokens); an id outside the
    // vocabulary becomes U+FFFD.
    std::string bytes;
    size_t begin = 0;
    auto flush = [&](size_t end) {
      if (end > begin) {
        absl::StatusOr<std::string> part = tokenizer_.decode(ids.subspan(begin, end - begin));
        bytes += part.ok() ? *part : std::string(kUnknownTokenText);
      }
    };
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= tokenizer_.vocab_size()) {
        flush(i);
        bytes += kUnknownTokenText;
        begin = i + 1;
      }
    }
    flush(ids.size());
    return HfTokenizer::to_valid_utf8(bytes);
  }
  int32_t vocab_size() const override { return tokenizer_.vocab_size(); }

 private:
  HfTokenizer tokenizer_;
};

}  // namespace

absl::StatusOr<ChatTemplateFiles> load_chat_template_files(const std::string& dir) {
  ChatTemplateFiles out;
  const std::string path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  if (!std::filesystem::exists(path)) return out;
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": must be a JSON object"));
  }
  out.bos_token = SpecialTokenFromTokenizerConfig(config, "bos_token");
  out.eos_token = SpecialTokenFromTokenizerConfig(config, "eos_token");
  absl::StatusOr<std::string> source = ChatTemplateFromTokenizerConfig(config);
  if (absl::IsNotFound(source.status())) return out;
  if (!source.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", source.status().message()));
  }
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(*source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": chat_template: ", parsed.status().message()));
  }
  out.chat_template = *std::move(parsed);
  return out;
}

PromptFormat byte_prompt_format() {
  PromptFormat f;
  f.tokenizer = std::make_shared<BytePromptTokenizer>();
  f.bos_id = kBosId;
  f.stop_ids = {kEosId};
  return f;
}

absl::StatusOr<PromptFormat> load_prompt_format(const std::string& dir) {
  absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::load(dir);
  if (!tokenizer.ok()) return tokenizer.status();
  absl::StatusOr<ChatTemplateFiles> files = load_chat_template_files(dir);
  if (!files.ok()) return files.status();
  PromptFormat f;
  f.bos_id = tokenizer->bos_id();
  f.stop_ids = tokenizer->eos_ids();
  f.tokenizer = std::make_shared<HfPromptTokenizer>(*std::move(tokenizer));
  f.chat_template = std::move(files->chat_template);
  f.bos_token = std::move(files->bos_token);
  f.eos_token = std::move(files->eos_token);
  return f;
}

nlohmann::ordered_json chat_messages(const Example& example) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!example.system.empty()) {
    messages.push_back({{"role", "system"}, {"content", example.system}});
  }
  messages.push_back(
      {{"role", "user"}, {"content", example.user.empty() ? example.prompt : example.user}});
  return messages;
}

absl::StatusOr<std::string> render_prompt(const Example& example, const PromptFormat& format) {
  if (!format.chat_template.has_value()) return example.prompt;
  ChatTemplateInputs inputs;
  inputs.messages = chat_messages(example);
  inputs.add_generation_prompt = true;
  inputs.bos_token = format.bos_token;
  inputs.eos_token = format.eos_token;
  inputs.kwargs = format.template_kwargs;
  absl::StatusOr<std::string> text = format.chat_template->Render(inputs);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::vector<int32_t>> encode_prompt(const Example& example,
                                                   const PromptFormat& format) {
  if (format.tokenizer == nullptr) {
    return absl::FailedPreconditionError("prompt format: no tokenizer");
  }
  absl::StatusOr<std::string> text = render_prompt(example, format);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<int32_t>> ids = format.tokenizer->encode(*text);
  if (!ids.ok()) return ids.status();
  if (!format.chat_template.has_value() && format.bos_id.has_value()) {
    ids->insert(ids->begin(), *format.bos_id);
  }
  return ids;
}

std::string decode_completion(std::span<const int32_t> ids, const PromptFormat& format) {
  size_t end = 0;
  while (end < ids.size()) {
    bool stop = false;
    for (int32_t s : format.stop_ids) stop = stop || ids[end] == s;
    if (stop) break;
    ++end;
  }
  return format.tokenizer->decode(ids.subspan(0, end));
}

}  // namespace fp8rl::rl
