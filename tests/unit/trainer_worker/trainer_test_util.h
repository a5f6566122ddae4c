// Shared pieces of the trainer worker tests: a tiny random model config, InitPolicy / TrainStep
// requests on random non-zero data, and a WeightPublisher that records instead of uploading.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/rng.h"
#include "services/trainer_worker/trainer.h"

namespace fp8rl::trainer::testing {

inline constexpr int64_t kVocab = 48;

inline model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  return c;
}

inline v1::InitPolicyRequest init_request(v1::WeightFormat training = v1::WEIGHT_FORMAT_FP8,
                                          v1::WeightFormat generation = v1::WEIGHT_FORMAT_FP8,
                                          bool keep_reference = false, double lr = 1e-2) {
  v1::InitPolicyRequest r;
  r.set_job_id("job-1");
  r.mutable_model()->mutable_init()->set_model_config_json(
      model::model_config_to_json(tiny_config()));
  r.mutable_model()->mutable_init()->set_seed(7);
  r.mutable_precision()->set_training(training);
  r.mutable_precision()->set_generation(generation);
  r.mutable_precision()->set_kv_cache(v1::WEIGHT_FORMAT_FP8);
  r.mutable_optimizer()->set_learning_rate(lr);
  r.mutable_optimizer()->set_adam_beta1(0.9);
  r.mutable_optimizer()->set_adam_beta2(0.999);
  r.mutable_optimizer()->set_adam_epsilon(1e-8);
  r.mutable_optimizer()->set_max_grad_norm(1.0);
  r.set_keep_reference(keep_reference);
  return r;
}

// `n` sequences: a 3-token prompt and a 4..6-token response of random ids, advantages
// alternating +1 / -1, gen_logprobs random in [-4, -0.5] (callers usually overwrite them).
inline v1::TrainStepRequest random_step(uint64_t seed, int n) {
  model::Rng rng(seed);
  v1::TrainStepRequest r;
  r.set_job_id("job-1");
  r.set_step(1);
  for (int i = 0; i < n; ++i) {
    v1::TrainSequence* s = r.add_batch();
    const int len = 3 + 4 + static_cast<int>(rng.next() % 3);
    for (int t = 0; t < len; ++t) s->add_tokens(static_cast<int32_t>(rng.next() % kVocab));
    s->set_prompt_length(3);
    s->set_advantage(i % 2 == 0 ? 1.0f : -1.0f);
    for (int t = 3; t < len; ++t) {
      s->add_gen_logprobs(static_cast<float>(-0.5 - 3.5 * rng.uniform()));
    }
  }
  auto* a = r.mutable_algorithm();
  a->set_clip_eps(0.2);
  a->set_is_rule(v1::IS_RULE_NONE);
  a->set_minibatches(1);
  return r;
}

// Records every upload; latest_version() answers `latest` and, when `block` is set, waits for
// release() first (to hold a Publish call in flight).
class RecordingPublisher final : public WeightPublisher {
 public:
  absl::StatusOr<int64_t> latest_version(const std::string& address) override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return !block_; });
    addresses.push_back(address);
    return latest;
  }
  absl::StatusOr<uint64_t> upload(const std::string& address, const model::WeightSet& set,
                                  v1::WeightFormat format) override {
    std::lock_guard<std::mutex> lock(mu_);
    uploads.push_back(set);
    formats.push_back(format);
    return static_cast<uint64_t>(set.nbytes());
  }
  absl::StatusOr<uint64_t> upload_part(const std::string& /*address*/,
                                       const v1::VersionManifest& manifest,
                                       std::span<const model::NamedTensor> tensors) override {
    std::lock_guard<std::mutex> lock(mu_);
    part_manifests.push_back(manifest);
    uint64_t bytes = 0;
    for (const model::NamedTensor& t : tensors) bytes += t.bytes.size();
    return bytes;
  }
  void set_block(bool block) {
    std::lock_guard<std::mutex> lock(mu_);
    block_ = block;
    entered_ = false;
    cv_.notify_all();
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return entered_; });
  }

  int64_t latest = 0;
  std::vector<std::string> addresses;
  std::vector<model::WeightSet> uploads;
  std::vector<v1::WeightFormat> formats;
  std::vector<v1::VersionManifest> part_manifests;  // upload_part() calls

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool block_ = false;
  bool entered_ = false;
};

// Sum of the response-token logprobs of each sequence under the trainer's current policy.
inline std::vector<double> sequence_logprobs(Trainer& trainer, const v1::TrainStepRequest& step) {
  v1::ComputeLogprobsRequest req;
  *req.mutable_sequences() = step.batch();
  absl::StatusOr<v1::ComputeLogprobsResponse> resp = trainer.compute_logprobs(req);
  EXPECT_TRUE(resp.ok()) << resp.status();
  std::vector<double> out;
  if (!resp.ok()) return out;
  for (const auto& s : resp->sequences()) {
    double sum = 0;
    for (float v : s.logprobs()) sum += v;
    out.push_back(sum);
  }
  return out;
}

// Sets every sequence's gen_logprobs to the trainer's current logprobs (an on-policy batch).
inline void set_gen_to_current(Trainer& trainer, v1::TrainStepRequest* step) {
  v1::ComputeLogprobsRequest req;
  *req.mutable_sequences() = step->batch();
  absl::StatusOr<v1::ComputeLogprobsResponse> resp = trainer.compute_logprobs(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  for (int i = 0; i < step->batch_size(); ++i) {
    *step->mutable_batch(i)->mutable_gen_logprobs() = resp->sequences(i).logprobs();
  }
}

}  // namespace fp8rl::trainer::testing
