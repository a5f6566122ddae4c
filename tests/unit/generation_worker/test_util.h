// Shared helpers of the generation-worker tests: a tiny random Llama model, its exported weight
// sets, and the reference generation (model::generate) results are compared with.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "model/precision.h"
#include "model/step_generator.h"
#include "model/weight_set.h"

namespace fp8rl::generation::testing {

// Small enough to generate in milliseconds; hidden 160 spans two 128-wide FP8 blocks.
inline model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.vocab_size = 96;
  c.hidden_size = 160;
  c.intermediate_size = 192;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 40;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  return c;
}

// A random model (weights N(0, 0.2): peaked but not degenerate next-token distributions).
inline std::unique_ptr<model::Model> random_model(uint64_t seed,
                                                  model::PrecisionPolicy policy = {}) {
  if (policy.linear == model::Precision::kF32) policy.linear = model::Precision::kFP8;
  auto m = model::Model::Init(tiny_config(), policy, seed, 0.2f);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

inline model::WeightSet export_set(const model::Model& m, model::WeightFormat format,
                                   int64_t version) {
  auto set = m.export_weights(format, version);
  EXPECT_TRUE(set.ok()) << set.status();
  return std::move(*set);
}

inline model::PrecisionPolicy policy_of(model::Precision linear, model::KvCacheDtype kv) {
  model::PrecisionPolicy p;
  p.linear = linear;
  p.kv_cache = kv;
  return p;
}

// What a worker serving `set` with `policy` must return for one sample: model::generate on the
// prompt alone with the sample's seed.
inline model::GenerationResult reference(const model::WeightSet& set,
                                         const model::PrecisionPolicy& policy,
                                         const std::vector<int32_t>& prompt,
                                         model::SamplingParams params, uint64_t seed) {
  auto m = model::Model::FromWeightSet(set, policy);
  EXPECT_TRUE(m.ok()) << m.status();
  params.seed = seed;
  auto out = model::generate(std::shared_ptr<const model::Model>(std::move(*m)), {prompt}, params);
  EXPECT_TRUE(out.ok()) << out.status();
  return std::move((*out)[0]);
}

// Deterministic non-trivial prompts: length 3..(3 + n % 9), ids spread over the vocabulary.
inline std::vector<int32_t> prompt_for(int n) {
  std::vector<int32_t> p;
  const int len = 3 + n % 9;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((n * 37 + i * 11 + 5) % 96));
  return p;
}

}  // namespace fp8rl::generation::testing
