// --device and --gpu-memory-fraction of the model commands (`fp8rl generate|score`): resolved
// with model::select_device and printed as one stderr line, as the generation worker logs it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/device.h"
#include "tools/fp8rl/args.h"

namespace fp8rl::cli {

struct CliDevice {
  model::DeviceSelection selection;
  int64_t gpu_memory_budget_bytes = 0;  // cuda only: floor(fraction * device memory)
};

// model::probe_cuda_device for a command whose CUDA path exists only when `cuda_path_reason` is
// empty: otherwise a visible device is not offered (auto stays on the CPU, `cuda` is refused) and
// the reason is the probe's detail.
model::DeviceProbe command_probe(std::string cuda_path_reason);

// Reads --device (cuda|cpu|auto; default auto) and --gpu-memory-fraction ((0, 1]; default 0.9)
// from `args`, probes with `probe`, and prints "fp8rl <command>: <selection>" on stderr when the
// choice is cuda. Errors are one line naming the flag (the caller prints them and exits non-zero).
absl::StatusOr<CliDevice> resolve_device_flags(const Args& args, const char* command,
                                               const model::DeviceProbe& probe);

}  // namespace fp8rl::cli
