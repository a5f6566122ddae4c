// Fuzz target: a .safetensors file (8-byte header length, JSON header with the tensor table,
// data section) through SafetensorsFile's validation, then every accessor on every tensor the
// header declares. A header that passes must never let raw()/read_f32() read outside the file.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<fp8rl::SafetensorsFile> file = fp8rl::SafetensorsFile::FromBytes(
      "fuzz.safetensors", std::vector<uint8_t>(data, data + size));
  if (!file.ok()) return 0;
  for (const std::string& name : file->names()) {
    absl::StatusOr<fp8rl::TensorInfo> info = file->info(name);
    if (!info.ok()) __builtin_trap();  // names() lists only tensors info() knows
    absl::StatusOr<std::vector<uint8_t>> raw = file->raw(name);
    if (!raw.ok() || static_cast<int64_t>(raw->size()) != info->nbytes()) __builtin_trap();
    absl::StatusOr<std::vector<float>> values = file->read_f32(name);
    if (values.ok() && static_cast<int64_t>(values->size()) != info->numel()) __builtin_trap();
  }
  (void)file->metadata();
  return 0;
}
