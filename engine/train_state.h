// The trainer's state on the device (docs/design/gpu-training.md "Optimizer, re-quantization and
// calibration on the device"): fp32 master weights, gradients and AdamW moments in ParamLayout
// order, the 128x128-block FP8 working copy of every linear the policy runs in FP8, KV-scale
// calibration from per-layer per-call amaxes, export of a publishable weight set (FP8 codes +
// scales and BF16 tensors only), and optimizer checkpoints in the CPU trainer's format.
//
// The logic is written once over TrainDevice, a small set of memory and arithmetic primitives:
// the CUDA device (make_cuda_train_device, kernels/cuda/optim_cuda.h) or host memory
// (make_cpu_train_device, the CPU mirror that lets every host-side path be tested on machines
// without a GPU against model::AdamW, Model::refresh and Model::export_weights).
//
// Plain C++ (no CUDA headers): built and tested in every build; the CUDA device exists only in a
// build with CUDA (make_cuda_train_device answers Unimplemented otherwise).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_math/adamw.h"
#include "kernels/quantize.h"
#include "model/kv_calibration.h"
#include "model/model.h"
#include "model/optimizer.h"

struct CUstream_st;

namespace fp8rl::engine {

// ---- Primitives ---------------------------------------------------------------------------------

// Memory and element-wise arithmetic of one device. Every pointer argument lives in this device's
// memory (allocate()); calls are ordered (one stream) and the ones that return host values wait
// for the work before them. FP8 block scales are kept in the device's own layout
// (block_scale_count floats): the CUDA GEMM layout (kernels/cuda/fp8_cuda.h, kBlock128x128) on
// CUDA, the CPU layout (kernels/quantize.h) on the host.
class TrainDevice {
 public:
  virtual ~TrainDevice() = default;
  virtual std::string_view name() const = 0;  // "cuda" | "host"
  // The CUDA stream everything runs on (nullptr on the host).
  virtual CUstream_st* stream() const = 0;

