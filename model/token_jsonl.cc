// Strict JSONL token reader.
#include "model/token_jsonl.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/json_util.h"

namespace fp8rl::model {

absl::StatusOr<TokenLines> read_token_jsonl(const std::string& path, const std::string& key) {
  auto text = read_text_file(path);
  if (!text.ok()) return text.status();
  TokenLines out;
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    auto j = parse_json_strict(std::string(line), where);
    if (!j.ok()) return j.status();
    if (!j->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
    }
    auto it = j->find(key);
    if (it == j->end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing \"", key, "\""));
    }
    if (!it->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", key, ": expected an array of integers, got ", json_type_name(*it)));
    }
    std::vector<int32_t> tokens;
    tokens.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& v = (*it)[i];
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", key, "[", i, "]: expected an integer, got ", json_type_name(v)));
      }
      const int64_t t = v.get<int64_t>();
      if (t < 0 || t > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", key, "[", i, "]: token id ", t, " is out of range"));
      }
      tokens.push_back(static_cast<int32_t>(t));
    }
    out.rows.push_back(std::move(tokens));
    out.line.push_back(line_no);
  }
  return out;
}

}  // namespace fp8rl::model
