// Fuzz target: a job config as a user submits it (YAML, or JSON when it starts with '{') through
// parse_job_config. An accepted config must survive the coordinator's storage round trip:
// job_config_to_json, dumped and parsed again, gives an equal config.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rl/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fp8rl::rl::JobConfig> config = fp8rl::rl::parse_job_config(text);
  if (!config.ok()) return 0;
  const std::string stored = fp8rl::rl::job_config_to_json(*config).dump();
  absl::StatusOr<fp8rl::rl::JobConfig> again = fp8rl::rl::parse_job_config(stored);
  if (!again.ok() || !(*again == *config)) __builtin_trap();
  return 0;
}
