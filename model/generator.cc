// Continuous-batching generation loop over the KV-cache forward.
#include "model/generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fp8rl::model {

Generator::Generator(std::shared_ptr<const Model> model, int64_t max_step_tokens)
    : model_(std::move(model)), max_step_tokens_(std::max<int64_t>(1, max_step_tokens)) {}

absl::StatusOr<int64_t> Generator::add(std::vector<int32_t> prompt, const SamplingParams& params,
                                       uint64_t stream) {
  const ModelConfig& c = model_->config();
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: must hold at least one token");
  if (auto s = validate_sampling_params(params, c.vocab_size); !s.ok()) return s;
  if (auto s = model_->check_tokens(prompt, params.max_new_tokens); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", s.message()));
  }
  auto seq = std::make_unique<Sequence>();
  seq->result.id = next_id_++;
  seq->params = params;
  seq->rng = Rng(derive_seed(params.seed, stream));
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + params.max_new_tokens;
  seq->result.prompt = std::move(prompt);
  seq->result.tokens.reserve(params.max_new_tokens);
  seq->result.logprobs.reserve(params.max_new_tokens);
  seq->result.full_logprobs.reserve(params.max_new_tokens);
  const int64_t id = seq->result.id;
  if (params.max_new_tokens == 0) {
    seq->result.reason = FinishReason::kLength;
    finished_.push_back(std::move(seq->result));
    return id;
  }
  seq->cache = model_->new_kv_cache(capacity);
  active_.push_back(std::move(seq));
  return id;
}

absl::Status Generator::step() {
  if (active_.empty()) return absl::OkStatus();
  segments_.clear();
  stepped_.clear();
  int64_t rows = 0;
  // Running sequences decode one token each; new ones prefill while the row budget lasts.
  for (auto& s : active_) {
    if (!s->prefilled) continue;
    const int64_t pos = static_cast<int64_t>(s->result.prompt.size() + s->result.tokens.size()) - 1;
    segments_.push_back({s->cache.get(), &s->result.tokens.back(), 1, pos});
    stepped_.push_back(s.get());
    ++rows;
  }
  for (auto& s : active_) {
    if (s->prefilled) continue;
    const int64_t n = static_cast<int64_t>(s->result.prompt.size());
    if (rows > 0 && rows + n > max_step_tokens_) continue;
    segments_.push_back({s->cache.get(), s->result.prompt.data(), n, 0});
    stepped_.push_back(s.get());
    rows += n;
  }
  const int64_t vocab = model_->config().vocab_size;
  logits_.resize(segments_.size() * vocab);
  if (auto s = model_->forward_cached(segments_, logits_.data(), &ws_); !s.ok()) return s;
  if (const int64_t width = model_->routing_width(); width > 0) {
    // The experts of every row just run, appended per sequence as [token, sparse layer, k].
    const int64_t k = model_->config().moe.num_experts_per_tok, n_sparse = width / k;
    int64_t row = 0;
    for (size_t i = 0; i < stepped_.size(); ++i) {
      std::vector<int32_t>& out = stepped_[i]->result.routing;
      for (int64_t r = 0; r < segments_[i].n; ++r, ++row) {
        for (int64_t li = 0; li < n_sparse; ++li) {
          const int32_t* sel = ws_.routing.data() + (li * rows + row) * k;
          out.insert(out.end(), sel, sel + k);
        }
      }
    }
  }
  for (size_t i = 0; i < stepped_.size(); ++i) {
    Sequence& s = *stepped_[i];
    s.prefilled = true;
    float lp = 0, full_lp = 0;
    const int32_t tok =
        sampler_.sample(logits_.data() + i * vocab, vocab, s.params, s.rng, &lp, &full_lp);
    s.result.tokens.push_back(tok);
    s.result.logprobs.push_back(lp);
    s.result.full_logprobs.push_back(full_lp);
  }
  // Retire finished sequences (keeping the order of the others).
  std::vector<std::unique_ptr<Sequence>> still;
  still.reserve(active_.size());
  for (auto& s : active_) {
    const auto& toks = s->result.tokens;
    bool done = false;
    if (s->prefilled && !toks.empty()) {
      const auto& stop = s->params.stop_tokens;
      if (std::find(stop.begin(), stop.end(), toks.back()) != stop.end()) {
        s->result.reason = FinishReason::kStop;
        done = true;
      } else if (static_cast<int64_t>(toks.size()) >= s->params.max_new_tokens) {
        s->result.reason = FinishReason::kLength;
        done = true;
      }
    }
    if (done) {
      finished_.push_back(std::move(s->result));
    } else {
      still.push_back(std::move(s));
    }
  }
  active_ = std::move(still);
  return absl::OkStatus();
}

std::vector<GenerationResult> Generator::take_finished() {
  std::vector<GenerationResult> out;
  out.swap(finished_);
  return out;
}

absl::StatusOr<GenerationResult> Generator::cancel(int64_t id) {
  if (id < 0 || id >= next_id_) {
    return absl::NotFoundError(absl::StrCat("cancel: no sequence with id ", id));
  }
  auto it = std::find_if(active_.begin(), active_.end(),
                         [id](const std::unique_ptr<Sequence>& s) { return s->result.id == id; });
  if (it == active_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cancel: sequence ", id, " already finished or was cancelled"));
  }
  GenerationResult partial = std::move((*it)->result);
  partial.reason = FinishReason::kCancelled;
  active_.erase(it);  // frees its KV cache; the others keep their order
  return partial;
}

int64_t Generator::kv_cache_bytes() const {
  int64_t n = 0;
  for (const auto& s : active_) n += s->cache ? s->cache->bytes() : 0;
  return n;
}

absl::Status Generator::set_model(std::shared_ptr<const Model> model) {
  if (!active_.empty()) {
    return absl::FailedPreconditionError("set_model: sequences are still being generated");
  }
  model_ = std::move(model);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GenerationResult>> generate(
    std::shared_ptr<const Model> model, const std::vector<std::vector<int32_t>>& prompts,
    const SamplingParams& params) {
  Generator gen(std::move(model));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = gen.add(prompts[i], params, i);
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
