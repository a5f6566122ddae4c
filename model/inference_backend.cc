// The backend-independent parts of model/inference_backend.h: device names, option checks and the
// KV block bookkeeping both backends share (the CPU backend is engine/cpu/cpu_backend.cc, the CUDA
// backend engine/cuda/cuda_backend.cc), and make_cuda_backend's answer in a build without CUDA.
#include "model/inference_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fp8rl::model {

std::string_view device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

absl::StatusOr<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", std::string(name), "' (expected cpu or cuda)"));
}

int64_t InferenceBackend::blocks_for(int64_t capacity) const {
  const int64_t b = std::max<int64_t>(1, memory().kv_block_tokens);
  return (capacity + b - 1) / b;
}

KvBlockPool::KvBlockPool(int64_t total) : total_(total) {
  if (total_ > 0) {
    free_.resize(total_);
    for (int64_t i = 0; i < total_; ++i) free_[i] = static_cast<int32_t>(total_ - 1 - i);
  }
}

absl::StatusOr<std::vector<int32_t>> KvBlockPool::acquire(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("KV cache: ", n, " blocks asked"));
  if (total_ < 0) {
    used_ += n;
    return std::vector<int32_t>{};
  }
  if (n > static_cast<int64_t>(free_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", n, " blocks asked, ", free_.size(), " free"));
  }
  std::vector<int32_t> ids(free_.end() - n, free_.end());
  std::reverse(ids.begin(), ids.end());  // lowest id first
  free_.resize(free_.size() - n);
  used_ += n;
  return ids;
}

void KvBlockPool::release(const std::vector<int32_t>& ids, int64_t n) {
  used_ -= n;
  if (total_ < 0) return;
  // Keep the stack sorted (lowest id on top) so allocation order is deterministic.
  free_.insert(free_.end(), ids.begin(), ids.end());
  std::sort(free_.begin(), free_.end(), std::greater<int32_t>());
}

int64_t kv_block_bytes(const ModelConfig& config, KvCacheDtype dtype, int64_t block_tokens) {
  const int64_t elem = dtype == KvCacheDtype::kF32 ? 4 : dtype == KvCacheDtype::kBF16 ? 2 : 1;
  return 2 * config.num_hidden_layers * block_tokens * config.kv_dim() * elem;
}

absl::Status check_sample_specs(const std::vector<BackendSegment>& segments,
                                const std::vector<SampleSpec>& spec) {
  if (spec.size() != segments.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward_sample: ", spec.size(), " sample specs for ", segments.size(), " segments"));
  }
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i].params == nullptr || spec[i].rng == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward_sample: spec ", i, " lacks params or rng"));
    }
  }
  return absl::OkStatus();
}

absl::Status check_backend_options(const BackendOptions& options) {
  if (options.memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_bytes: must be >= 0, got ", options.memory_budget_bytes));
  }
  if (options.kv_block_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_block_tokens: must be >= 1, got ", options.kv_block_tokens));
  }
  if (options.max_step_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_step_tokens: must be >= 1, got ", options.max_step_tokens));
  }
  if (options.weight_slots != 1 && options.weight_slots != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_slots: must be 1 or 2, got ", options.weight_slots));
  }
  return absl::OkStatus();
}

#ifndef FP8RL_HAVE_CUDA_BACKEND
absl::StatusOr<std::unique_ptr<InferenceBackend>> make_cuda_backend(std::shared_ptr<const Model>,
                                                                    const BackendOptions&) {
  return absl::FailedPreconditionError("device cuda: this build has no CUDA (built without CUDA)");
}
bool cuda_backend_available() { return false; }
std::string cuda_backend_unavailable_reason() { return "built without CUDA"; }
#endif

}  // namespace fp8rl::model
