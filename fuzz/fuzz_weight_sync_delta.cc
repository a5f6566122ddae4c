// Fuzz target: a delta version as a generation worker receives it -- a DeltaManifest, the base
// payload the worker holds, then the delta's WeightChunk messages -- through
// validate_delta_manifest, DeltaReceiver and apply_delta. Input: delta-manifest separator
// base-payload [separator chunk]... A reconstruction that succeeds has passed every tensor's
// CRC-32C; one that fails must fail with a status, never by reading outside its buffers.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "services/weight_sync/delta.h"

namespace ws = fp8rl::weight_sync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string_view> parts = fp8rl::fuzz::split_fuzz_input(data, size);
  if (parts.size() < 2) return 0;
  fp8rl::v1::DeltaManifest delta;
  if (!delta.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size()))) return 0;
  constexpr uint64_t kMaxBytes = uint64_t{1} << 20;  // bounded allocations, same checks
  ws::DeltaReceiver receiver(kMaxBytes);
  if (!receiver.begin(delta).ok()) return 0;
  for (size_t i = 2; i < parts.size(); ++i) {
    fp8rl::v1::WeightChunk chunk;
    if (!chunk.ParseFromArray(parts[i].data(), static_cast<int>(parts[i].size()))) continue;
    if (!receiver.add(chunk).ok()) return 0;
  }
  if (!receiver.complete()) return 0;
  // Exactly sized heap copies, so AddressSanitizer catches any read or write past their ends.
  std::vector<uint8_t> base(parts[1].begin(), parts[1].end());
  std::vector<uint8_t> out(receiver.delta().target().total_bytes());
  (void)ws::apply_delta(receiver.delta(), base, receiver.payload(), out);
  return 0;
}
