// The generation worker's two weight slots (docs/design/weight-sync.md "Installing a weight version
// in place"): one serves, the other receives the next version. Each slot holds a receive buffer
// (anonymous memory with transparent huge pages where the kernel allows, allocated once and grown
// only for a larger version) that weight-sync chunks are written straight into, and an
// inference-only model::Model (model.h, Model::ForInference) that the verified version is
// installed into in place. Swapping versions is handing the scheduler the other slot's model
// pointer; after the first two versions nothing is allocated per version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/weight_view.h"
#include "services/generation_worker/weight_loader.h"

namespace fp8rl::generation {

// Anonymous private memory (mmap), advised MADV_HUGEPAGE. Move-only; unmapped on destruction.
class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // ResourceExhausted naming `bytes` when the mapping fails.
  static absl::StatusOr<HugePageBuffer> allocate(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  std::span<char> span() const { return {data_, size_}; }
  size_t size() const { return size_; }
  bool huge_pages() const { return huge_pages_; }  // madvise(MADV_HUGEPAGE) accepted

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  bool huge_pages_ = false;
};

class WeightDoubleBuffer {
 public:
  explicit WeightDoubleBuffer(PrecisionOverrides overrides) : overrides_(overrides) {}

  // Where the next version's payload of `total_bytes` is to be received: the receive buffer of
  // the slot that is not serving, grown (re-mapped) when smaller. It stays valid until the next
  // call. ResourceExhausted when it cannot be mapped.
  absl::StatusOr<std::span<char>> receive_target(uint64_t total_bytes);

  // Resolves the precision policy of `view` (weight_loader.h) and installs the version into the
  // model of the slot that is not serving: in place when that model has the same config and
  // policy and nobody else holds it any more, else into a freshly built inference-only model.
  // An fp32 policy (operator override) gets a full Model::FromWeightView. `view`'s bytes may lie
  // in that slot's receive buffer. Errors as load_weights(); InvalidArgument for version <= 0.
  absl::StatusOr<LoadedWeights> install(const model::WeightView& view);

  // The scheduler now serves `model` (from install()): its slot becomes the serving one.
  void served(const model::Model* model);

  // The payload bytes of `version` when it was the last version installed and its bytes were
  // received into a slot's buffer (receive_target); empty otherwise. Weight-sync deltas are
  // applied to them (services/weight_sync/delta.h). receive_target() never hands out this slot,
  // so the span stays valid until the next version has been installed.
  std::span<const char> payload_of(int64_t version) const;

  struct Stats {
    int64_t installs = 0;            // successful install() calls
    int64_t in_place_installs = 0;   // of them, written into an existing model
    int64_t models_built = 0;        // inference-only models constructed
    int64_t full_models_built = 0;   // fp32-policy fallbacks (Model::FromWeightView)
    int64_t buffer_allocations = 0;  // receive buffers mapped
    int64_t buffer_bytes = 0;        // receive buffer bytes mapped now
    bool huge_pages = false;         // the last mapping was advised MADV_HUGEPAGE
  };
  Stats stats() const;

 private:
  struct Slot {
    HugePageBuffer payload;
    std::shared_ptr<model::Model> model;  // inference-only; null before the first install
    std::string config_json;              // what `model` was built for
    model::PrecisionPolicy policy;
    int64_t payload_version = 0;  // version whose verified bytes the payload holds (0: none)
    uint64_t payload_bytes = 0;   // its size
  };
  // Marks the receiving slot as holding `view`'s bytes when they lie in its buffer. Holds mu_.
  void note_payload(const model::WeightView& view);

  const PrecisionOverrides overrides_;
  // Guards the members below. install() holds it while writing into a slot's model, so two
  // installs never write the same model; a model still referenced elsewhere is never written.
  mutable std::mutex mu_;
  Slot slots_[2];
  int serving_ = 0;     // index of the slot whose model the scheduler serves (or last served)
  int receiving_ = -1;  // slot of the last receive_target() (-1: none yet)
  uint64_t receiving_bytes_ = 0;
  int base_slot_ = -1;  // slot holding the last installed version's bytes (-1: none)
  Stats stats_;
};

}  // namespace fp8rl::generation
