// Receive buffers and in-place installs of the generation worker's two weight slots (see
// weight_double_buffer.h).
#include "services/generation_worker/weight_double_buffer.h"

#include <sys/mman.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/config.h"

namespace fp8rl::generation {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

absl::StatusOr<HugePageBuffer> HugePageBuffer::allocate(size_t bytes) {
  HugePageBuffer out;
  if (bytes == 0) return out;
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("receive buffer: cannot map ", size, " bytes"));
  }
  out.data_ = static_cast<char*>(p);
  out.size_ = size;
  out.huge_pages_ = madvise(p, size, MADV_HUGEPAGE) == 0;
  return out;
}

HugePageBuffer::~HugePageBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      huge_pages_(other.huge_pages_) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    huge_pages_ = other.huge_pages_;
  }
  return *this;
}

absl::StatusOr<std::span<char>> WeightDoubleBuffer::receive_target(uint64_t total_bytes) {
  std::lock_guard lock(mu_);
  // Never the slot holding the last installed version's bytes: a delta is applied to them.
  const int index = base_slot_ >= 0 ? 1 - base_slot_ : 1 - serving_;
  Slot& slot = slots_[index];
  slot.payload_version = 0;
  slot.payload_bytes = 0;
  receiving_ = index;
  receiving_bytes_ = total_bytes;
  if (slot.payload.size() < total_bytes) {
    stats_.buffer_bytes -= static_cast<int64_t>(slot.payload.size());
    slot.payload = HugePageBuffer();  // unmap first: never hold both
    absl::StatusOr<HugePageBuffer> buffer = HugePageBuffer::allocate(total_bytes);
    if (!buffer.ok()) return buffer.status();
    slot.payload = std::move(*buffer);
    stats_.buffer_bytes += static_cast<int64_t>(slot.payload.size());
    stats_.buffer_allocations += 1;
    stats_.huge_pages = slot.payload.huge_pages();
  }
  return slot.payload.span().first(total_bytes);
}

absl::StatusOr<LoadedWeights> WeightDoubleBuffer::install(const model::WeightView& view) {
  if (view.version <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight set: version must be > 0, got ", view.version));
  }
  absl::StatusOr<model::PrecisionPolicy> policy = resolve_precision_policy(view, overrides_);
  if (!policy.ok()) return policy.status();
  LoadedWeights out;
  out.version = view.version;
  out.format = weight_set_format(view);
  out.policy = *policy;
  if (!policy->bf16_activations()) {
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::FromWeightView(view, *policy);
    if (!m.ok()) return m.status();
    out.model = std::shared_ptr<const model::Model>(std::move(*m));
    std::lock_guard lock(mu_);
    stats_.full_models_built += 1;
    stats_.installs += 1;
    note_payload(view);
    return out;
  }
  std::lock_guard lock(mu_);
  Slot& slot = slots_[1 - serving_];
  // use_count() == 1: only this slot holds the model, and only this class hands out copies (under
  // mu_), so nobody can start reading it while it is written.
  const bool reuse = slot.model != nullptr && slot.model.use_count() == 1 &&
                     slot.config_json == view.config_json && slot.policy == *policy;
  if (!reuse) {
    absl::StatusOr<model::ModelConfig> config = model::parse_model_config(view.config_json);
    if (!config.ok()) return config.status();
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::ForInference(*config, *policy);
    if (!m.ok()) return m.status();
    slot.model = std::move(*m);
    slot.config_json = view.config_json;
    slot.policy = *policy;
    stats_.models_built += 1;
  }
  if (absl::Status s = slot.model->install(view); !s.ok()) return s;
  stats_.installs += 1;
  stats_.in_place_installs += reuse ? 1 : 0;
  note_payload(view);
  out.model = slot.model;
  return out;
}

void WeightDoubleBuffer::note_payload(const model::WeightView& view) {
  base_slot_ = -1;
  if (receiving_ < 0 || view.tensors().empty()) return;
  Slot& slot = slots_[receiving_];
  const std::span<char> buffer = slot.payload.span();
  const auto* first = reinterpret_cast<const char*>(view.tensors().front().bytes.data());
  if (first < buffer.data() || first >= buffer.data() + buffer.size()) return;
  slot.payload_version = view.version;
  slot.payload_bytes = receiving_bytes_;
  base_slot_ = receiving_;
}

std::span<const char> WeightDoubleBuffer::payload_of(int64_t version) const {
  std::lock_guard lock(mu_);
  if (base_slot_ < 0 || version <= 0) return {};
  const Slot& slot = slots_[base_slot_];
  if (slot.payload_version != version) return {};
  return std::span<const char>(slot.payload.span().data(), slot.payload_bytes);
}

void WeightDoubleBuffer::served(const model::Model* model) {
  std::lock_guard lock(mu_);
  for (int i = 0; i < 2; ++i) {
    if (slots_[i].model.get() == model) serving_ = i;
  }
}

WeightDoubleBuffer::Stats WeightDoubleBuffer::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace fp8rl::generation
