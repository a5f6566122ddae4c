// Percentile-over-calls KV scale calibration (the rule is written out in kv_calibration.h).
#include "model/kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/formats.h"

namespace fp8rl::model {

float percentile_of(std::vector<float> values, double percentile) {
  std::erase_if(values, [](float v) { return !std::isfinite(v); });
  if (values.empty() || std::isnan(percentile)) return 0.0f;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(percentile, 0.0, 100.0) / 100.0 * (values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - lo;
  return static_cast<float>(values[lo] + (values[hi] - values[lo]) * frac);
}

absl::Status validate_kv_scales(const KvScales& scales, int64_t num_layers) {
  const size_t n = static_cast<size_t>(num_layers);
  if (scales.k.size() != n || scales.v.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("kv scales: expected ", n, " per tensor, got ",
                                                   scales.k.size(), " and ", scales.v.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!(scales.k[i] > 0) || !(scales.v[i] > 0) || !std::isfinite(scales.k[i]) ||
        !std::isfinite(scales.v[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv scales: layer ", i, ": scales must be positive and finite"));
    }
  }
  return absl::OkStatus();
}

void KvCalibrator::record(int64_t layer, float k_amax, float v_amax) {
  std::lock_guard<std::mutex> lock(mu_);
  k_[layer].push_back(k_amax);
  v_[layer].push_back(v_amax);
}

int64_t KvCalibrator::num_records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return k_.empty() ? 0 : static_cast<int64_t>(k_[0].size());
}

KvScales KvCalibrator::scales(double percentile, double margin) const {
  std::lock_guard<std::mutex> lock(mu_);
  KvScales out;
  auto to_scale = [&](const std::vector<float>& amaxes) {
    const float p = percentile_of(amaxes, percentile);
    const float s = static_cast<float>(p * margin / kernels::kE4M3Max);
    return (s > 0 && std::isfinite(s)) ? s : 1.0f;
  };
  for (size_t l = 0; l < k_.size(); ++l) {
    out.k.push_back(to_scale(k_[l]));
    out.v.push_back(to_scale(v_[l]));
  }
  return out;
}

void KvCalibrator::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& a : k_) a.clear();
  for (auto& a : v_) a.clear();
}

std::vector<std::vector<float>> KvCalibrator::k_records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return k_;
}

std::vector<std::vector<float>> KvCalibrator::v_records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return v_;
}

}  // namespace fp8rl::model
