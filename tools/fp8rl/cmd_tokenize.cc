// `fp8rl tokenize`: encodes and decodes JSON lines with a checkpoint's Hugging Face tokenizer, so a
// user can check what fp8rl feeds the model (and compare it with transformers) before a job runs.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "rl/hf_tokenizer.h"
#include "tools/fp8rl/args.h"
#include "tools/fp8rl/command.h"

namespace fp8rl::cli {
namespace {

using Json = nlohmann::json;

constexpr char kName[] = "tokenize";

// One input line -> one output line. `where` is "FILE:LINE" for errors.
absl::StatusOr<std::string> tokenize_line(const rl::HfTokenizer& tok, const std::string& line,
                                          const std::string& where) {
  Json req;
  try {
    req = Json::parse(line);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": malformed JSON: ", e.what()));
  }
  if (!req.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  if (req.contains("messages")) {
    return absl::UnimplementedError(
        absl::StrCat(where,
                     ": \"messages\" needs the chat template, which fp8rl tokenize does "
                     "not support yet; give {\"text\": ...} or {\"ids\": [...]}"));
  }
  const bool has_text = req.contains("text");
  const bool has_ids = req.contains("ids");
  if (has_text == has_ids) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected exactly one of \"text\" or \"ids\""));
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
    absl::StatusOr<std::string> result = tokenize_line(*tok, line, where);
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
