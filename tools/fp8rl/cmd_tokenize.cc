// `fp8rl tokenize`: encodes and decodes JSON lines with a checkpoint's Hugging Face tokenizer and
// renders chat messages with its chat template, so a user can check what fp8rl feeds the model
// (and compare it with transformers) before a job runs.
//   {"text": ..., "add_special_tokens"?: bool}            -> {"ids": [...]}
//   {"ids": [...], "skip_special_tokens"?: bool}          -> {"text": ...}
//   {"messages": [...], "add_generation_prompt"?: bool, "tools"?: [...], "kwargs"?: {...}}
//                                                         -> {"text": rendered, "ids": [...]}
// The messages form renders tokenizer_config.json's chat_template like transformers'
// apply_chat_template (bos_token / eos_token from that file, kwargs as extra template
// variables) and encodes the text without adding special tokens (the template writes them).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "rl/chat_template.h"
#include "rl/hf_tokenizer.h"
#include "rl/prompt_format.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"

namespace fp8rl::cli {
namespace {

// Ordered: message objects keep their key order, which templates' tojson prints.
using Json = nlohmann::ordered_json;

constexpr char kName[] = "tokenize";

// What a messages line needs besides the tokenizer: the folder's chat template and tokens. A
// template that fails to load fails the messages lines only; text and ids lines do not need it.
struct ChatContext {
  absl::StatusOr<rl::ChatTemplateFiles> files;
  std::string config_path;  // DIR/tokenizer_config.json, for errors
};

absl::StatusOr<Json> render_messages(const rl::HfTokenizer& tok, const ChatContext& chat,
                                     const Json& req, const std::string& where) {
  for (const auto& [key, value] : req.items()) {
    if (key != "messages" && key != "add_generation_prompt" && key != "tools" && key != "kwargs") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field \"", key, "\""));
    }
  }
  if (!chat.files.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"messages\": ", chat.files.status().message()));
  }
  if (!chat.files->chat_template.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"messages\": ", chat.config_path, " has no chat_template"));
  }
  rl::ChatTemplateInputs inputs;
  inputs.messages = req["messages"];
  if (!inputs.messages.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"messages\": expected an array of message objects"));
  }
  for (size_t i = 0; i < inputs.messages.size(); ++i) {
    if (!inputs.messages[i].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"messages\"[", i, "]: expected an object"));
    }
  }
  if (req.contains("add_generation_prompt")) {
    if (!req["add_generation_prompt"].is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"add_generation_prompt\": expected true or false"));
    }
    inputs.add_generation_prompt = req["add_generation_prompt"].get<bool>();
  }
  if (req.contains("tools")) {
    inputs.tools = req["tools"];
    if (!inputs.tools.is_array() && !inputs.tools.is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"tools\": expected an array of tool schemas or null"));
    }
  }
  if (req.contains("kwargs")) {
    inputs.kwargs = req["kwargs"];
    if (!inputs.kwargs.is_object() && !inputs.kwargs.is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"kwargs\": expected an object of template variables"));
    }
  }
  inputs.bos_token = chat.files->bos_token;
  inputs.eos_token = chat.files->eos_token;
  absl::StatusOr<std::string> text = chat.files->chat_template->Render(inputs);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": chat template: ", text.status().message()));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tok.encode(*text, /*add_special_tokens=*/false);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rendered text: ", ids.status().message()));
  }
  Json out = Json::object();
  out["text"] = *text;
  out["ids"] = *ids;
  return out;
}

