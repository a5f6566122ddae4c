// An in-memory set of named tensors in checkpoint layout (F32, BF16, or the FP8 block format with
// k_scale/v_scale), tagged with a policy version: what the trainer publishes and what a generation
// worker builds its inference model from, without touching the disk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/safetensors.h"

namespace fp8rl::model {

struct NamedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // {} for a scalar
  std::vector<uint8_t> bytes;  // little-endian, numel * dtype_size
};

struct WeightSet {
  int64_t version = 0;
  std::string config_json;  // config.json text (with quantization_config for FP8)
  std::vector<NamedTensor> tensors;

  const NamedTensor* find(const std::string& name) const;
  int64_t nbytes() const;
};

// Checks every tensor's byte size against shape x dtype and that names are unique.
absl::Status validate_weight_set(const WeightSet& set);
// Adds every tensor to a writer (for saving a weight set as a checkpoint folder).
absl::Status add_to_writer(const WeightSet& set, SafetensorsWriter* writer);
// A tensor of F32/BF16/F8_E4M3 (or F16) as fp32 values.
absl::StatusOr<std::vector<float>> tensor_to_f32(const NamedTensor& t);

}  // namespace fp8rl::model
