// WeightSet helpers: lookup, validation, conversion.
#include "model/weight_set.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/formats.h"
#include "model/weight_view.h"

namespace fp8rl::model {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float half_to_float(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

}  // namespace

const NamedTensor* WeightSet::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int64_t WeightSet::nbytes() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<int64_t>(t.bytes.size());
  return n;
}

absl::Status validate_weight_set(const WeightSet& set) {
  std::set<std::string> names;
  for (const auto& t : set.tensors) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight set: duplicate tensor '", t.name, "'"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat("weight set: ", t.name, ": negative dim"));
      }
    }
    const int64_t want = numel_of(t.shape) * dtype_size(t.dtype);
    if (static_cast<int64_t>(t.bytes.size()) != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight set: ", t.name, ": ", t.bytes.size(), " bytes, expected ", want));
    }
  }
  return absl::OkStatus();
}

absl::Status add_to_writer(const WeightSet& set, SafetensorsWriter* writer) {
  for (const auto& t : set.tensors) {
    if (auto s = writer->add(t.name, t.dtype, t.shape, t.bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> tensor_to_f32(const NamedTensor& t) {
  return tensor_to_f32(TensorView{t.name, t.dtype, t.shape, t.bytes});
}

absl::StatusOr<std::vector<float>> tensor_to_f32(const TensorView& t) {
  const int64_t n = numel_of(t.shape);
  if (static_cast<int64_t>(t.bytes.size()) != n * dtype_size(t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(t.name, ": byte size does not match shape"));
  }
  std::vector<float> out(n);
  const uint8_t* p = t.bytes.data();
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out.data(), p, n * sizeof(float));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = kernels::bf16_to_float(b);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = half_to_float(b);
      }
      break;
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = kernels::e4m3_to_float(p[i]);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          t.name, ": dtype ", std::string(dtype_name(t.dtype)), " is not a float type"));
  }
  return out;
}

}  // namespace fp8rl::model
