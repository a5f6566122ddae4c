// Submission-time checks of a model.checkpoint folder (see model_checkpoint.h).
#include "rl/model_checkpoint.h"

#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/json_util.h"
#include "rl/chat_template.h"
#include "rl/hf_tokenizer.h"
#include "rl/tokenizer.h"

namespace fp8rl::rl {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::ordered_json;

absl::Status bad(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("model.checkpoint: ", message));
}

// The status of a helper that names its file, as a model.checkpoint error.
absl::Status bad(const absl::Status& s) { return bad(s.message()); }

absl::StatusOr<Json> read_json_object(const stdfs::path& path) {
  absl::StatusOr<std::string> text = read_text_file(path.string());
  if (!text.ok()) return bad(text.status());
  absl::StatusOr<Json> j = parse_json_strict(*text, path.string());
  if (!j.ok()) return bad(j.status());
  if (!j->is_object()) return bad(absl::StrCat(path.string(), ": must be a JSON object"));
  return j;
}

absl::Status check_weights(const stdfs::path& dir) {
  std::error_code ec;
  if (stdfs::is_regular_file(dir / "model.safetensors", ec)) return absl::OkStatus();
  const stdfs::path index_path = dir / "model.safetensors.index.json";
  if (!stdfs::is_regular_file(index_path, ec)) {
    return bad(absl::StrCat(dir.string(),
                            " holds neither model.safetensors nor model.safetensors.index.json"));
  }
  absl::StatusOr<Json> index = read_json_object(index_path);
  if (!index.ok()) return index.status();
  if (!index->contains("weight_map") || !(*index)["weight_map"].is_object() ||
      (*index)["weight_map"].empty()) {
    return bad(absl::StrCat(index_path.string(), ": weight_map must be a non-empty object"));
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : (*index)["weight_map"].items()) {
    if (!file.is_string()) {
      return bad(absl::StrCat(index_path.string(), ": weight_map['", name, "'] is not a string"));
    }
    shards.insert(file.get<std::string>());
  }
  for (const std::string& shard : shards) {
    if (shard.find('/') != std::string::npos || !stdfs::is_regular_file(dir / shard, ec)) {
      return bad(absl::StrCat(index_path.string(), " names shard '", shard,
                              "', which is not a file in the folder"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelCheckpointInfo> check_model_checkpoint(const std::string& dir_name) {
  const stdfs::path dir(dir_name);
  std::error_code ec;
  if (!stdfs::exists(dir, ec)) return bad(absl::StrCat(dir_name, " does not exist"));
  if (!stdfs::is_directory(dir, ec)) return bad(absl::StrCat(dir_name, " is not a folder"));
  ModelCheckpointInfo info;

  const stdfs::path config_path = dir / "config.json";
  if (!stdfs::is_regular_file(config_path, ec)) {
    return bad(absl::StrCat(dir_name, " has no config.json"));
  }
  absl::StatusOr<Json> config = read_json_object(config_path);
  if (!config.ok()) return config.status();
  const auto vocab = config->find("vocab_size");
  if (vocab == config->end() || !vocab->is_number_integer() || vocab->get<int64_t>() <= 0) {
    return bad(absl::StrCat(config_path.string(), ": vocab_size must be a positive integer"));
  }
  info.vocab_size = vocab->get<int64_t>();
  if (absl::Status s = check_weights(dir); !s.ok()) return s;

  if (!stdfs::exists(dir / "tokenizer.json", ec)) {
    if (info.vocab_size < kTokenizerVocabSize) {
      return bad(absl::StrCat(
          dir_name, " has no tokenizer.json, so the job would use the byte tokenizer (",
          kTokenizerVocabSize, " ids), but config.json vocab_size is ", info.vocab_size));
    }
    return info;
  }
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::load(dir_name);
  if (!tok.ok()) return bad(tok.status());
  info.has_tokenizer = true;
  info.tokenizer_vocab_size = tok->vocab_size();
  if (info.tokenizer_vocab_size > info.vocab_size) {
    return bad(absl::StrCat("tokenizer.json has ids up to ", info.tokenizer_vocab_size - 1,
                            " but config.json vocab_size is ", info.vocab_size));
  }
  info.stop_ids = tok->eos_ids();
  if (info.stop_ids.empty()) {
    return bad(absl::StrCat(dir_name,
                            ": no EOS token (set eos_token in tokenizer_config.json or "
                            "eos_token_id in generation_config.json); generation could not stop"));
  }
  const stdfs::path tc_path = dir / "tokenizer_config.json";
  if (stdfs::exists(tc_path, ec)) {
    absl::StatusOr<Json> tc = read_json_object(tc_path);
    if (!tc.ok()) return tc.status();
    absl::StatusOr<std::string> source = ChatTemplateFromTokenizerConfig(*tc);
    if (source.ok()) {
      absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(*source);
      if (!parsed.ok()) {
        return bad(absl::StrCat(tc_path.string(), ": chat_template: ", parsed.status().message()));
      }
      info.has_chat_template = true;
    } else if (source.status().code() != absl::StatusCode::kNotFound) {
      return bad(absl::StrCat(tc_path.string(), ": ", source.status().message()));
    }
  }
  return info;
}

}  // namespace fp8rl::rl
