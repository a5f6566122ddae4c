// Writes the binary seed inputs of the fuzz targets with the project's own writers, so the seeds
// are valid documents the fuzzer then mutates: small .safetensors files (corpus/safetensors/),
// weight-sync versions as manifest + chunks (corpus/weight_sync_payload/) and deltas as delta
// manifest + base payload + chunks (corpus/weight_sync_delta/), in fuzz_input.h's part format.
//   fuzz_make_seeds <fuzz/corpus>
// Deterministic: the same tree writes the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "fuzz/fuzz_input.h"
#include "services/weight_sync/delta.h"
#include "services/weight_sync/payload.h"

namespace {

namespace stdfs = std::filesystem;
namespace ws = fp8rl::weight_sync;
using fp8rl::DType;

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng, int lo, int hi) {
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(dist(rng));
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A small FP8 (or BF16) weight set: an FP8 linear with edge blocks and its scales, a BF16 norm
// and an F32 KV scale; `flip` changes a few codes (a "next version").
fp8rl::model::WeightSet small_set(int64_t version, bool fp8, int flip) {
  std::mt19937 rng(7);
  fp8rl::model::WeightSet set;
  set.version = version;
  set.config_json = R"({"model_type": "llama", "hidden_size": 130})";
  if (fp8) {
    std::vector<uint8_t> codes = random_bytes(130 * 20, rng, 1, 0x7E);
    for (int i = 0; i < flip; ++i) codes[static_cast<size_t>(i) * 37 % codes.size()] ^= 0x3;
    set.tensors.push_back({"model.layers.0.mlp.up_proj.weight", DType::kF8E4M3, {130, 20}, codes});
    set.tensors.push_back({"model.layers.0.mlp.up_proj.weight_scale_inv",
                           DType::kF32,
                           {2, 1},
                           f32_bytes({1e-3f, 2e-3f})});
  }
  std::vector<uint8_t> norm = random_bytes(130 * 2, rng, 0x10, 0x3F);
  for (int i = 0; i < flip; ++i) norm[static_cast<size_t>(i) * 11 % norm.size()] ^= 0x1;
  set.tensors.push_back({"model.norm.weight", DType::kBF16, {130}, norm});
  set.tensors.push_back({"model.layers.0.self_attn.k_scale", DType::kF32, {}, f32_bytes({0.05f})});
  return set;
}

void write_file(const stdfs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

std::string join_parts(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += fp8rl::fuzz::kFuzzPartSeparator;
    out += parts[i];
  }
  return out;
}

std::string chunk_message(int64_t version, uint64_t offset, std::string_view data) {
  fp8rl::v1::WeightChunk chunk;
  chunk.set_version(version);
  chunk.set_offset(offset);
  chunk.set_data(std::string(data));
  return chunk.SerializeAsString();
}

// The full payload of `set` (its tensors' bytes concatenated in manifest order).
std::string payload_of(const fp8rl::model::WeightSet& set) {
  std::string payload;
  (void)ws::for_each_chunk(set, 1 << 20, [&](uint64_t, std::string_view data) {
    payload += data;
    return absl::OkStatus();
  });
  return payload;
}

void check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "make_seeds: %s: %s\n", what, std::string(status.message()).c_str());
    std::exit(1);
  }
}

void safetensors_seeds(const stdfs::path& dir) {
  stdfs::create_directories(dir);
  std::mt19937 rng(3);
  fp8rl::SafetensorsWriter w;
  check(w.add("a.weight", DType::kBF16, {3, 4}, random_bytes(24, rng, 1, 0x7F)), "add");
  check(w.add("b.weight", DType::kF8E4M3, {2, 5}, random_bytes(10, rng, 1, 0x7E)), "add");
  check(w.add_f32("c.scale", {}, {0.25f}), "add");
  check(w.add("d.empty", DType::kF32, {0, 3}, {}), "add");
  w.set_metadata("format", "pt");
  check(w.write((dir / "mixed.safetensors").string()), "write");
  fp8rl::SafetensorsWriter f16;
  check(f16.add("x", DType::kF16, {4}, random_bytes(8, rng, 1, 0x3B)), "add");
  check(f16.add("y", DType::kF64, {1, 2}, f32_bytes({1.0f, 2.0f, 3.0f, 4.0f})), "add");
  check(f16.write((dir / "f16_f64.safetensors").string()), "write");
}

void payload_seeds(const stdfs::path& dir) {
  stdfs::create_directories(dir);
  for (bool fp8 : {true, false}) {
    const fp8rl::model::WeightSet set = small_set(3, fp8, 0);
    absl::StatusOr<fp8rl::v1::VersionManifest> manifest =
        ws::build_manifest(set, fp8 ? fp8rl::v1::WEIGHT_FORMAT_FP8 : fp8rl::v1::WEIGHT_FORMAT_BF16);
    check(manifest.status(), "build_manifest");
    for (uint64_t chunk_bytes : {uint64_t{1} << 20, uint64_t{1000}}) {
      std::vector<std::string> parts = {manifest->SerializeAsString()};
      check(ws::for_each_chunk(set, chunk_bytes,
                               [&](uint64_t offset, std::string_view data) {
                                 parts.push_back(chunk_message(set.version, offset, data));
                                 return absl::OkStatus();
                               }),
            "for_each_chunk");
      write_file(
          dir / (std::string(fp8 ? "fp8" : "bf16") + "_chunks_" + std::to_string(parts.size() - 1)),
          join_parts(parts));
    }
  }
}

void delta_seeds(const stdfs::path& dir) {
  stdfs::create_directories(dir);
  const fp8rl::model::WeightSet base = small_set(3, true, 0);
  const fp8rl::model::WeightSet target = small_set(4, true, 5);
  auto base_manifest = ws::build_manifest(base, fp8rl::v1::WEIGHT_FORMAT_FP8);
  auto target_manifest = ws::build_manifest(target, fp8rl::v1::WEIGHT_FORMAT_FP8);
  check(base_manifest.status(), "build_manifest");
  check(target_manifest.status(), "build_manifest");
  const std::string base_payload = payload_of(base);
  absl::StatusOr<ws::EncodedDelta> delta =
      ws::encode_delta(*base_manifest, base_payload, *target_manifest, payload_of(target));
  check(delta.status(), "encode_delta");
  for (size_t chunk_bytes : {size_t{1} << 20, size_t{64}}) {
    std::vector<std::string> parts = {delta->manifest.SerializeAsString(), base_payload};
    for (size_t off = 0; off < delta->payload.size(); off += chunk_bytes) {
      parts.push_back(chunk_message(target.version, off,
                                    std::string_view(delta->payload).substr(off, chunk_bytes)));
    }
    write_file(dir / ("fp8_delta_chunks_" + std::to_string(parts.size() - 2)), join_parts(parts));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <fuzz/corpus dir>\n", argv[0]);
    return 1;
  }
  const stdfs::path root(argv[1]);
  safetensors_seeds(root / "safetensors");
  payload_seeds(root / "weight_sync_payload");
  delta_seeds(root / "weight_sync_delta");
  std::printf("make_seeds: wrote the binary seeds under %s\n", root.c_str());
  return 0;
}
