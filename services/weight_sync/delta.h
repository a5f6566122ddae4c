// FP8 delta versions: a new policy version encoded against a base version a worker already holds.
// Between consecutive GRPO steps most E4M3 codes and most BF16 high bytes stay the same, so each
// tensor is sent as zstd(byte planes of new XOR base) (proto/fp8rl/v1/weight_sync.proto
// TensorDelta); the worker XORs it back onto its base and checks every reconstructed tensor
// against the full version's CRC-32C before use. The service encodes (encode_delta); a worker
// reassembles the delta's chunks (DeltaReceiver) and rebuilds the full payload (apply_delta).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fp8rl/v1/weight_sync.pb.h"
#include "services/weight_sync/payload.h"

namespace fp8rl::weight_sync {

// zstd level of the encoded tensors: level 1 already removes the long zero runs an XOR of two
// close versions consists of, at several hundred MB/s per core.
inline constexpr int kDefaultDeltaZstdLevel = 1;

struct EncodedDelta {
  v1::DeltaManifest manifest;
  std::string payload;  // the encoded tensors, manifest.total_bytes long
  double encode_seconds = 0;
};

// Encodes `target` against `base` (both validated manifests with payloads of their total_bytes).
// A target tensor whose name, dtype and shape match a base tensor is XOR_ZSTD unless that is not
// smaller than its bytes; every other tensor is RAW. InvalidArgument for a payload of the wrong
// size or base.version >= target.version; Internal when zstd fails.
absl::StatusOr<EncodedDelta> encode_delta(const v1::VersionManifest& base,
                                          std::string_view base_payload,
                                          const v1::VersionManifest& target,
                                          std::string_view target_payload,
                                          int zstd_level = kDefaultDeltaZstdLevel);

// Checks a delta manifest on its own: target passes validate_manifest; 0 < base_version <
// target.version; one entry per target tensor with a known encoding; entries contiguous in order
// from offset 0; a RAW entry is as long as its tensor; total_bytes is the sum and at most
// `max_version_bytes`. InvalidArgument naming the field ("delta.tensors[3].offset: ...").
absl::Status validate_delta_manifest(const v1::DeltaManifest& delta,
                                     uint64_t max_version_bytes = kDefaultMaxVersionBytes);

// The worker-side reconstruction: writes the full target payload into `out` from the base
// version's payload bytes `base` and the delta payload, then verifies each tensor against
// delta.target's CRC-32C. `delta` must pass validate_delta_manifest. Errors: InvalidArgument when
// `out` is not target.total_bytes long or the delta payload not total_bytes long;
// FailedPrecondition when `base` is not base_total_bytes long or an XOR_ZSTD entry's base bytes
// lie outside it; DataLoss for a zstd frame that does not decode to exactly the tensor's size or
// a CRC-32C mismatch (naming the tensor). After an error `out` holds garbage.
absl::Status apply_delta(const v1::DeltaManifest& delta, std::span<const uint8_t> base,
                         std::string_view delta_payload, std::span<uint8_t> out);

// Reassembles one delta payload from its chunks with the ordering rules of PayloadAssembler:
// chunks carry target.version, start where the previous one ended, are non-empty, at most
// kMaxChunkBytes and never run past total_bytes. InvalidArgument for a violation (the receiver
// is then reset).
class DeltaReceiver {
 public:
  explicit DeltaReceiver(uint64_t max_version_bytes = kDefaultMaxVersionBytes)
      : max_version_bytes_(max_version_bytes) {}

  // Starts a delta (validate_delta_manifest first). Discards any unfinished one.
  absl::Status begin(v1::DeltaManifest delta);
  absl::Status add(const v1::WeightChunk& chunk);
  void reset();

  bool active() const { return active_; }
  bool complete() const { return active_ && payload_.size() == delta_.total_bytes(); }
  // Target version of the delta in progress (0 when none).
  int64_t version() const { return active_ ? delta_.target().version() : 0; }
  int64_t base_version() const { return active_ ? delta_.base_version() : 0; }
  const v1::DeltaManifest& delta() const { return delta_; }
  // The delta payload received so far.
  std::string_view payload() const { return payload_; }

 private:
  uint64_t max_version_bytes_;
  bool active_ = false;
  v1::DeltaManifest delta_;
  std::string payload_;
};

}  // namespace fp8rl::weight_sync
