// Where a backward writes parameter gradients (docs/design/sharding.md "ZeRO-2 in the learner"):
// one whole flat array (FlatGradientSink), or storage
// handed out tensor by tensor, so a sharded trainer never holds the whole gradient array
// (train/gradient_buckets.h).
#pragma once

#include <cstdint>
#include <functional>

namespace fp8rl::model {

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // The gradient storage of the parameter tensor that starts at flat offset `offset` (a
  // ParamInfo::offset of the model's layout): p[i] accumulates dL/dparams[offset + i] for i below
  // the tensor's numel. Zero when first handed out, the same pointer on every later call, valid
  // until final_from(from) with from <= offset. Called from the backward's own thread only (a
  // backward that fans out over threads asks for its pointers first).
  virtual float* grad(int64_t offset) = 0;
  // grads[from, num_params) do not change again in this backward; `from` only decreases and the
  // backward's last call has 0 (as GradientsFinal).
  virtual void final_from(int64_t from) = 0;
};

// Told as gradients become final during a backward into a flat array: after a call with `from`,
// grads[from, num_params) do not change again in this backward; `from` only decreases and the
// last call has 0. A data-parallel group all-reduces those while the backward goes on
// (docs/design/training.md "Trainer groups").
using GradientsFinal = std::function<void(int64_t from)>;

// The whole array grads[num_params] (not zeroed here: the backward adds into it), telling
// `on_final` (optional) what is final.
class FlatGradientSink final : public GradientSink {
 public:
  FlatGradientSink(float* grads, GradientsFinal on_final)
      : grads_(grads), on_final_(std::move(on_final)) {}
  float* grad(int64_t offset) override { return grads_ + offset; }
  void final_from(int64_t from) override {
    if (on_final_) on_final_(from);
  }

 private:
  float* const grads_;
  const GradientsFinal on_final_;
};

}  // namespace fp8rl::model
