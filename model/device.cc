// Device selection and the CUDA device probe (see device.h).
#include "model/device.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#if FP8RL_DEVICE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fp8rl::model {

bool built_with_cuda() { return FP8RL_DEVICE_HAVE_CUDA != 0; }

DeviceProbeResult probe_cuda_device() {
  DeviceProbeResult result;
#if FP8RL_DEVICE_HAVE_CUDA
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();  // reset the runtime's last error for later calls
    result.detail = absl::StrCat("CUDA runtime: ", cudaGetErrorString(e));
    return result;
  }
  std::vector<std::string> seen;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    if (p.major == 9 && p.minor == 0) {
      CudaDeviceInfo info;
      info.index = i;
      info.name = p.name;
      info.major = p.major;
      info.minor = p.minor;
      info.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
      result.device = std::move(info);
      result.detail = absl::StrCat(count, " CUDA device(s)");
      return result;
    }
    seen.push_back(absl::StrCat(p.name, " sm_", p.major, p.minor));
  }
  result.detail = count == 0 ? std::string("no CUDA device visible")
                             : absl::StrCat("no sm_90 device among: ", absl::StrJoin(seen, ", "));
#else
  result.detail = "built without CUDA";
#endif
  return result;
}

absl::StatusOr<DeviceSelection> select_device(std::string_view requested,
                                              const DeviceProbe& probe) {
  if (absl::Status s = check_device_flag(requested); !s.ok()) return s;
  DeviceSelection selection;
  if (requested == "cpu") {
    selection.description = "device cpu (requested)";
    return selection;
  }
  const bool automatic = requested.empty() || requested == "auto";
  const DeviceProbeResult found = probe();
  if (!found.device.has_value()) {
    if (!automatic) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device cuda: no sm_90 CUDA device (", found.detail, ")"));
    }
    selection.description = absl::StrCat("device cpu (auto: ", found.detail, ")");
    return selection;
  }
  const CudaDeviceInfo& d = *found.device;
  selection.device = Device::kCuda;
  selection.cuda = d;
  selection.description = absl::StrCat("device cuda (", automatic ? "auto" : "requested", ": ",
                                       d.name, ", sm_", d.major, d.minor, ", ordinal ", d.index,
                                       ", ", d.total_bytes / (int64_t{1} << 20), " MiB)");
  return selection;
}

absl::Status check_device_flag(std::string_view text) {
  if (text.empty() || text == "auto" || text == "cpu" || text == "cuda") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--device: expected cuda, cpu or auto, got '", std::string(text), "'"));
}

absl::StatusOr<double> parse_gpu_memory_fraction(std::string_view text) {
  double f = 0;
  // !(f > 0 && f <= 1) also refuses NaN.
  if (!absl::SimpleAtod(std::string(text), &f) || !(f > 0.0 && f <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-fraction: expected a number in (0, 1], got '", std::string(text), "'"));
  }
  return f;
}

int64_t gpu_memory_budget_bytes(const CudaDeviceInfo& device, double fraction) {
  return static_cast<int64_t>(std::floor(static_cast<double>(device.total_bytes) * fraction));
}

}  // namespace fp8rl::model
