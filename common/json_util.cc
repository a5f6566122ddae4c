// Strict JSON parsing (file-named errors, duplicate keys rejected) shared by checkpoint readers.
#include "common/json_util.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fp8rl {

namespace {

// nlohmann's message without the input text it quotes ("...; last read: 'xy'"), so an error about
// a file never carries the file's contents.
std::string json_error_without_input(const std::exception& e) {
  std::string message = e.what();
  const size_t quoted = message.find("; last read: ");
  if (quoted != std::string::npos) message.erase(quoted);
  return message;
}

}  // namespace

absl::StatusOr<nlohmann::ordered_json> parse_json_strict(std::string_view text,
                                                         const std::string& what) {
  // One key set per open object; a key seen twice in the same object is an error.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool too_deep = false;
  auto check = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                   nlohmann::ordered_json& parsed) {
    using Event = nlohmann::ordered_json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth) {
      too_deep = true;
      return false;  // drop the value; the parser itself does not recurse
    }
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Event::key && !open_objects.empty() && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second) duplicate = key;
    }
    return true;
  };
  nlohmann::ordered_json value;
  try {
    value = nlohmann::ordered_json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": malformed JSON: ", json_error_without_input(e)));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": malformed JSON: arrays and objects nested deeper than ", kMaxJsonDepth));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": malformed JSON: duplicate key '", duplicate, "'"));
  }
  return value;
}

std::string json_type_name(const nlohmann::ordered_json& value) { return value.type_name(); }

}  // namespace fp8rl
