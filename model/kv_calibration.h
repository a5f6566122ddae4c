// KV-cache scale calibration: the trainer records, per layer and per forward call, the amax of K
// (after RoPE) and of V, and turns them into vLLM-convention dequant scales:
// scale = percentile(amaxes, 99.9) * 1.05 / 448 (percentile and margin configurable).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace fp8rl::model {

struct KvScales {
  std::vector<float> k;  // per layer
  std::vector<float> v;
};

class KvCalibrator {
 public:
  explicit KvCalibrator(int64_t num_layers) : k_(num_layers), v_(num_layers) {}

  // Thread-safe; called by the forward once per layer per call.
  void record(int64_t layer, float k_amax, float v_amax);
  int64_t num_records() const;
  // Scales from the recorded amaxes (linear-interpolated percentile, like numpy's default).
  // A layer with no records, or amax 0, gets scale 1.
  KvScales scales(double percentile = 99.9, double margin = 1.05) const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<float>> k_, v_;
};

// The percentile (0..100) of values with linear interpolation between order statistics.
float percentile_of(std::vector<float> values, double percentile);

}  // namespace fp8rl::model
