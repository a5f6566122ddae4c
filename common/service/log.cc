// Structured key=value log lines (see log.h).
#include "common/service/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fp8rl::service {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_write_mu;  // serializes writes to stderr, one whole line at a time

bool needs_quotes(std::string_view value) {
  if (value.empty()) return true;
  for (char c : value) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      return true;
    }
  }
  return false;
}

void append_value(std::string& out, std::string_view value) {
  if (!needs_quotes(value)) {
    out.append(value);
    return;
  }
  out.push_back('"');
  for (char c : value) {
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\t':
        out.append("\\t");
        break;
      case '\r':
        out.append("\\r");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int64_t millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(millis));
}

}  // namespace

absl::StatusOr<LogLevel> parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(absl::StrCat(
      "log_level: must be one of debug, info, warn, error; got '", std::string(name), "'"));
}

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

std::string format_log_line(LogLevel level, std::string_view component, std::string_view message,
                            std::initializer_list<LogField> fields) {
  std::string line = absl::StrCat("ts=", utc_timestamp(),
                                  " level=", std::string(log_level_name(level)), " component=");
  append_value(line, component);
  line.append(" msg=");
  append_value(line, message);
  for (const auto& [key, value] : fields) {
    line.push_back(' ');
    line.append(key);
    line.push_back('=');
    append_value(line, value);
  }
  return line;
}

void log(LogLevel level, std::string_view component, std::string_view message,
         std::initializer_list<LogField> fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::string line = format_log_line(level, component, message, fields);
  line.push_back('\n');
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace fp8rl::service
