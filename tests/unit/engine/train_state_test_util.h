// Shared inputs of the train-state tests on the CPU mirror (train_state_test.cc) and on CUDA
// (tests/gpu/train_state_cuda_test.cc): the model shape, the AdamW settings, random gradients.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/config.h"
#include "model/optimizer.h"
#include "tests/unit/model/model_test_util.h"

namespace fp8rl::model::testing {

// Hidden 160 and intermediate 272: linears with full and partial 128x128 blocks in both dims.
inline ModelConfig train_state_config(bool tied = false) {
  return make_config(97, 160, 272, 3, 5, 1, tied, /*qwen2=*/true);
}

// Warmup, cosine decay, weight decay and a clipping limit the random gradients exceed.
inline const AdamWConfig kTrainStateAdamW{.lr = 3e-3,
                                          .weight_decay = 0.1,
                                          .max_grad_norm = 0.5,
                                          .warmup_steps = 2,
                                          .schedule = LrSchedule::kCosine,
                                          .total_steps = 10,
                                          .min_lr_ratio = 0.1};

// Non-zero gradients over many magnitudes (2^-10 .. 2^-4 times N(0, 1)), one set per seed.
inline std::vector<float> random_grads(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-10, -4);
  std::vector<float> g(n);
  for (float& x : g) x = std::ldexp(normal(gen), e(gen)) + 1e-12f;
  return g;
}

}  // namespace fp8rl::model::testing
