// Structured logging for the services: one line per event, key=value pairs, with a timestamp, a
// level and the component, so logs of several processes can be merged and grepped.
//
//   log_info("coordinator", "job started", {{"job", id}, {"steps", "20"}});
//   -> ts=2024-05-01T12:00:00.123Z level=info component=coordinator msg="job started" job=...
//   steps=20
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"

namespace fp8rl::service {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

using LogField = std::pair<std::string_view, std::string>;

// "debug" | "info" | "warn" | "error".
absl::StatusOr<LogLevel> parse_log_level(std::string_view name);
std::string_view log_level_name(LogLevel level);

// Events below this level are dropped (default info). Thread-safe.
void set_log_level(LogLevel level);
LogLevel log_level();

// Formats one line (no trailing newline): values with spaces, quotes, '=' or control characters
// are quoted and escaped; empty values are written as "".
std::string format_log_line(LogLevel level, std::string_view component, std::string_view message,
                            std::initializer_list<LogField> fields);

// Writes the formatted line to stderr (whole lines, never interleaved between threads).
void log(LogLevel level, std::string_view component, std::string_view message,
         std::initializer_list<LogField> fields = {});

inline void log_debug(std::string_view component, std::string_view message,
                      std::initializer_list<LogField> fields = {}) {
  log(LogLevel::kDebug, component, message, fields);
}
inline void log_info(std::string_view component, std::string_view message,
                     std::initializer_list<LogField> fields = {}) {
  log(LogLevel::kInfo, component, message, fields);
}
inline void log_warn(std::string_view component, std::string_view message,
                     std::initializer_list<LogField> fields = {}) {
  log(LogLevel::kWarn, component, message, fields);
}
inline void log_error(std::string_view component, std::string_view message,
                      std::initializer_list<LogField> fields = {}) {
  log(LogLevel::kError, component, message, fields);
}

}  // namespace fp8rl::service
