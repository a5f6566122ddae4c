// Fuzz target: what a weight-sync upload or push delivers -- a VersionManifest and its
// WeightChunk messages, protobuf-encoded as on the wire -- through validate_manifest,
// PayloadAssembler and, for a verified version, to_weight_view / to_weight_set. Input: manifest
// [separator chunk]... A version that finishes must have exactly total_bytes of payload. The same
// chunks also go through the in-place route a worker's zero-copy receive takes (begin_into,
// chunk_target, commit_chunk), which must accept exactly what add() accepts, with the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "services/weight_sync/payload.h"

namespace ws = fp8rl::weight_sync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string_view> parts = fp8rl::fuzz::split_fuzz_input(data, size);
  fp8rl::v1::VersionManifest manifest;
  if (!manifest.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size()))) return 0;
  // A small version limit keeps the fuzzer's allocations bounded; the checks are the same.
  constexpr uint64_t kMaxBytes = uint64_t{1} << 20;
  ws::PayloadAssembler assembler(kMaxBytes);
  if (!assembler.begin(manifest).ok()) return 0;
  ws::PayloadAssembler in_place(kMaxBytes);
  std::string target(manifest.total_bytes(), '\0');  // begin() accepted it: <= kMaxBytes
  if (!in_place.begin_into(manifest, std::span<char>(target.data(), target.size())).ok()) {
    __builtin_trap();  // same manifest checks as begin()
  }
  bool in_place_ok = true;
  for (size_t i = 1; i < parts.size(); ++i) {
    fp8rl::v1::WeightChunk chunk;
    if (!chunk.ParseFromArray(parts[i].data(), static_cast<int>(parts[i].size()))) continue;
    if (in_place_ok) {
      absl::StatusOr<char*> at =
          in_place.chunk_target(chunk.version(), chunk.offset(), chunk.data().size());
      if (at.ok()) std::memcpy(*at, chunk.data().data(), chunk.data().size());
      in_place_ok = at.ok() && in_place.commit_chunk().ok();
    }
    const bool added = assembler.add(chunk).ok();
    if (added != in_place_ok) __builtin_trap();  // both routes judge a chunk alike
    if (!added) return 0;                        // the assembler resets itself after an error
  }
  absl::StatusOr<ws::AssembledVersion> version = assembler.finish();
  if (!version.ok()) return 0;
  if (version->payload.size() != version->manifest.total_bytes()) __builtin_trap();
  if (!in_place.complete() ||
      std::memcmp(target.data(), version->payload.data(), version->payload.size()) != 0) {
    __builtin_trap();
  }
  (void)ws::to_weight_view(version->manifest, version->payload);
  (void)ws::to_weight_set(version->manifest, version->payload);
  return 0;
}
