// Random, non-zero weight sets in the FP8 payload layout (F8_E4M3 codes with F32 128x128 block
// scales, BF16 tensors, F32 KV scales) for the weight-sync tests: a few MiB, so uploads and pushes
// span several chunks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "model/weight_set.h"
#include "services/weight_sync/payload.h"

namespace fp8rl::weight_sync::testing {

inline std::vector<uint8_t> random_e4m3(int64_t n, std::mt19937& rng) {
  // Codes with a non-zero magnitude and never NaN (x.1111.111): 0x01..0x7E with a random sign.
  std::uniform_int_distribution<int> mag(1, 0x7E), sign(0, 1);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (auto& b : out) b = static_cast<uint8_t>(mag(rng) | (sign(rng) << 7));
  return out;
}

inline std::vector<uint8_t> random_f32(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint8_t> out(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

inline std::vector<uint8_t> random_bf16(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(0.01f, 1.0f);
  std::uniform_int_distribution<int> sign(0, 1);
  std::vector<uint8_t> out(static_cast<size_t>(n) * 2);
  for (int64_t i = 0; i < n; ++i) {
    const float v = sign(rng) ? -dist(rng) : dist(rng);
    uint32_t bits = 0;
    std::memcpy(&bits, &v, 4);
    const uint16_t top = static_cast<uint16_t>(bits >> 16);
    std::memcpy(out.data() + i * 2, &top, 2);
  }
  return out;
}

inline void add_fp8_linear(model::WeightSet& set, const std::string& name, int64_t n, int64_t k,
                           std::mt19937& rng) {
  set.tensors.push_back({name, DType::kF8E4M3, {n, k}, random_e4m3(n * k, rng)});
  const int64_t rows = (n + 127) / 128, cols = (k + 127) / 128;
  set.tensors.push_back(
      {name + "_scale_inv", DType::kF32, {rows, cols}, random_f32(rows * cols, rng, 1e-4f, 1e-2f)});
}

// ~5.6 MiB: a 2048x2048 FP8 linear (4 MiB), a 1000x300 one (edge blocks), a BF16 embedding, a
// BF16 norm and F32 KV scales.
inline model::WeightSet random_fp8_set(int64_t version, uint32_t seed) {
  std::mt19937 rng(seed);
  model::WeightSet set;
  set.version = version;
  set.config_json =
      R"({"model_type": "llama", "hidden_size": 1024, "quantization_config": {"quant_method": )"
      R"("fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}})";
  set.tensors.push_back(
      {"model.embed_tokens.weight", DType::kBF16, {640, 1024}, random_bf16(640 * 1024, rng)});
  add_fp8_linear(set, "model.layers.0.mlp.up_proj.weight", 2048, 2048, rng);
  add_fp8_linear(set, "model.layers.0.self_attn.q_proj.weight", 1000, 300, rng);
  set.tensors.push_back(
      {"model.layers.0.input_layernorm.weight", DType::kBF16, {1024}, random_bf16(1024, rng)});
  set.tensors.push_back(
      {"model.layers.0.self_attn.k_scale", DType::kF32, {}, random_f32(1, rng, 0.01f, 0.1f)});
  set.tensors.push_back(
      {"model.layers.0.self_attn.v_scale", DType::kF32, {}, random_f32(1, rng, 0.01f, 0.1f)});
  return set;
}

// A small BF16 version (no FP8 tensors).
inline model::WeightSet random_bf16_set(int64_t version, uint32_t seed) {
  std::mt19937 rng(seed);
  model::WeightSet set;
  set.version = version;
  set.config_json = R"({"model_type": "llama", "hidden_size": 256})";
  set.tensors.push_back({"model.layers.0.mlp.down_proj.weight",
                         DType::kBF16,
                         {256, 700},
                         random_bf16(256 * 700, rng)});
  set.tensors.push_back({"model.norm.weight", DType::kBF16, {256}, random_bf16(256, rng)});
  return set;
}

// The chunk stream of `set` (for_each_chunk) as WeightChunk messages of at most chunk_bytes.
inline std::vector<v1::WeightChunk> chunks_of(const model::WeightSet& set, uint64_t chunk_bytes) {
  std::vector<v1::WeightChunk> out;
  EXPECT_TRUE(for_each_chunk(set, chunk_bytes, [&](uint64_t offset, std::string_view data) {
                v1::WeightChunk c;
                c.set_version(set.version);
                c.set_offset(offset);
                c.set_data(std::string(data));
                out.push_back(std::move(c));
                return absl::OkStatus();
              }).ok());
  return out;
}

inline void expect_same_set(const model::WeightSet& a, const model::WeightSet& b) {
  ASSERT_EQ(a.version, b.version);
  EXPECT_EQ(a.config_json, b.config_json);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE(a.tensors[i].name);
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_TRUE(a.tensors[i].bytes == b.tensors[i].bytes);
  }
}

// The messages of a version stream (UploadVersionRequest or SubscribeResponse): the manifest of
// `set`, then its payload in 1 MiB chunks, ready to be tampered with.
template <typename Message>
std::vector<Message> stream_messages(const model::WeightSet& set, v1::WeightFormat format) {
  std::vector<Message> out(1);
  *out[0].mutable_manifest() = build_manifest(set, format).value();
  for (v1::WeightChunk& c : chunks_of(set, 1 << 20)) {
    Message m;
    *m.mutable_chunk() = std::move(c);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace fp8rl::weight_sync::testing