  // Zero-filled bytes owned by the device object (freed with it), 256-byte aligned.
  // ResourceExhausted naming `what` when the memory is not there.
  virtual absl::StatusOr<void*> allocate(int64_t bytes, const std::string& what) = 0;
  // Returns memory allocate() gave (after the work before it); nullptr and pointers it did not
  // give are ignored.
  virtual void release(void* p) = 0;
  virtual absl::Status fill_zero(void* dst, int64_t bytes) = 0;
  virtual absl::Status upload(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual absl::Status download(void* host_dst, const void* src, int64_t bytes) const = 0;

  // g[i] *= scale for i < n, then the sum of g[i]^2 in double. The CUDA order is fixed by n
  // alone (deterministic); it is not the CPU's sequential order (kernels/cuda/optim_cuda.h).
  virtual absl::StatusOr<double> scale_and_sum_squares(float* g, int64_t n, float scale) = 0;
  // For i < n: g[i] *= clip (left clipped, as model::AdamW leaves them), then
  // kernels::dm::adamw_update(g[i], decay, c, p[i], m[i], v[i]).
  virtual absl::Status adamw(float* p, float* m, float* v, float* g, int64_t n, float clip,
                             bool decay, const kernels::dm::AdamWCoeffs& c) = 0;
  // 128x128-block FP8 quantization of x [rows, cols] (bit-exact with kernels::quantize).
  virtual int64_t block_scale_count(int64_t rows, int64_t cols) const = 0;
  virtual absl::Status quantize_block128(const float* x, int64_t rows, int64_t cols, bool pow2,
                                         uint8_t* codes, float* scales) = 0;
  // The exact transpose (kernels::transpose_blocks): t_codes [cols, rows] and its scales.
  virtual absl::Status transpose_block128(const uint8_t* codes, const float* scales, int64_t rows,
                                          int64_t cols, uint8_t* t_codes, float* t_scales) = 0;
  // Moves one 128x128-block matrix between the host (CPU layout) and this device.
  virtual absl::Status upload_block128(const kernels::Fp8Matrix& host, uint8_t* codes,
                                       float* scales) = 0;
  virtual absl::StatusOr<kernels::Fp8Matrix> download_block128(const uint8_t* codes,
                                                               const float* scales, int64_t rows,
                                                               int64_t cols) const = 0;
  // out[i] = bf16 bits of x[i] (round to nearest even, kernels::dm::float_to_bf16).
  virtual absl::Status round_bf16(const float* x, int64_t n, uint16_t* out) const = 0;
  // *slot = max(*slot, |x[i]| for i < n), NaN skipped and +-inf kept: the amax the CPU forward
  // records (kernels/cpu seq_amax). *slot must hold a value >= 0.
  virtual absl::Status amax_into(const float* x, int64_t n, float* slot) = 0;
  // The same over bf16 bits.
  virtual absl::Status amax_into_bf16(const uint16_t* x, int64_t n, float* slot) = 0;
  virtual absl::Status synchronize() const = 0;
};

// The CPU mirror: host memory, the shared kernels::dm arithmetic and kernels::quantize.
std::unique_ptr<TrainDevice> make_cpu_train_device();
// The current CUDA device on `stream` (nullptr: the legacy default stream). FailedPrecondition
// without an sm_90 device; Unimplemented in a build without CUDA.
absl::StatusOr<std::unique_ptr<TrainDevice>> make_cuda_train_device(CUstream_st* stream = nullptr);

// ---- Memory plan ----------------------------------------------------------------------------

// Bytes the state holds on the device for a model (what the trainer's memory plan adds up).
struct TrainStateBytes {
  int64_t master = 0;          // fp32 params
  int64_t grads = 0;           // fp32
  int64_t moments = 0;         // fp32 m and v
  int64_t fp8_weights = 0;     // codes + scales of the FP8 linears (and their transposes if kept)
  int64_t bf16_copy = 0;       // TrainStateOptions::keep_bf16_copy
  int64_t kv_records = 0;      // the amax record buffer
  int64_t export_scratch = 0;  // one tensor's bf16 bits / fresh FP8 codes + scales at export
  int64_t total() const {
    return master + grads + moments + fp8_weights + bf16_copy + kv_records + export_scratch;
  }
};

struct TrainStateOptions {
  model::AdamWConfig adamw;
  // Keep a bf16 copy of every parameter (bf16_params()), refreshed after each step, for a forward
  // that reads BF16 weights.
  bool keep_bf16_copy = false;
  // Keep the transposed blocks of every FP8 weight (the dgrad operand W^T), refreshed with them.
  bool keep_transposed = false;
  // Per-layer K/V amax records held on the device before they are moved to the host calibrator.
  int64_t kv_record_capacity = 1024;
  // A rank of a sharded group (trainer.shard grads_optimizer) whose shard is known when the state
  // is made: shard_end >= 0 keeps the master, moments and gradients of [shard_begin, shard_end)
  // only from the start (as Create then shard() would, without ever allocating the whole
  // master); -1: every parameter.
  int64_t shard_begin = 0;
  int64_t shard_end = -1;
};

TrainStateBytes plan_train_state_bytes(const model::ModelConfig& config,
                                       const model::PrecisionPolicy& policy,
                                       const TrainStateOptions& options);

// ---- State --------------------------------------------------------------------------------------

// The FP8 working copy of one linear W [rows, cols] (E4M3 codes, row-major) in the device's
// memory and scale layout: on CUDA, kernels::cuda::Fp8DeviceView{rows, cols, kBlock128x128,
// codes, scales} is the GEMM operand (and {cols, rows, kBlock128x128, t_codes, t_scales} the
// transpose).
struct Fp8Weight {
  int64_t param = -1;  // index into layout().params()
  int64_t rows = 0, cols = 0;
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  uint8_t* t_codes = nullptr;  // keep_transposed only: W^T [cols, rows]
  float* t_scales = nullptr;
};

class DeviceTrainState {
 public:
  // Uploads the model's fp32 master, zero moments, zero gradients, its KV scales, and the FP8
  // working copy of every linear the policy runs in FP8 exactly as the model holds it (codes
  // pinned from an FP8 checkpoint stay as they are until the first step, as with the CPU model).
  // InvalidArgument for a bad AdamW config (naming the field) or an inference-only model;
  // ResourceExhausted when the device memory is not there.
  static absl::StatusOr<std::unique_ptr<DeviceTrainState>> Create(
      const model::Model& model, const TrainStateOptions& options,
      std::unique_ptr<TrainDevice> device);

