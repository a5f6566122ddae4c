// The device memory a training step needs, computed from the model config, the training precision
// policy and the step's shape before anything is allocated (docs/design/gpu-training.md "Training
// on the GPU", memory plan): printed when a policy is created, and a RESOURCE_EXHAUSTED error
// naming the parts when it exceeds the --gpu-memory-fraction budget.
//
// What each part counts (bytes):
//   weights      working copies the forward and backward read: an FP8 linear its E4M3 codes (1 B)
//                and 128x128 block scales (4 B per block) twice (the fprop blocks and the
//                transposed blocks of the dgrad), a BF16 linear / the embedding / lm_head 2 B per
//                value, norms, biases and routers 4 B.
//   master       fp32 master weights, 4 B per parameter.
//   moments      AdamW m and v, 8 B per parameter.
//   grads        fp32 gradients, 4 B per parameter.
//   activations  what the training forward keeps for the backward, `activation_value_bytes` per
//                value (4: the CPU engine keeps fp32), per token: each dense layer x, h1, x2, h2
//                (hidden), q, o (q_dim), k, v (kv_dim), g, u, act (intermediate), 2 norm inverses
//                (+ q_raw, k_raw and per-head inverses with qk_norm); each sparse layer the same
//                attention part plus top_k x 3 x moe_intermediate and the E router probabilities
//                (an estimate); the final norm's x, h (hidden) and 2 scalars; plus one lm_head
//                logits chunk (64 rows x vocab). With recomputation: each dense layer only its
//                input x (hidden) plus one dense layer's full set (the layer being recomputed).
//   kv_cache     the step's sequences' K and V in the cache format: 2 x layers x kv_dim x tokens x
//                (1 B fp8, 2 B bf16, 4 B fp32).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/precision.h"

namespace fp8rl::train {

struct MemoryPlanInput {
  model::ModelConfig config;
  PrecisionPolicy policy;         // the training policy (linear format, bf16 layers, KV format)
  int64_t step_tokens = 0;        // tokens of the largest forward (minibatch) of a step
  int64_t kv_cache_tokens = 0;    // tokens whose K/V the step's generation caches
  bool recompute_layers = false;  // activation recomputation per layer
  int64_t activation_value_bytes = 4;
};

struct MemoryPlan {
  int64_t weights = 0, master = 0, moments = 0, grads = 0, activations = 0, kv_cache = 0;
  int64_t total() const { return weights + master + moments + grads + activations + kv_cache; }
  // "memory plan: weights 2.3 GiB, master 4.6 GiB, ... = 20.1 GiB (16384 step tokens, ...)".
  std::string describe() const;
  MemoryPlanInput input;
};

// INVALID_ARGUMENT naming the field for negative tokens or a config without layers.
absl::StatusOr<MemoryPlan> plan_training_memory(const MemoryPlanInput& input);

// OK when plan.total() <= budget_bytes; RESOURCE_EXHAUSTED otherwise, naming every part, the
// budget and what lowers the need. budget_bytes <= 0: no budget (OK).
absl::Status check_memory_plan(const MemoryPlan& plan, int64_t budget_bytes);

}  // namespace fp8rl::train
