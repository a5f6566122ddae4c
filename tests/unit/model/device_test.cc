// --device selection with an injected probe, the --gpu-memory-fraction rule, and the real probe's
// answer in this build.
#include "model/device.h"

#include <gtest/gtest.h>

#include <string>

namespace fp8rl::model {
namespace {

CudaDeviceInfo h200() {
  CudaDeviceInfo d;
  d.index = 1;
  d.name = "NVIDIA H200";
  d.major = 9;
  d.minor = 0;
  d.total_bytes = int64_t{150} << 30;
  return d;
}

// A probe that returns `result` and counts its calls.
DeviceProbe probe_returning(DeviceProbeResult result, int* calls) {
  return [result, calls] {
    ++*calls;
    return result;
  };
}

TEST(DeviceSelection, AutoPicksCudaWhenAnSm90DeviceIsVisible) {
  int calls = 0;
  for (const char* requested : {"", "auto"}) {
    absl::StatusOr<DeviceSelection> s =
        select_device(requested, probe_returning({h200(), "1 CUDA device(s)"}, &calls));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->device, Device::kCuda);
    ASSERT_TRUE(s->cuda.has_value());
    EXPECT_EQ(s->cuda->index, 1);
    EXPECT_EQ(s->description, "device cuda (auto: NVIDIA H200, sm_90, ordinal 1, 153600 MiB)");
  }
  EXPECT_EQ(calls, 2);
}

TEST(DeviceSelection, AutoFallsBackToCpuAndSaysWhy) {
  int calls = 0;
  absl::StatusOr<DeviceSelection> s = select_device(
      "", probe_returning({std::nullopt, "no sm_90 device among: A100 sm_80"}, &calls));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->device, Device::kCpu);
  EXPECT_FALSE(s->cuda.has_value());
  EXPECT_EQ(s->description, "device cpu (auto: no sm_90 device among: A100 sm_80)");
  EXPECT_EQ(calls, 1);
}

TEST(DeviceSelection, CpuIsTakenWithoutProbing) {
  int calls = 0;
  absl::StatusOr<DeviceSelection> s =
      select_device("cpu", probe_returning({h200(), "1 CUDA device(s)"}, &calls));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->device, Device::kCpu);
  EXPECT_EQ(s->description, "device cpu (requested)");
  EXPECT_EQ(calls, 0);
}

TEST(DeviceSelection, CudaWithoutADeviceIsAOneLineError) {
  int calls = 0;
  absl::StatusOr<DeviceSelection> s =
      select_device("cuda", probe_returning({std::nullopt, "built without CUDA"}, &calls));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.status().message(), "--device cuda: no sm_90 CUDA device (built without CUDA)");
  EXPECT_EQ(std::string(s.status().message()).find('\n'), std::string::npos);

  absl::StatusOr<DeviceSelection> ok =
      select_device("cuda", probe_returning({h200(), "1 CUDA device(s)"}, &calls));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->device, Device::kCuda);
  EXPECT_EQ(ok->description.rfind("device cuda (requested: NVIDIA H200", 0), 0u);
}

TEST(DeviceSelection, UnknownWordNamesTheFlag) {
  int calls = 0;
  for (const char* bad : {"gpu", "CUDA", "cuda:0", " cpu"}) {
    absl::StatusOr<DeviceSelection> s = select_device(bad, probe_returning({h200(), ""}, &calls));
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message().rfind("--device: expected cuda, cpu or auto, got '", 0), 0u);
  }
  EXPECT_EQ(calls, 0);
  // The flag-parsing check the worker and trainer configs run says the same.
  for (const char* good : {"", "auto", "cpu", "cuda"}) EXPECT_TRUE(check_device_flag(good).ok());
  absl::Status bad = check_device_flag("gpu");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "--device: expected cuda, cpu or auto, got 'gpu'");
}

TEST(GpuMemoryFraction, AcceptsOnlyZeroToOne) {
  for (const auto& [text, want] :
       {std::pair<const char*, double>{"0.9", 0.9}, {"1", 1.0}, {"1.0", 1.0}, {"0.05", 0.05}}) {
    absl::StatusOr<double> f = parse_gpu_memory_fraction(text);
    ASSERT_TRUE(f.ok()) << text;
    EXPECT_EQ(*f, want);
  }
  for (const char* bad : {"0", "0.0", "-0.5", "1.01", "2", "nan", "inf", "", "0.5x", "half"}) {
    absl::StatusOr<double> f = parse_gpu_memory_fraction(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(f.status().message().rfind("--gpu-memory-fraction: expected a number in (0, 1]", 0),
              0u);
  }
}

TEST(GpuMemoryFraction, BudgetIsTheFloorOfFractionTimesTotal) {
  CudaDeviceInfo d = h200();
  d.total_bytes = 1001;
  EXPECT_EQ(gpu_memory_budget_bytes(d, 0.5), 500);
  EXPECT_EQ(gpu_memory_budget_bytes(d, 1.0), 1001);
  d.total_bytes = int64_t{143771} << 20;  // an H200's cudaDeviceProp::totalGlobalMem, about
  EXPECT_EQ(gpu_memory_budget_bytes(d, 0.9),
            static_cast<int64_t>(0.9 * static_cast<double>(int64_t{143771} << 20)));
}

// The real probe in this build: without CUDA it must say so; with CUDA it answers either way, and
// a device it reports is an sm_90 one.
TEST(DeviceProbe, RealProbeAnswersInThisBuild) {
  const DeviceProbeResult r = probe_cuda_device();
  EXPECT_FALSE(r.detail.empty());
  if (!built_with_cuda()) {
    EXPECT_FALSE(r.device.has_value());
    EXPECT_EQ(r.detail, "built without CUDA");
  } else if (r.device.has_value()) {
    EXPECT_EQ(r.device->major, 9);
    EXPECT_EQ(r.device->minor, 0);
    EXPECT_GT(r.device->total_bytes, 0);
  }
  std::printf("probe: %s%s\n", r.device ? r.device->name.c_str() : "no device: ", r.detail.c_str());
  // auto never fails, whatever the machine has.
  EXPECT_TRUE(select_device("auto", probe_cuda_device).ok());
}

}  // namespace
}  // namespace fp8rl::model
