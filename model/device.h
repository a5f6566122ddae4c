// Where the model engine runs: `--device cuda|cpu` on the generation worker and on `fp8rl
// generate|score`, the CUDA device probe, and the `--gpu-memory-fraction` byte budget (see
// docs/design/gpu.md "The GPU path", device selection). The probe works in every build: a binary
// built without CUDA sees no device.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/inference_backend.h"  // model::Device

namespace fp8rl::model {

// One CUDA device the engine can run on: compute capability 9.0 exactly (the CUDA code is built
// for sm_90a, which runs on nothing else).
struct CudaDeviceInfo {
  int index = 0;  // CUDA runtime ordinal (after CUDA_VISIBLE_DEVICES)
  std::string name;
  int major = 0;
  int minor = 0;
  int64_t total_bytes = 0;  // device memory
};

// What a probe found: the first sm_90 device, or none and why ("built without CUDA", the CUDA
// runtime's error, or the devices seen and their compute capabilities).
struct DeviceProbeResult {
  std::optional<CudaDeviceInfo> device;
  std::string detail;
};

using DeviceProbe = std::function<DeviceProbeResult()>;

// The real probe: cudaGetDeviceCount + cudaGetDeviceProperties in a build with CUDA; in a build
// without, no device ("built without CUDA").
DeviceProbeResult probe_cuda_device();

// Whether this binary was built with the CUDA runtime linked (FP8RL_HAVE_CUDA).
bool built_with_cuda();

struct DeviceSelection {
  Device device = Device::kCpu;
  std::optional<CudaDeviceInfo> cuda;  // set when device is kCuda
  // One line for the start-up log: "device cuda (auto: NVIDIA H200, sm_90, 141 GiB)".
  std::string description;
};

// Resolves `requested` ("" or "auto": cuda when `probe` finds an sm_90 device, else cpu; "cpu":
// cpu without probing; "cuda": cuda, or FAILED_PRECONDITION "--device cuda: no sm_90 CUDA device
// (<why>)"). INVALID_ARGUMENT "--device: ..." for any other word.
absl::StatusOr<DeviceSelection> select_device(std::string_view requested, const DeviceProbe& probe);
// The check of `--device` at flag parsing, before anything is probed: "", "auto", "cpu" or
// "cuda"; INVALID_ARGUMENT "--device: expected cuda, cpu or auto, got '<text>'" otherwise (the
// generation worker and the trainer share it).
absl::Status check_device_flag(std::string_view text);

inline constexpr double kDefaultGpuMemoryFraction = 0.9;

// Parses `--gpu-memory-fraction`: a number in (0, 1]. INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<double> parse_gpu_memory_fraction(std::string_view text);

// The device memory the CUDA backend may take (weights, activations and KV blocks together):
// floor(fraction * total_bytes). `fraction` must be in (0, 1].
int64_t gpu_memory_budget_bytes(const CudaDeviceInfo& device, double fraction);

}  // namespace fp8rl::model
