// KV-cache scale calibration: the trainer records, per layer and per forward call, the amax of K
// (after RoPE) and of V, and turns them into vLLM-convention dequant scales:
// scale = percentile(amaxes over calls, 99.9) * 1.05 / 448 (percentile and margin configurable).
//
// The percentile is taken over records. The training forward (engine/train_step.h) records one amax
// per layer per sequence of its batch, so a batched forward and one forward per sequence give the
// same samples. With n records the 99.9th percentile sits at rank 0.999 * (n - 1): it differs
// from the max only by interpolation until n is in the hundreds (n = 101: 0.9 of the way from the
// 2nd largest to the largest).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"

namespace fp8rl::model {

struct KvScales {
  std::vector<float> k;  // per layer
  std::vector<float> v;
};

// OK when `scales` has num_layers k and v scales, each positive and finite; otherwise
// InvalidArgument "kv scales: ..." naming the count or the layer.
absl::Status validate_kv_scales(const KvScales& scales, int64_t num_layers);

class KvCalibrator {
 public:
  explicit KvCalibrator(int64_t num_layers) : k_(num_layers), v_(num_layers) {}

  // Thread-safe; called by the forward once per layer per call (layer in [0, num_layers)).
  void record(int64_t layer, float k_amax, float v_amax);
  // Number of forward calls recorded (records of layer 0).
  int64_t num_records() const;
  // Per layer: percentile_of(amaxes of every call, percentile) * margin / 448. Non-finite amaxes
  // (an overflowed call) are left out, since a single one would otherwise turn the layer's scale
  // into its fallback. A layer with no finite records, or a scale that is 0 or not finite, gets 1.
  KvScales scales(double percentile = 99.9, double margin = 1.05) const;
  void clear();
  // The recorded amaxes, [layer][call] (a trainer group gathers every rank's records,
  // train/data_parallel.h).
  std::vector<std::vector<float>> k_records() const;
  std::vector<std::vector<float>> v_records() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<float>> k_, v_;  // [layer][call]; guarded by mu_
};

// The `percentile` (clamped to [0, 100]) of the finite values, numpy's default "linear" rule:
// sort the n finite values v[0] <= ... <= v[n-1], take rank r = percentile / 100 * (n - 1), and
// return v[floor(r)] + (r - floor(r)) * (v[floor(r) + 1] - v[floor(r)]) (v[n-1] when r = n - 1).
// Non-finite values are dropped first; 0 when no finite value is left (or percentile is NaN).
float percentile_of(std::vector<float> values, double percentile);

}  // namespace fp8rl::model
