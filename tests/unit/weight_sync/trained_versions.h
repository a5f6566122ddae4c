// Real consecutive policy versions for the delta tests: a small Llama trained with
// train::Learner (SFT steps on random token sequences, AdamW), exported for generation after each
// step exactly as the trainer publishes them. Between two of them only part of the FP8 codes
// change, which is what deltas exploit; random sets (test_weights.h) would share nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/rng.h"
#include "model/weight_set.h"
#include "services/weight_sync/payload.h"
#include "train/learner.h"

namespace fp8rl::weight_sync::testing {

inline model::ModelConfig small_llama_config() {
  model::ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  return c;
}

// `count` versions numbered 1..count in `format` (kFP8 or kBF16): version 1 is the random init,
// each next one follows one SFT step at `learning_rate`.
inline std::vector<model::WeightSet> trained_versions(int count, Precision format,
                                                      double learning_rate) {
  train::InitRequest init;
  init.job_id = "delta-test";
  init.model_config_json = model::model_config_to_json(small_llama_config());
  init.seed = 11;
  init.precision.training = format;
  init.precision.generation = format;
  init.precision.kv_cache = Precision::kFP8;
  init.adamw.lr = learning_rate;
  init.adamw.max_grad_norm = 1.0;
  absl::StatusOr<std::unique_ptr<train::Learner>> learner = train::Learner::create(init);
  EXPECT_TRUE(learner.ok()) << learner.status();
  if (!learner.ok()) return {};
  train::SftRequest sft;
  model::Rng rng(5);
  sft.batch.resize(4);
  for (train::Sequence& s : sft.batch) {
    for (int t = 0; t < 24; ++t) s.tokens.push_back(static_cast<int32_t>(rng.next() % 256));
    s.prompt_length = 4;
  }
  sft.learning_rate = learning_rate;
  std::vector<model::WeightSet> out;
  for (int v = 1; v <= count; ++v) {
    if (v > 1) {
      absl::StatusOr<train::SftResult> step = (*learner)->sft_update(sft);
      EXPECT_TRUE(step.ok()) << step.status();
    }
    absl::StatusOr<train::Export> e = (*learner)->export_for_generation(format, v, true);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return {};
    out.push_back(std::move(e->weights));
  }
  return out;
}

inline v1::WeightFormat wire_format(Precision p) {
  return p == Precision::kFP8 ? v1::WEIGHT_FORMAT_FP8 : v1::WEIGHT_FORMAT_BF16;
}

// The concatenated tensor bytes of `set` (its weight-sync payload).
inline std::string payload_of(const model::WeightSet& set) {
  std::string out;
  for (const model::NamedTensor& t : set.tensors) {
    out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return out;
}

}  // namespace fp8rl::weight_sync::testing
