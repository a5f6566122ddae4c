// The engine's training ops on the CPU: train_forward / train_backward (engine/train_step.h)
// over host memory with kernels/cpu (the CPU reference of every CUDA kernel) and
// model/linear.h's fprop/dgrad/wgrad on the model's own weights, and model/moe.h's mixture of
// experts (forward with routing replay, backward). Every CPU forward over whole sequences runs it:
// training (train/train_backend.cc CpuTrainBackend), scoring (engine/cpu/cpu_backend.cc), the
// reference policy's logprobs and KV calibration (cpu_logprobs below). On the device
// CudaTrainOps (engine/cuda/cuda_train_ops.h) replaces it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/train_step.h"
#include "model/model.h"

namespace fp8rl::engine {

class CpuTrainOps final : public TrainOps {
 public:
  explicit CpuTrainOps(const model::Model& model) : model_(model) {}
  const model::Model& model() const { return model_; }

  absl::Status load_tables(const TrainTables& t) override;
  absl::Status embed(float* x) override;
  absl::Status rmsnorm(const float* x, const float* g, int64_t rows, int64_t h, bool rb, float* y,
                       float* inv) override;
  absl::Status rope(int64_t heads, bool rb, bool inverse, float* x) override;
  absl::Status linear(int64_t layer, int64_t j, const float* x, int64_t rows, const float* bias,
                      float* y) override;
  absl::Status seq_amax(const float* k, const float* v, float* k_amax_host,
                        float* v_amax_host) override;
  absl::Status kv_fake_quant(int64_t layer, float* k, float* v) override;
  absl::Status attention(const float* q, const float* k, const float* v, float* o) override;
  absl::Status swiglu(const float* g, const float* u, int64_t n, bool rb, float* act) override;
  absl::Status add(float* y, const float* x, int64_t n, bool rb) override;
  absl::Status round_bf16(float* x, int64_t n) override;
  // model/moe.h moe_forward on the model's router and experts; the layer's MoeActivations are
  // kept here until its moe_backward.
  absl::Status moe(int64_t layer, const float* x, int64_t rows, const int32_t* forced_host,
                   MoeRouteHost* route_host, float* out) override;
  absl::Status log_softmax(const float* z, int64_t row0, int64_t rows, float inv_t, float* lse,
                           float* logprob) override;
  absl::Status head_dlogits(float* z, int64_t row0, int64_t rows, float inv_t, const float* lse,
                            const float* dlogp) override;
  absl::Status linear_backward(int64_t layer, int64_t j, const float* x, const float* dy,
                               int64_t rows, float* dx, float* dw, float* db) override;
  absl::Status rmsnorm_backward(const float* x, const float* g, const float* inv, const float* dy,
                                int64_t rows, int64_t h, float* dx, float* dg) override;
  absl::Status attention_backward(const float* q, const float* k, const float* v, const float* dout,
                                  float* dq, float* dk, float* dv) override;
  absl::Status swiglu_backward(const float* g, const float* u, const float* dact, int64_t n,
                               float* dg, float* du) override;
  absl::Status moe_backward(int64_t layer, const float* x, const float* dout, int64_t rows,
                            const float* dprob_extra_host, float* dx,
                            model::GradientSink& grads) override;
  absl::Status embed_backward(const float* dx, float* dembed) override;
  absl::Status copy(float* dst, const float* src, int64_t n) override;
  absl::Status zero(float* x, int64_t n) override;
  absl::Status to_host(float* dst_host, const float* src, int64_t n) override;
  absl::Status from_host(float* dst, const float* src_host, int64_t n) override;
  absl::Status synchronize() override { return absl::OkStatus(); }
  const float* small(int64_t offset) const override { return model_.norm_or_bias(offset); }
  // Host bytes of what moe() keeps, all sparse layers.
  int64_t moe_bytes() const;

 private:
  const model::LinearWeight& weight(int64_t layer, int64_t j) const;

  const model::Model& model_;
  const TrainTables* t_ = nullptr;
  std::vector<float> stats_;  // attention backward statistics
  // Per layer (sparse layers only): what moe() kept for moe_backward.
  std::vector<model::MoeActivations> moe_;
};

// A host training step: tables, buffers and CpuTrainOps for one micro-batch (CPU training's
// forward state, tests, benchmarks; CudaTrainStep is the same shape over CudaTrainOps).
struct CpuTrainStep {
  absl::StatusOr<model::TokenValues> forward(const model::Model& model,
                                             const model::TokenBatch& batch,
                                             const TrainStepOptions& opts);
  absl::Status backward(const model::Model& model, const model::TokenValues& dlogp, float* grads,
                        const model::GradientsFinal& on_final = {});
  absl::Status backward(const model::Model& model, const model::TokenValues& dlogp,
                        model::GradientSink& grads);
  // Full logits [T, vocab] before temperature of sequence `s` of the last forward (lm_head over
  // its final hidden states; tests and debugging). FailedPrecondition before a forward.
  absl::StatusOr<std::vector<float>> logits(int64_t s) const;
  // Host bytes the forward keeps for the backward: the step's buffers and the sparse layers'
  // activations held by the ops.
  int64_t saved_bytes() const;

  TrainStepOptions opts;
  // Mixture of experts: the last forward's routing, unless its options named another place.
  model::ForwardRouting routing;
  TrainTables tables;
  std::vector<float> storage;
  TrainBuffers buffers;
  std::unique_ptr<CpuTrainOps> ops;
};

// A forward only (scoring, the reference policy's logprobs, KV calibration): per-token logprobs
// of `batch` (per sequence n-1, [i-1] the logprob of token i); nothing is kept. It runs with
// recompute_layers (the layers' inputs only, while it runs; the same values), whatever
// opts.recompute_layers says. FailedPrecondition for a model without weights (ForDescription).
absl::StatusOr<model::TokenValues> cpu_logprobs(const model::Model& model,
                                                const model::TokenBatch& batch,
                                                const TrainStepOptions& opts = {});
// Full logits [T, vocab] of one sequence, before temperature (tests, debugging).
absl::StatusOr<std::vector<float>> cpu_logits(const model::Model& model,
                                              const std::vector<int32_t>& tokens);

}  // namespace fp8rl::engine
