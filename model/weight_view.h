// Named tensors in checkpoint layout that point into memory someone else owns (a received payload
// in a generation worker's install buffer, or a WeightSet), so a version can be installed into an
// inference model without first copying every tensor into a WeightSet of its own.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "model/weight_set.h"

namespace fp8rl::model {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;      // {} for a scalar
  std::span<const uint8_t> bytes;  // little-endian, numel * dtype_size; not owned
};

// A version's tensors as views. The memory behind `bytes` must outlive the view.
class WeightView {
 public:
  int64_t version = 0;
  std::string config_json;

  // Appends a tensor; InvalidArgument naming it for a duplicate name, a negative dim or a byte
  // size that is not numel * dtype size.
  absl::Status add(TensorView tensor);
  const TensorView* find(const std::string& name) const;
  const std::vector<TensorView>& tensors() const { return tensors_; }

 private:
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// A tensor of F32/BF16/F8_E4M3 (or F16) as fp32 values (defined beside the WeightSet overload).
absl::StatusOr<std::vector<float>> tensor_to_f32(const TensorView& t);

// Views of every tensor of `set` (which must outlive the result); the set's checks apply.
absl::StatusOr<WeightView> view_of(const WeightSet& set);

}  // namespace fp8rl::model
