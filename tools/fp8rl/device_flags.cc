// --device / --gpu-memory-fraction of `fp8rl generate|score` (see device_flags.h).
#include "tools/fp8rl/device_flags.h"

#include <cstdio>

namespace fp8rl::cli {

model::DeviceProbe command_probe(std::string cuda_path_reason) {
  return [reason = std::move(cuda_path_reason)] {
    model::DeviceProbeResult r = model::probe_cuda_device();
    if (r.device.has_value() && !reason.empty()) {
      r.detail = r.device->name + " visible, but " + reason;
      r.device.reset();
    }
    return r;
  };
}

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
  // Said only for cuda, so that a CPU run's errors stay one line.
  if (out.selection.device == model::Device::kCuda) {
    std::fprintf(stderr, "fp8rl %s: %s\n", command, out.selection.description.c_str());
  }
  return out;
}

}  // namespace fp8rl::cli