  const model::ModelConfig& config() const { return config_; }
  const model::PrecisionPolicy& policy() const { return policy_; }
  const model::ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total(); }
  TrainDevice& device() const { return *device_; }
  TrainStateBytes bytes() const { return bytes_; }

  // Device buffers, [num_params()] in layout() order. The backward accumulates into grads().
  float* master() const { return master_; }
  float* grads() const { return grads_; }
  const float* exp_avg() const { return m_; }
  const float* exp_avg_sq() const { return v_; }
  // keep_bf16_copy only (nullptr otherwise): bf16 bits of master(), as of the last step/load.
  const uint16_t* bf16_params() const { return bf16_; }
  absl::Status zero_grads();

  // The FP8 working copies, in layout order; fp8_weight(param) is nullptr for a parameter that
  // is not an FP8 linear under the policy.
  const std::vector<Fp8Weight>& fp8_weights() const { return fp8_; }
  const Fp8Weight* fp8_weight(int64_t param) const;

  // model::AdamW::step on the device: grads() * grad_scale is the gradient; global-norm clipping,
  // AdamW with the same schedule and decay rule, then requantize(). Non-finite gradients fail
  // (InvalidArgument) without touching master, moments or step count; grads() is left scaled and
  // clipped.
  absl::StatusOr<model::OptimizerStepStats> step(float grad_scale = 1.0f);
  // Re-derives every FP8 working copy (and the bf16 copy) from master(); step() calls it.
  absl::Status requantize();
  double lr_at(int64_t step) const { return model::adamw_lr_at(options_.adamw, step); }
  int64_t steps() const { return step_; }
  const model::AdamWConfig& adamw_config() const { return options_.adamw; }
  absl::Status set_lr(double lr);  // as AdamW::set_lr

  // ---- ZeRO-2 (trainer.shard grads_optimizer, docs/design/sharding.md "ZeRO-2 on the device")
  // Keeps the fp32 master, AdamW moments and gradients of the flat parameters [begin, end) only
  // (new device buffers; the whole ones are released). [begin, end) must lie between the cut
  // points of train::shard_parameters (InvalidArgument otherwise); FailedPrecondition when
  // already sharded or when the policy has fp32 working copies (they read the whole master).
  // master(), grads(), exp_avg(), exp_avg_sq() are then [shard_size()] from shard_begin().
  absl::Status shard(int64_t begin, int64_t end);
  // Whether [begin, end) may be a shard (shard()'s checks, without changing anything).
  absl::Status check_shard(int64_t begin, int64_t end) const;
  bool sharded() const { return sharded_; }
  int64_t shard_begin() const { return begin_; }
  int64_t shard_size() const { return held_; }  // num_params() when not sharded
  // model::AdamW::step_shard on the device: `grads` (host, the shard's gradients summed over the
  // group) are uploaded, clipped by `grad_norm` (the whole gradient's norm), and the shard's
  // master and moments updated; `grads` is left clipped, as AdamW leaves it. Nothing is
  // re-quantized (install_working sets the working copies). InvalidArgument for a non-finite norm
  // or a size mismatch, FailedPrecondition when not sharded.
  absl::StatusOr<model::OptimizerStepStats> step_shard(std::span<float> grads, double grad_norm);
  // model::Model::encode_working of the shard, derived from the device master: FP8 block rows
  // quantized on the device, everything else rounded to bf16 on the device; only codes, scales
  // and bf16 bits cross to the host. Bit for bit what the CPU model of the same master encodes.
  absl::StatusOr<model::Model::WorkingStreams> encode_working() const;
  // Sets the FP8 working copies (and their transposes) from the whole streams every rank's
  // encode_working gives, concatenated in rank order, and keeps the bf16 stream (host memory) for
  // export_fp8. InvalidArgument when a stream's size does not match the layout.
  absl::Status install_working(const model::Model::WorkingStreams& all);
  // (load_optimizer_state of a sharded state reads the whole file and keeps the shard's range.)
  // The shard's master (host copy, shard_size() floats).
  absl::StatusOr<std::vector<float>> download_master() const;
  // The moments and step of the range this state holds (its shard, or every parameter), and
  // setting them (InvalidArgument on a size mismatch): a sharded checkpoint's per-rank state.
  absl::StatusOr<model::AdamW::RangeState> range_state() const;
  absl::Status set_range_state(model::AdamW::RangeState state);
  // Exports of a sharded state from the whole master gathered by the caller (kF32, kBF16; kFP8
  // takes its FP8 linears from the working copies): Model::export_weights(format, version,
  // whole_master) of a CPU model with the same working copies.
  absl::StatusOr<model::WeightSet> export_with_master(model::WeightFormat format, int64_t version,
                                                      std::span<const float> whole_master) const;

