// The generation loop over an InferenceBackend and generate() on the CPU backend (see
// step_generator.h).
#include "model/step_generator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fp8rl::model {

BackendGenerator::BackendGenerator(std::unique_ptr<model::InferenceBackend> backend,
                                   int64_t max_step_tokens)
    : backend_(std::move(backend)), max_step_tokens_(std::max<int64_t>(1, max_step_tokens)) {}

absl::StatusOr<int64_t> BackendGenerator::add(std::vector<int32_t> prompt,
                                              const model::SamplingParams& params,
                                              uint64_t stream) {
  const model::ModelConfig& c = backend_->config();
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: must hold at least one token");
  if (auto s = model::validate_sampling_params(params, c.vocab_size); !s.ok()) return s;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token id ", prompt[i], " at index ",
                                                     i, " is out of range [0, ", c.vocab_size,
                                                     ")"));
    }
  }
  if (backend_->bounds_step_rows() && static_cast<int64_t>(prompt.size()) > max_step_tokens_) {
    // The device's step scratch holds max_step_tokens rows: a longer prompt cannot run at all.
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", prompt.size(),
                                                   " tokens exceed the rows of one step (",
                                                   max_step_tokens_, ", --max-batch-tokens)"));
  }
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + params.max_new_tokens;
  if (capacity > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt: ", prompt.size(), " tokens + max_new_tokens ", params.max_new_tokens,
                     " exceed max_position_embeddings ", c.max_position_embeddings));
  }
  auto seq = std::make_unique<Sequence>();
  seq->result.id = next_id_++;
  seq->params = params;
  seq->rng = model::Rng(model::derive_seed(params.seed, stream));
  seq->result.prompt = std::move(prompt);
  const int64_t id = seq->result.id;
  if (params.max_new_tokens == 0) {
    seq->result.reason = model::FinishReason::kLength;
    finished_.push_back(std::move(seq->result));
    return id;
  }
  absl::StatusOr<std::unique_ptr<model::KvSequence>> kv = backend_->new_sequence(capacity);
  if (!kv.ok()) return kv.status();
  seq->kv = std::move(*kv);
  active_.push_back(std::move(seq));
  return id;
}

absl::Status BackendGenerator::step() {
  if (active_.empty()) return absl::OkStatus();
  std::vector<model::BackendSegment> segments;
  std::vector<model::SampleSpec> specs;
  std::vector<Sequence*> stepped;
  int64_t rows = 0;
  // Running sequences decode one token each; new ones prefill while the row budget lasts (a
  // prefill longer than the budget runs when it is the step's first row).
  for (auto& s : active_) {
    if (!s->prefilled) continue;
    const int64_t pos = static_cast<int64_t>(s->result.prompt.size() + s->result.tokens.size()) - 1;
    segments.push_back({s->kv.get(), &s->result.tokens.back(), 1, pos, &s->result.routing});
    specs.push_back({&s->params, &s->rng});
    stepped.push_back(s.get());
    ++rows;
  }
  for (auto& s : active_) {
    if (s->prefilled) continue;
    const int64_t n = static_cast<int64_t>(s->result.prompt.size());
    if (rows > 0 && rows + n > max_step_tokens_) continue;
    segments.push_back({s->kv.get(), s->result.prompt.data(), n, 0, &s->result.routing});
    specs.push_back({&s->params, &s->rng});
    stepped.push_back(s.get());
    rows += n;
  }
  std::vector<model::SampledToken> out;
  if (auto s = backend_->forward_sample(segments, specs, &out); !s.ok()) return s;
  if (out.size() != stepped.size()) {
    return absl::InternalError(absl::StrCat("forward_sample returned ", out.size(), " tokens for ",
                                            stepped.size(), " segments"));
  }
  for (size_t i = 0; i < stepped.size(); ++i) {
    Sequence& s = *stepped[i];
    s.prefilled = true;
    s.result.tokens.push_back(out[i].token);
    s.result.logprobs.push_back(out[i].logprob);
    s.result.full_logprobs.push_back(out[i].full_logprob);
  }
  std::vector<std::unique_ptr<Sequence>> still;
  still.reserve(active_.size());
  for (auto& s : active_) {
    const auto& toks = s->result.tokens;
    bool done = false;
    if (s->prefilled && !toks.empty()) {
      const auto& stop = s->params.stop_tokens;
      if (std::find(stop.begin(), stop.end(), toks.back()) != stop.end()) {
        s->result.reason = model::FinishReason::kStop;
        done = true;
      } else if (static_cast<int64_t>(toks.size()) >= s->params.max_new_tokens) {
        s->result.reason = model::FinishReason::kLength;
        done = true;
      }
    }
    if (done) {
      finished_.push_back(std::move(s->result));  // its KvSequence goes with `s` below
    } else {
      still.push_back(std::move(s));
    }
  }
  active_ = std::move(still);
  return absl::OkStatus();
}

std::vector<model::GenerationResult> BackendGenerator::take_finished() {
  std::vector<model::GenerationResult> out;
  out.swap(finished_);
  return out;
}

absl::StatusOr<model::GenerationResult> BackendGenerator::cancel(int64_t id) {
  if (id < 0 || id >= next_id_) {
    return absl::NotFoundError(absl::StrCat("cancel: no sequence with id ", id));
  }
  auto it = std::find_if(active_.begin(), active_.end(),
                         [id](const std::unique_ptr<Sequence>& s) { return s->result.id == id; });
  if (it == active_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cancel: sequence ", id, " already finished or was cancelled"));
  }
  model::GenerationResult partial = std::move((*it)->result);
  partial.reason = model::FinishReason::kCancelled;
  active_.erase(it);  // frees its KV blocks; the others keep their order
  return partial;
}

int64_t BackendGenerator::kv_cache_bytes() const {
  int64_t blocks = 0;
  for (const auto& s : active_) blocks += s->kv ? s->kv->blocks() : 0;
  return blocks * backend_->memory().kv_block_bytes;
}

absl::Status BackendGenerator::set_model(std::shared_ptr<const model::Model> model) {
  if (!active_.empty()) {
    return absl::FailedPreconditionError("set_model: sequences are still being generated");
  }
  return backend_->set_model(std::move(model));
}

absl::StatusOr<std::vector<GenerationResult>> generate(
    std::shared_ptr<const Model> model, const std::vector<std::vector<int32_t>>& prompts,
    const SamplingParams& params) {
  absl::StatusOr<std::unique_ptr<InferenceBackend>> backend =
      make_cpu_backend(std::move(model), BackendOptions{});
  if (!backend.ok()) return backend.status();
  int64_t rows = 2048;
  for (const auto& p : prompts) rows = std::max(rows, static_cast<int64_t>(p.size()));
  BackendGenerator gen(*std::move(backend), rows);
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<int64_t> id = gen.add(prompts[i], params, i);
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat("prompt ", i, ": ", id.status().message()));
    }
  }
  std::vector<GenerationResult> out(prompts.size());
  while (!gen.idle()) {
    if (auto s = gen.step(); !s.ok()) return s;
    for (auto& r : gen.take_finished()) out[r.id] = std::move(r);
  }
  for (auto& r : gen.take_finished()) out[r.id] = std::move(r);
  return out;
}

}  // namespace fp8rl::model
