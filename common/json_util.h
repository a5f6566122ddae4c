// Strict JSON parsing for files we validate (safetensors headers, checkpoint indexes, configs):
// errors name the file, and duplicate object keys are rejected instead of silently overwritten.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fp8rl {

// Deepest nesting of arrays and objects parse_json_strict accepts. nlohmann parses any depth,
// but copying or dumping a value recurses once per level: a 200 KB body of 100k nested arrays
// overflowed the stack of the thread that copied it (found while writing fuzz/fuzz_rest_submit.cc).
// Every document fp8rl reads nests fewer than 10 levels.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text`; `what` names the source in errors ("<what>: malformed JSON: ..."). Object keys
// keep their file order, so a read-modify-write round trip (config.json) keeps the layout. Nesting
// deeper than kMaxJsonDepth is an error.
absl::StatusOr<nlohmann::ordered_json> parse_json_strict(std::string_view text,
                                                         const std::string& what);

// The JSON type name of a value ("object", "array", "string", "number", ...), for error messages.
std::string json_type_name(const nlohmann::ordered_json& value);

}  // namespace fp8rl
