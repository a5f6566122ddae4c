// The weight-sync wire format in one place, shared by the service and its clients: building a
// version manifest (with a CRC-32C per tensor) from a model::WeightSet, validating a manifest,
// reassembling the chunk stream with the same ordering and checksum rules on both ends, and
// turning a verified payload back into a WeightSet. Keeping both ends on one implementation is
// what makes "a corrupt version is never served and never loaded" a single, tested rule.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fp8rl/v1/weight_sync.pb.h"
#include "model/weight_set.h"
#include "model/weight_view.h"

namespace fp8rl::weight_sync {

// Chunk size used by uploads and by the service's pushes: just under 4 MiB, so a chunk message
// with its framing still fits gRPC's default 4 MiB receive limit on any client channel.
inline constexpr uint64_t kDefaultChunkBytes = (uint64_t{4} << 20) - 4096;
// Largest chunk either end accepts (proto/fp8rl/v1/weight_sync.proto: "at most 8 MiB").
inline constexpr uint64_t kMaxChunkBytes = uint64_t{8} << 20;
// Largest version accepted unless a limit is given (a DoS guard, not a model-size limit).
inline constexpr uint64_t kDefaultMaxVersionBytes = uint64_t{64} << 30;

// "fp8" | "bf16" (metric labels, logs); "unspecified" otherwise.
std::string_view format_label(v1::WeightFormat format);

// Checks a manifest on its own: version > 0; format FP8 or BF16; model_config_json a JSON object;
// at least one tensor; names non-empty and unique; dtypes known; shapes non-negative and
// byte_size == numel * dtype size; offsets contiguous in order; total_bytes the sum and at most
// `max_version_bytes`. Format rules: BF16 versions carry no F8_E4M3 tensor; in FP8 versions every
// F8_E4M3 tensor is 2-D [N, K] with an F32 "<name>_scale_inv" of shape [ceil(N/128),
// ceil(K/128)]. InvalidArgument naming the field ("manifest.tensors[2] (w): ...").
absl::Status validate_manifest(const v1::VersionManifest& manifest,
                               uint64_t max_version_bytes = kDefaultMaxVersionBytes);

// The manifest of `set` in `format` (version and config from the set), with offsets and a
// CRC-32C per tensor; validated with validate_manifest.
absl::StatusOr<v1::VersionManifest> build_manifest(const model::WeightSet& set,
                                                   v1::WeightFormat format);

// Calls `emit(offset, data)` for consecutive slices of the concatenated tensor bytes of `set`,
// each at most `chunk_bytes` (> 0) and all but the last exactly that long. Stops at and returns
// the first error `emit` returns.
absl::Status for_each_chunk(const model::WeightSet& set, uint64_t chunk_bytes,
                            const std::function<absl::Status(uint64_t, std::string_view)>& emit);

// The byte range [begin, end) of the payload that one part of a parallel upload carries, and the
// tensors [first_tensor, end_tensor) that lie in it (proto: VersionManifest.part_offsets).
struct PartRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  int first_tensor = 0;
  int end_tensor = 0;
};

// True when `manifest` is one part of a parallel upload (part_count > 1 or part_offsets set).
bool is_multipart(const v1::VersionManifest& manifest);

// Checks the part fields of a manifest that passed validate_manifest and returns the range of its
// part_index: part_count in [1, kMaxUploadParts] with part_offsets.size() == part_count;
// part_index < part_count; upload_id != 0; part_offsets[0] == 0, strictly increasing (no empty or
// overlapping part), each below total_bytes and each the offset of a tensor (no tensor split
// between parts). A single-part manifest (part_count 0 or 1, no offsets, index 0) is the whole
// payload. InvalidArgument naming the field ("manifest.part_offsets[2]: ...").
inline constexpr uint32_t kMaxUploadParts = 256;
absl::StatusOr<PartRange> part_range(const v1::VersionManifest& manifest);

// Sets the part fields of `manifest` (validated) for an upload in `parts` parts of about equal
// bytes, cut at tensor boundaries (part_index 0; upload_id the wall clock in ns unless set).
// InvalidArgument when `parts` is outside [1, kMaxUploadParts] or larger than the number of
// non-empty tensors.
absl::Status plan_parts(v1::VersionManifest* manifest, uint32_t parts);

// Empty when `a` and `b` are the same manifest apart from part_index; otherwise the first field
// that differs, as a path ("tensors[3].crc32c", "model_config_json").
std::string manifest_difference(const v1::VersionManifest& a, const v1::VersionManifest& b);

// A verified version: its manifest and the concatenated payload bytes.
struct AssembledVersion {
  v1::VersionManifest manifest;
  std::string payload;
};

