// Error messages that say where they came from.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fp8rl {

// `s` with `prefix` put before its message (same code); OK stays OK:
//   return with_prefix(s, "publish: ");
inline absl::Status with_prefix(const absl::Status& s, std::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(std::string(prefix), s.message()));
}

}  // namespace fp8rl