  // ---- KV calibration: amax per layer per call on the device, the percentile on the host.
  // Reserves `n` records (one per sequence of the coming forward, as the CPU forward records) and
  // returns the first record index; moves the device records to the host calibrator first when
  // they would not fit. InvalidArgument when n is not in [1, kv_record_capacity].
  absl::StatusOr<int64_t> begin_kv_records(int64_t n);
  // Records into (record, layer) the amax of k[0, k_count) and v[0, v_count) (device pointers:
  // the rows of one sequence, K after RoPE). InvalidArgument for a record not reserved or a layer
  // out of range.
  absl::Status record_kv_amax(int64_t record, int64_t layer, const float* k, int64_t k_count,
                              const float* v, int64_t v_count);
  // The same with K and V held as bf16 bits (k_count / v_count elements).
  absl::Status record_kv_amax_bf16(int64_t record, int64_t layer, const uint16_t* k,
                                   int64_t k_count, const uint16_t* v, int64_t v_count);
  // All sequences of one forward for one layer: k and v are [rows, kv_dim] (device), sequence s
  // is rows [row0[s], row0[s + 1]) (the last one up to `rows`) and goes to record first + s.
  absl::Status record_kv_amax_rows(int64_t first, int64_t layer, const float* k, const float* v,
                                   int64_t kv_dim, std::span<const int64_t> row0, int64_t rows);
  // Moves the device records (2 floats per layer per record) into kv_calibrator() and clears them.
  absl::Status flush_kv_records();
  // The host calibrator (records of earlier flushes): scales() gives p99.9 x 1.05 / 448.
  model::KvCalibrator& kv_calibrator() { return calibrator_; }
  const model::KvScales& kv_scales() const { return kv_scales_; }
  absl::Status set_kv_scales(const model::KvScales& scales);  // as Model::set_kv_scales

  // ---- Export
  // The publishable weight set, equal to Model::export_weights(WeightFormat::kFP8, version) of a
  // CPU model holding the same master and KV scales: FP8 linears as their working copy's codes
  // and scales, other linears the policy does not keep in BF16 freshly quantized on the device,
  // everything else BF16 rounded on the device. Only codes, scales and bf16 bits cross to the
  // host.
  absl::StatusOr<model::WeightSet> export_fp8(int64_t version = 0) const;
  // Model::export_weights(WeightFormat::kBF16, version) of a CPU model holding the same master and
  // KV scales: every parameter rounded to bf16 on the device (round to nearest even), in chunks
  // of the export scratch; only bf16 bits cross to the host (2 B per parameter, no fp32 copy).
  // Sharded: from the bf16 stream of the last install_working when no linear runs in FP8
  // (FailedPrecondition otherwise: export_with_master).
  absl::StatusOr<model::WeightSet> export_bf16(int64_t version = 0) const;
  // The fp32 master in checkpoint layout (Model::export_weights(kF32)): checkpoints only. The
  // result is the whole master in host memory (4 B per parameter), which is the checkpoint's
  // content; it is built tensor by tensor, one device-to-host copy each.
  absl::StatusOr<model::WeightSet> export_f32(int64_t version = 0) const;
  // Host copies (tests, checkpoints).
  absl::StatusOr<std::vector<float>> download(const float* device_buffer) const;

