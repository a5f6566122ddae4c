// --device / --gpu-memory-fraction of `fp8rl generate|score` (see device_flags.h).
#include "tools/fp8rl/device_flags.h"

#include <cstdio>

namespace fp8rl::cli {

absl::StatusOr<CliDevice> resolve_device_flags(const Args& args, const char* command,
                                               const model::DeviceProbe& probe) {
  double fraction = model::kDefaultGpuMemoryFraction;
  if (std::optional<std::string> f = args.get("gpu-memory-fraction")) {
    absl::StatusOr<double> parsed = model::parse_gpu_memory_fraction(*f);
    if (!parsed.ok()) return parsed.status();
    fraction = *parsed;
  }
  absl::StatusOr<model::DeviceSelection> selection =
      model::select_device(args.get("device").value_or(""), probe);
  if (!selection.ok()) return selection.status();
  CliDevice out;
  out.selection = std::move(*selection);
  if (out.selection.cuda.has_value()) {
    out.gpu_memory_budget_bytes = model::gpu_memory_budget_bytes(*out.selection.cuda, fraction);
  }
  std::fprintf(stderr, "fp8rl %s: %s\n", command, out.selection.description.c_str());
  return out;
}

}  // namespace fp8rl::cli