// One input line -> one output line. `where` is "FILE:LINE" for errors.
absl::StatusOr<std::string> tokenize_line(const rl::HfTokenizer& tok, const ChatContext& chat,
                                          const std::string& line, const std::string& where) {
  Json req;
  try {
    req = Json::parse(line);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": malformed JSON: ", e.what()));
  }
  if (!req.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  const bool has_text = req.contains("text");
  const bool has_ids = req.contains("ids");
  const bool has_messages = req.contains("messages");
  if (static_cast<int>(has_text) + static_cast<int>(has_ids) + static_cast<int>(has_messages) !=
      1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected exactly one of \"text\", \"ids\" or \"messages\""));
  }
  if (has_messages) {
    absl::StatusOr<Json> out = render_messages(tok, chat, req, where);
    if (!out.ok()) return out.status();
    return out->dump();
  }
  for (const auto& [key, value] : req.items()) {
    const bool known = has_text ? (key == "text" || key == "add_special_tokens")
                                : (key == "ids" || key == "skip_special_tokens");
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field \"", key, "\""));
    }
  }
  auto flag = [&](const char* key) -> absl::StatusOr<bool> {
    if (!req.contains(key)) return false;
    if (!req[key].is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", key, "\": expected true or false"));
    }
    return req[key].get<bool>();
  };
  Json out = Json::object();
  if (has_text) {
    if (!req["text"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"text\": expected a string"));
    }
    absl::StatusOr<bool> add_special = flag("add_special_tokens");
    if (!add_special.ok()) return add_special.status();
    absl::StatusOr<std::vector<int32_t>> ids =
        tok.encode(req["text"].get<std::string>(), *add_special);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"text\": ", ids.status().message()));
    }
    out["ids"] = *ids;
  } else {
    const Json& list = req["ids"];
    if (!list.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"ids\": expected an array"));
    }
    std::vector<int32_t> ids;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_number_integer() || list[i].get<int64_t>() < 0 ||
          list[i].get<int64_t>() >= tok.vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": \"ids\"[", i,
                                                       "]: expected a token id below ",
                                                       tok.vocab_size(), ", got ", list[i].dump()));
      }
      ids.push_back(list[i].get<int32_t>());
    }
    absl::StatusOr<bool> skip_special = flag("skip_special_tokens");
    if (!skip_special.ok()) return skip_special.status();
    absl::StatusOr<std::string> bytes = tok.decode(ids, *skip_special);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", bytes.status().message()));
    }
    // JSON text is UTF-8: bytes that do not form UTF-8 become U+FFFD, as in transformers.
    out["text"] = rl::HfTokenizer::to_valid_utf8(*bytes);
  }
  return out.dump();
}

absl::Status run_tokenize(const std::string& dir, const std::string& in_path,
                          const std::string& out_path) {
  absl::StatusOr<rl::HfTokenizer> tok = rl::HfTokenizer::load(dir);
  if (!tok.ok()) return tok.status();
  const ChatContext chat{rl::load_chat_template_files(dir),
                         absl::StrCat(dir, "/tokenizer_config.json")};
  std::ifstream in(in_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(in_path, ": cannot open"));
  std::string output;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string where = absl::StrCat(in_path, ":", line_no);
    if (line.find_first_not_of(" \t") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty line"));
    }
    absl::StatusOr<std::string> result = tokenize_line(*tok, chat, line, where);
    if (!result.ok()) return result.status();
    absl::StrAppend(&output, *result, "\n");
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(in_path, ": read error"));
  // Written to a temporary file and renamed: a failure never leaves a partial output.
  if (absl::Status s = write_file_atomic(out_path, output); !s.ok()) return s;
  std::fprintf(stderr, "fp8rl tokenize: %lld lines -> %s\n", static_cast<long long>(line_no),
               out_path.c_str());
  return absl::OkStatus();
}

}  // namespace

int tokenize_main(const std::vector<std::string>& argv) {
  FlagSpec spec;
  spec.value_flags = {"tokenizer", "in", "out"};
  absl::StatusOr<Args> args = Args::Parse(argv, spec);
  if (!args.ok()) return usage_error(kName, std::string(args.status().message()));
  std::vector<std::string> values;
  for (const char* flag : {"tokenizer", "in", "out"}) {
    absl::StatusOr<std::string> v = args->required(flag);
    if (!v.ok()) return usage_error(kName, std::string(v.status().message()));
    values.push_back(*v);
  }
  if (absl::Status s = run_tokenize(values[0], values[1], values[2]); !s.ok()) {
    return failure(kName, std::string(s.message()));
  }
  return 0;
}

}  // namespace fp8rl::cli