  // ---- Checkpoints, interchangeable with the CPU trainer's (model/optimizer.h).
  absl::Status save_optimizer_state(const std::string& path) const;  // AdamW::save_state format
  absl::Status load_optimizer_state(const std::string& path);
  // model::save_training_checkpoint's folder (F32 weights + KV scales + optimizer.safetensors).
  absl::Status save_checkpoint(const std::string& dir) const;
  // A folder written by either trainer: Model::Load(dir, policy) onto `device`, then the
  // optimizer state.
  static absl::StatusOr<std::unique_ptr<DeviceTrainState>> LoadCheckpoint(
      const std::string& dir, const model::PrecisionPolicy& policy,
      const TrainStateOptions& options, std::unique_ptr<TrainDevice> device);

 private:
  DeviceTrainState(const model::Model& model, const TrainStateOptions& options,
                   std::unique_ptr<TrainDevice> device);
  absl::Status init(const model::Model& model);
  // The decay runs of [begin_, begin_ + held_), relative to begin_, from the whole layout's.
  void restrict_runs();
  // enc_codes_ / enc_scales_, sized for the largest FP8 tensor (sharded states only).
  absl::Status allocate_encode_scratch();
  // The device slot of (record, layer), after checking both and the counts.
  absl::StatusOr<float*> kv_slot(int64_t record, int64_t layer, int64_t k_count,
                                 int64_t v_count) const;

  model::ModelConfig config_;
  model::PrecisionPolicy policy_;
  model::ParamLayout layout_;
  TrainStateOptions options_;
  std::unique_ptr<TrainDevice> device_;
  TrainStateBytes bytes_;
  float *master_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  uint16_t* bf16_ = nullptr;
  // Runs of consecutive elements with the same weight-decay rule: (offset, count, decay).
  struct DecayRun {
    int64_t offset, count;
    bool decay;
  };
  std::vector<DecayRun> runs_;  // offsets relative to begin_
  // Sharded (shard()): the state holds [begin_, begin_ + held_) of the flat parameters.
  bool sharded_ = false;
  int64_t begin_ = 0, held_ = 0;
  // Sharded: the bf16 stream of the last install_working (host), for export_fp8.
  std::vector<uint16_t> working_bf16_;
  // Sharded: the codes + scales of one FP8 tensor's block rows (encode_working).
  uint8_t* enc_codes_ = nullptr;
  float* enc_scales_ = nullptr;
  std::vector<Fp8Weight> fp8_;
  std::vector<int64_t> fp8_index_;  // per param: index into fp8_ or -1
  int64_t step_ = 0;
  // KV records on the device: [capacity][layers][2] (k, v) amaxes; records [0, kv_used_) taken.
  float* kv_records_ = nullptr;
  int64_t kv_used_ = 0;
  // Export scratch: bf16 bits of one tensor, and the codes + scales of one fresh quantization.
  uint16_t* bf16_scratch_ = nullptr;
  int64_t bf16_scratch_count_ = 0;  // elements of bf16_scratch_
  uint8_t* fp8_scratch_codes_ = nullptr;
  float* fp8_scratch_scales_ = nullptr;
  model::KvCalibrator calibrator_;
  model::KvScales kv_scales_;
};

}  // namespace fp8rl::engine