// Reassembles one version from a manifest and its chunks, checking as it goes: chunks carry the
// manifest's version, start exactly where the previous one ended (a gap or an overlap is an
// error), are non-empty, at most kMaxChunkBytes and never run past total_bytes; each tensor's
// CRC-32C is checked as soon as its last byte arrives. Errors: InvalidArgument for protocol
// violations, DataLoss for a checksum mismatch or an incomplete payload. After an error the
// assembler is reset (a new begin() is needed).
class PayloadAssembler {
 public:
  explicit PayloadAssembler(uint64_t max_version_bytes = kDefaultMaxVersionBytes)
      : max_version_bytes_(max_version_bytes) {}

  // Starts a version (validate_manifest first). Discards any unfinished one. The payload is
  // received into `buffer` (cleared first; pass a reused one, PayloadPool, to keep its pages).
  absl::Status begin(v1::VersionManifest manifest, std::string buffer = {});
  // begin() that writes the payload straight into `target` (a caller's buffer, e.g. the inactive
  // half of a generation worker's double buffer) instead of a string of its own; the same checks
  // apply as chunks land, and finish() then returns an empty `payload` (the verified bytes are
  // target[0, total_bytes)). `target` must stay valid until finish() or reset(); bytes of a
  // version that fails are left partly written. ResourceExhausted naming manifest.total_bytes
  // when `target` is smaller.
  absl::Status begin_into(v1::VersionManifest manifest, std::span<char> target);
  // begin_into() for one part of a parallel upload: `target` is the whole payload buffer, and the
  // chunks must cover exactly [range.begin, range.end) in order (the first at range.begin); the
  // tensors in the range are CRC-checked as their last byte lands. finish() then needs the
  // range complete. Other parts write the rest of `target` meanwhile (disjoint bytes).
  absl::Status begin_part_into(v1::VersionManifest manifest, std::span<char> target,
                               const PartRange& range);
  absl::Status add(const v1::WeightChunk& chunk);
  // add() without a WeightChunk message, for a receiver that copies a chunk's bytes straight from
  // the transport (WeightSubscriber's zero-copy receive): checks the chunk's header as add() does
  // and returns where its `size` bytes go in begin_into()'s target; the caller writes exactly
  // those bytes there, then calls commit_chunk(), which verifies what landed as add() does.
  // FailedPrecondition when not begun with begin_into(); errors as add() otherwise.
  absl::StatusOr<char*> chunk_target(int64_t version, uint64_t offset, uint64_t size);
  absl::Status commit_chunk();
  // The finished version; DataLoss naming received vs expected bytes when incomplete.
  absl::StatusOr<AssembledVersion> finish();
  void reset();

  bool active() const { return active_; }
  bool complete() const { return active_ && received_ == end_; }
  int64_t version() const { return active_ ? manifest_.version() : 0; }
  // The payload offset up to which bytes arrived (from the part's first byte with
  // begin_part_into()).
  uint64_t received() const { return received_; }

 private:
  // The received bytes so far (payload_ or target_).
  const char* bytes() const { return target_.empty() ? payload_.data() : target_.data(); }
  // Checks every tensor whose bytes are all in, advancing next_tensor_.
  absl::Status check_finished_tensors();
  // " (part [begin, end))" when receiving one part of a parallel upload, "" otherwise.
  std::string part_note() const;
  // The ordering and size rules of a chunk (see the class comment); resets on an error.
  absl::Status check_chunk(int64_t version, uint64_t offset, uint64_t size);

  uint64_t max_version_bytes_;
  bool active_ = false;
  v1::VersionManifest manifest_;
  std::string payload_;     // the payload, unless begun with begin_into()
  std::span<char> target_;  // begin_into()'s buffer (empty otherwise)
  uint64_t received_ = 0;   // payload offset of the next byte expected
  uint64_t begin_ = 0;      // the range being received: [begin_, end_) (all of it unless a part)
  uint64_t end_ = 0;
  int end_tensor_ = 0;     // one past the last tensor in the range
  uint64_t landing_ = 0;   // chunk_target()'s size, until commit_chunk()
  int next_tensor_ = 0;    // first tensor whose checksum is not yet verified
  uint32_t crc_ = 0;       // running CRC-32C of next_tensor_'s bytes received so far
  uint64_t crc_upto_ = 0;  // payload offset up to which crc_ has consumed bytes
};

// Views of the tensors of a verified version into `payload` (nothing copied; the payload must
// outlive the view). InvalidArgument naming the manifest entry for an unknown dtype, bytes
// outside the payload, or a size or name the view refuses.
absl::StatusOr<model::WeightView> to_weight_view(const v1::VersionManifest& manifest,
                                                 std::span<const char> payload);
// The WeightSet of a verified version (tensor bytes copied out of the payload).
absl::StatusOr<model::WeightSet> to_weight_set(const v1::VersionManifest& manifest,
                                               std::string_view payload);

}  // namespace fp8rl::weight_sync
