// The engine's decode-step ops on the CPU: decoder_step() over host memory with kernels/cpu (the
// CPU reference of every CUDA kernel), model/linear.h linear_forward and a host paged KV pool in
// the device layout (kernels/device_math/paged_kv.h), model/moe.h moe_forward for sparse layers.
// The CPU inference backend (cpu_backend.cc) generates with it; tests run it against the
// training forward (train_forward) to check the step's orchestration, rounding
// points, block tables and MoE routing.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/decoder_step.h"
#include "model/model.h"

namespace fp8rl::engine {

class CpuDecoderOps final : public DecoderOps {
 public:
  // A pool of `num_blocks` blocks of `block_tokens` positions per layer, in the policy's KV dtype.
  CpuDecoderOps(const model::Model& model, int64_t num_blocks, int64_t block_tokens);

  // Blocks in the pool (ids 0..num_blocks()-1).
  int64_t num_blocks() const { return num_blocks_; }
  // Grows the pool to `num_blocks` blocks (never shrinks), keeping every block's contents.
  void grow_pool(int64_t num_blocks);
  // Reads its weights from `model` from now on (same config and policy: the caller checks).
  void set_model(const model::Model& model) { model_ = &model; }

  absl::Status load_tables(const StepTables& t) override;
  absl::Status embed(int64_t rows, float* x) override;
  absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, bool rb,
                       float* y) override;
  absl::Status rope(int64_t rows, int64_t heads, bool rb, float* x) override;
  absl::Status linear(int64_t layer, int64_t j, const float* x, int64_t rows, const float* bias,
                      float* y) override;
  absl::Status attention(int64_t layer, const float* q, const float* k, const float* v,
                         int64_t rows, float* o) override;
  absl::Status swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) override;
  absl::Status moe(int64_t layer, const float* x, int64_t rows, float* y, int32_t* sel) override;
  absl::Status add(float* y, const float* x, int64_t n, bool rb) override;
  absl::Status round_bf16(float* x, int64_t n) override;
  absl::Status gather_out_rows(const float* x, int64_t h, int64_t n_out, float* out) override;
  const float* small(int64_t offset) const override { return model_->norm_or_bias(offset); }

 private:
  kernels::dm::PagedKvView view(int64_t layer);

  const model::Model* model_;
  int64_t num_blocks_, block_tokens_, elem_;
  std::vector<std::vector<uint8_t>> k_pool_, v_pool_;  // per layer
  const StepTables* t_ = nullptr;
  // From load_tables: segment s's rows are seg_rows_[seg_start_[s], seg_start_[s + 1]) in row
  // order; seg_len_[s] = its largest position + 1 (the context its attention reads).
  std::vector<int64_t> seg_start_, seg_len_;
  std::vector<int32_t> seg_rows_;
  model::MoeActivations moe_act_;  // moe()'s scratch (routing, grouped rows)
};

// The fp32 values of a BF16 or F32 linear's forward operand, whichever copy the model keeps: the
// bf16-rounded copy or the fp32 master (models with a master), or the double-accumulation operand
// (an inference-only model keeps only that one for BF16 linears and an untied lm_head). Empty for
// an FP8 weight (its codes and scales are the operand).
std::vector<float> linear_values(const model::LinearWeight& w);

// Host scratch of a step of up to `rows` rows (decoder_step's StepBuffers over owned vectors).
struct CpuStepBuffers {
  CpuStepBuffers(const model::ModelConfig& config, int64_t rows);
  std::vector<float> x, h1, q, qn, k, kn, v, o, x2, h2, g, u, act, sel;
  std::vector<int32_t> routing;  // [sparse layers, rows, top_k]; empty for a dense model
  StepBuffers view();
};

}  // namespace fp8rl::engine
