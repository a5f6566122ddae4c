// fp8rl-bench-decode-gpu: decode and prefill tokens/s of a Llama-3.1-8B-shaped model (random
// weights, --layers of its 32 decoder layers, full 128256 vocabulary) through the CUDA inference
// backend (model/inference_backend.h), in BF16, FP8 linears, and FP8 linears + FP8 KV cache, with
// each cell's ratio to BF16 from the same run. bench/decode_gpu/torch_baseline.py prints the same
// columns for PyTorch BF16 + SDPA. Never run on a GPU yet (docs/perf.md "Decode on the GPU").
//
// Cells: prefill = one forward of min(batch, prefill-tokens / context) prompts of `context` random
// tokens ("seqs"); decode = `decode-steps` forward_sample steps of one token for each of `batch`
// sequences whose KV cache holds `context` positions. Filling those caches is a prefill of
// batch x context tokens; a decode cell whose fill would not fit in what is left of
// --budget-seconds (estimated from the prefill cell's rate) is printed as skipped, not run.
//
//   fp8rl-bench-decode-gpu [--layers 4] [--vocab 128256] [--batches 1,32,256] [--contexts
//   1024,4096]
//                          [--decode-steps 8] [--prefill-tokens 16384] [--budget-seconds 150]
//                          [--gpu-memory-fraction 0.9] [--probe] [--setup-only]
// --setup-only times the host-side set-up (random model, exports, one model per variant) without
// a GPU and exits. Each table row is printed (and flushed) as its cell ends, so a run stopped by
// a timeout keeps the cells it finished.
// After the cells, one weight install as a generation worker does it (issue 19, "install in
// place" on the device), FP8 + FP8 KV: an inference-only model installed from the FP8 payload,
// then (a) one weight slot: set_model copies it at the swap; (b) two slots: prepare_model copies
// it into the idle slot (its host-side time), decode steps run meanwhile, set_model then only
// switches. Printed as lines starting "install:".
// Exit: 0 done; 1 an error; 2 no sm_90 device (--probe: 0 when there is one).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "model/config.h"
#include "model/device.h"
#include "model/inference_backend.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/weight_view.h"

namespace {

using namespace fp8rl;  // NOLINT: benchmark main file
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t layers = 4;
  int64_t vocab = 128256;  // Llama 3.1's; smaller only to shorten the host-side set-up
  std::vector<int64_t> batches = {1, 32, 256};
  std::vector<int64_t> contexts = {1024, 4096};
  int64_t decode_steps = 8;
  int64_t prefill_tokens = 16384;
  double budget_seconds = 150;
  double gpu_memory_fraction = 0.9;
  bool probe = false;
  bool setup_only = false;  // time the host-side set-up alone (no GPU needed) and exit
};

bool parse_list(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) return false;
    out->push_back(v);
  }
  return !out->empty();
}

bool parse_options(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--probe" || a == "--setup-only") {
      (a == "--probe" ? o->probe : o->setup_only) = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    bool ok = true;
    if (a == "--layers") {
      ok = absl::SimpleAtoi(v, &o->layers) && o->layers >= 1 && o->layers <= 32;
    } else if (a == "--vocab") {
      ok = absl::SimpleAtoi(v, &o->vocab) && o->vocab >= 256 && o->vocab <= 128256;
    } else if (a == "--batches") {
      ok = parse_list(v, &o->batches);
    } else if (a == "--contexts") {
      ok = parse_list(v, &o->contexts);
    } else if (a == "--decode-steps") {
      ok = absl::SimpleAtoi(v, &o->decode_steps) && o->decode_steps >= 1;
    } else if (a == "--prefill-tokens") {
      ok = absl::SimpleAtoi(v, &o->prefill_tokens) && o->prefill_tokens >= 1;
    } else if (a == "--budget-seconds") {
      ok = absl::SimpleAtod(v, &o->budget_seconds) && o->budget_seconds > 0;
    } else if (a == "--gpu-memory-fraction") {
      absl::StatusOr<double> f = model::parse_gpu_memory_fraction(v);
      ok = f.ok();
      if (ok) o->gpu_memory_fraction = *f;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "fp8rl-bench-decode-gpu: bad %s '%s'\n", a.c_str(), v.c_str());
      return false;
    }
  }
  return true;
}

// Llama-3.1-8B (config.json of meta-llama/Llama-3.1-8B) with `layers` decoder layers.
model::ModelConfig llama31_8b(int64_t layers, int64_t max_positions, int64_t vocab) {
  model::ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = std::max<int64_t>(8192, max_positions);
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  return c;
}

struct Variant {
  const char* name;
  model::Precision linear;
  model::KvCacheDtype kv;
};

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = d(rng);
  return t;
}

// One table row's numbers.
struct Cell {
  int64_t seqs = 0;
  double tokens_per_s = -1;  // < 0: skipped
  std::string note;
};

class Runner {
 public:
  Runner(model::InferenceBackend* backend, const Options& o, Clock::time_point deadline)
      : be_(backend), o_(o), deadline_(deadline), rng_(7) {}

  // `seqs` prompts of `context` tokens in forwards of at most prefill_tokens rows; seconds taken.
  absl::StatusOr<double> prefill(const std::vector<model::KvSequence*>& kv, int64_t context) {
    const int64_t vocab = be_->config().vocab_size;
    std::vector<float> logits;
    const int64_t per_forward = std::max<int64_t>(1, o_.prefill_tokens / context);
    const Clock::time_point t0 = Clock::now();
    for (size_t first = 0; first < kv.size(); first += static_cast<size_t>(per_forward)) {
      const size_t end = std::min(kv.size(), first + static_cast<size_t>(per_forward));
      std::vector<std::vector<int32_t>> tokens;
      std::vector<model::BackendSegment> seg;
      for (size_t i = first; i < end; ++i) {
        tokens.push_back(random_tokens(rng_, context, vocab));
        seg.push_back({kv[i], tokens.back().data(), context, 0});
      }
      logits.resize(seg.size() * static_cast<size_t>(vocab));
      if (absl::Status s = be_->forward(seg, logits.data()); !s.ok()) return s;
    }
    return seconds_since(t0);
  }

  absl::StatusOr<Cell> prefill_cell(int64_t batch, int64_t context) {
    Cell c;
    c.seqs = std::min(batch, std::max<int64_t>(1, o_.prefill_tokens / context));
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {  // the first is the warm-up
      std::vector<std::unique_ptr<model::KvSequence>> owned;
      std::vector<model::KvSequence*> kv;
      for (int64_t i = 0; i < c.seqs; ++i) {
        absl::StatusOr<std::unique_ptr<model::KvSequence>> s = be_->new_sequence(context);
        if (!s.ok()) return s.status();
        kv.push_back(s->get());
        owned.push_back(std::move(*s));
      }
      absl::StatusOr<double> t = prefill(kv, context);
      if (!t.ok()) return t.status();
      if (rep > 0) best = rep == 1 ? *t : std::min(best, *t);
      if (rep == 0 && Clock::now() + std::chrono::duration<double>(2 * *t) > deadline_) {
        best = *t;  // no time for repeats: report the warm-up run
        c.note = "one run";
        break;
      }
    }
    c.tokens_per_s = static_cast<double>(c.seqs * context) / best;
    prefill_rate_[context] = c.tokens_per_s;
    return c;
  }

  absl::StatusOr<Cell> decode_cell(int64_t batch, int64_t context) {
    Cell c;
    c.seqs = batch;
    const double fill_estimate = static_cast<double>(batch * context) / prefill_rate_[context];
    const double left = std::chrono::duration<double>(deadline_ - Clock::now()).count();
    if (fill_estimate > left) {
      c.note = absl::StrCat("skipped: filling the KV caches would take ~",
                            static_cast<int64_t>(fill_estimate), " s, ",
                            static_cast<int64_t>(std::max(0.0, left)), " s left");
      return c;
    }
    std::vector<std::unique_ptr<model::KvSequence>> owned;
    std::vector<model::KvSequence*> kv;
    for (int64_t i = 0; i < batch; ++i) {
      absl::StatusOr<std::unique_ptr<model::KvSequence>> s =
          be_->new_sequence(context + o_.decode_steps + 1);
      if (!s.ok()) return s.status();
      kv.push_back(s->get());
      owned.push_back(std::move(*s));
    }
    if (absl::StatusOr<double> t = prefill(kv, context); !t.ok()) return t.status();
    model::SamplingParams params;
    params.temperature = 1.0f;
    params.max_new_tokens = static_cast<int32_t>(o_.decode_steps + 1);
    std::vector<model::Rng> streams;
    for (int64_t i = 0; i < batch; ++i) streams.emplace_back(static_cast<uint64_t>(i + 1));
    std::vector<int32_t> last = random_tokens(rng_, batch, be_->config().vocab_size);
    std::vector<model::SampleSpec> spec;
    for (int64_t i = 0; i < batch; ++i) spec.push_back({&params, &streams[i]});
    std::vector<model::SampledToken> out;
    auto step = [&](int64_t pos) -> absl::Status {
      std::vector<model::BackendSegment> seg;
      for (int64_t i = 0; i < batch; ++i) seg.push_back({kv[i], &last[i], 1, pos});
      if (absl::Status s = be_->forward_sample(seg, spec, &out); !s.ok()) return s;
      for (int64_t i = 0; i < batch; ++i) last[i] = out[i].token;
      return absl::OkStatus();
    };
    if (absl::Status s = step(context); !s.ok()) return s;  // warm-up step
    const Clock::time_point t0 = Clock::now();
    for (int64_t k = 1; k <= o_.decode_steps; ++k) {
      if (absl::Status s = step(context + k); !s.ok()) return s;
    }
    c.tokens_per_s = static_cast<double>(batch * o_.decode_steps) / seconds_since(t0);
    return c;
  }

 private:
  model::InferenceBackend* be_;
  const Options& o_;
  Clock::time_point deadline_;
  std::mt19937_64 rng_;
  std::map<int64_t, double> prefill_rate_;  // tokens/s by context, from the prefill cells
};

// One version installed into a CUDA backend of `slots` weight slots serving `first`; decode
// steps of one sequence run between prepare_model and set_model (two slots).
absl::Status install_lines(const model::ModelConfig& config, const model::WeightSet& set,
                           const model::PrecisionPolicy& policy, const model::BackendOptions& base,
                           const std::string& device_name) {
  auto inference_model = [&]() -> absl::StatusOr<std::shared_ptr<const model::Model>> {
    const Clock::time_point t = Clock::now();
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::ForInference(config, policy);
    if (!m.ok()) return m.status();
    absl::StatusOr<model::WeightView> view = model::view_of(set);
    if (!view.ok()) return view.status();
    if (absl::Status s = (*m)->install(*view); !s.ok()) return s;
    std::printf("install: host install (Model::install from the payload) %.3f s\n",
                seconds_since(t));
    return std::shared_ptr<const model::Model>(std::move(*m));
  };
  absl::StatusOr<std::shared_ptr<const model::Model>> first = inference_model();
  if (!first.ok()) return first.status();
  absl::StatusOr<std::shared_ptr<const model::Model>> second = inference_model();
  if (!second.ok()) return second.status();
  const double mb = static_cast<double>((*first)->weight_bytes()) / 1e6;
  for (int64_t slots : {1, 2}) {
    model::BackendOptions bo = base;
    bo.weight_slots = slots;
    absl::StatusOr<std::unique_ptr<model::InferenceBackend>> be =
        model::make_cuda_backend(*first, bo);
    if (!be.ok()) return be.status();
    const std::vector<int32_t> prompt(64, 7);
    double prepare_s = 0, decode_s = 0;
    int64_t steps = 0;
    {
      absl::StatusOr<std::unique_ptr<model::KvSequence>> kv = (*be)->new_sequence(256);
      if (!kv.ok()) return kv.status();
      std::vector<float> logits(static_cast<size_t>(config.vocab_size));
      if (absl::Status s = (*be)->forward({{kv->get(), prompt.data(), 64, 0}}, logits.data());
          !s.ok()) {
        return s;
      }
      Clock::time_point t = Clock::now();
      if (absl::Status s = (*be)->prepare_model(*second); !s.ok()) return s;
      prepare_s = seconds_since(t);
      t = Clock::now();
      for (; steps < 32; ++steps) {
        const int32_t tok = 5;
        if (absl::Status s = (*be)->forward({{kv->get(), &tok, 1, 64 + steps}}, logits.data());
            !s.ok()) {
          return s;
        }
      }
      decode_s = seconds_since(t);
    }
    const Clock::time_point t = Clock::now();
    if (absl::Status s = (*be)->set_model(*second); !s.ok()) return s;
    // The swap is done when a forward on the new weights can start: include one decode row.
    absl::StatusOr<std::unique_ptr<model::KvSequence>> kv = (*be)->new_sequence(16);
    if (!kv.ok()) return kv.status();
    std::vector<float> logits(static_cast<size_t>(config.vocab_size));
    const int32_t tok = 3;
    if (absl::Status s = (*be)->forward({{kv->get(), &tok, 1, 0}}, logits.data()); !s.ok()) {
      return s;
    }
    const double swap_s = seconds_since(t);
    std::printf(
        "install: %s, %lld weight slot(s), %.0f MB of weights: prepare_model %.3f s, 32 decode "
        "steps during it %.3f s, set_model + first forward %.3f s (%.2f GB/s if all of it "
        "copies)\n",
        device_name.c_str(), static_cast<long long>(slots), mb, prepare_s, decode_s, swap_s,
        mb / 1e3 / std::max(swap_s + prepare_s, 1e-9));
  }
  return absl::OkStatus();
}

int run(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, &o)) return 1;
  const model::DeviceProbeResult probe = model::probe_cuda_device();
  if (!probe.device.has_value() && !o.setup_only) {
    std::printf("no GPU: %s\n", probe.detail.c_str());
    return 2;
  }
  if (o.probe) {
    std::printf("%s\n", probe.device->name.c_str());
    return 0;
  }
  const Clock::time_point start = Clock::now();
  const int64_t max_context = *std::max_element(o.contexts.begin(), o.contexts.end());
  const model::ModelConfig config = llama31_8b(o.layers, max_context + o.decode_steps + 1, o.vocab);

  // One random model, exported once per weight format; each variant is built from the payload it
  // would receive from weight sync (FP8 codes and scales used as they are).
  model::PrecisionPolicy fp8_policy;
  fp8_policy.linear = model::Precision::kFP8;
  std::map<model::WeightFormat, model::WeightSet> sets;
  {
    absl::StatusOr<std::unique_ptr<model::Model>> master =
        model::Model::Init(config, fp8_policy, 1);
    if (!master.ok()) {
      std::fprintf(stderr, "model init: %s\n", std::string(master.status().message()).c_str());
      return 1;
    }
    for (model::WeightFormat f : {model::WeightFormat::kBF16, model::WeightFormat::kFP8}) {
      absl::StatusOr<model::WeightSet> set = (*master)->export_weights(f, 1);
      if (!set.ok()) {
        std::fprintf(stderr, "export: %s\n", std::string(set.status().message()).c_str());
        return 1;
      }
      sets.emplace(f, std::move(*set));
    }
  }
  if (o.setup_only) {
    std::printf("host setup: random model + BF16 and FP8 exports %.1f s\n", seconds_since(start));
    for (model::WeightFormat f : {model::WeightFormat::kBF16, model::WeightFormat::kFP8}) {
      model::PrecisionPolicy policy;
      policy.linear =
          f == model::WeightFormat::kFP8 ? model::Precision::kFP8 : model::Precision::kBF16;
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<std::unique_ptr<model::Model>> m =
          model::Model::FromWeightSet(sets.at(f), policy);
      if (!m.ok()) {
        std::fprintf(stderr, "model: %s\n", std::string(m.status().message()).c_str());
        return 1;
      }
      std::printf("host setup: %s model from its payload %.1f s\n",
                  f == model::WeightFormat::kFP8 ? "fp8" : "bf16", seconds_since(t0));
    }
    std::printf("host setup total: %.1f s\n", seconds_since(start));
    return 0;
  }
  // The budget covers the cells, not the host-side set-up above.
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.budget_seconds));
  std::printf(
      "fp8rl-bench-decode-gpu: %s; Llama-3.1-8B shapes, %lld of 32 layers + a %lld-token "
      "vocabulary (Llama 3.1: 128256); random weights (set up in %.0f s); budget %.0f s\n",
      probe.device->name.c_str(), static_cast<long long>(o.layers), static_cast<long long>(o.vocab),
      seconds_since(start), o.budget_seconds);

  const Variant variants[] = {{"bf16", model::Precision::kBF16, model::KvCacheDtype::kBF16},
                              {"fp8", model::Precision::kFP8, model::KvCacheDtype::kBF16},
                              {"fp8+kv8", model::Precision::kFP8, model::KvCacheDtype::kFP8}};
  // (variant, phase, batch, context) -> cell
  std::map<std::tuple<std::string, std::string, int64_t, int64_t>, Cell> cells;
  // One row per cell as it ends; bf16 runs first, so every later row has its ratio.
  auto print_row = [&cells](const std::string& variant, const std::string& phase, int64_t batch,
                            int64_t context, const Cell& c) {
    std::string tps =
        c.tokens_per_s < 0 ? c.note : absl::StrCat(static_cast<int64_t>(c.tokens_per_s));
    std::string ratio = "-";
    auto base = cells.find({"bf16", phase, batch, context});
    if (c.tokens_per_s > 0 && base != cells.end() && base->second.tokens_per_s > 0) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.2f", c.tokens_per_s / base->second.tokens_per_s);
      ratio = buf;
    }
    std::printf("| fp8rl | %s | %s | %lld | %lld | %lld | %s | %s |\n", variant.c_str(),
                phase.c_str(), static_cast<long long>(batch), static_cast<long long>(context),
                static_cast<long long>(c.seqs), tps.c_str(), ratio.c_str());
    std::fflush(stdout);
  };
  std::printf("| engine | precision | phase | batch | context | seqs | tokens/s | x bf16 |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::fflush(stdout);
  int rc = 0;
  for (const Variant& v : variants) {
    model::PrecisionPolicy policy;
    policy.linear = v.linear;
    policy.kv_cache = v.kv;
    const model::WeightFormat format =
        v.linear == model::Precision::kFP8 ? model::WeightFormat::kFP8 : model::WeightFormat::kBF16;
    absl::StatusOr<std::unique_ptr<model::Model>> m =
        model::Model::FromWeightSet(sets.at(format), policy);
    if (!m.ok()) {
      std::fprintf(stderr, "%s model: %s\n", v.name, std::string(m.status().message()).c_str());
      return 1;
    }
    model::BackendOptions bo;
    bo.memory_budget_bytes = model::gpu_memory_budget_bytes(*probe.device, o.gpu_memory_fraction);
    bo.kv_block_tokens = 16;
    bo.max_step_tokens = std::max(o.prefill_tokens, max_context);
    absl::StatusOr<std::unique_ptr<model::InferenceBackend>> backend =
        model::make_cuda_backend(std::shared_ptr<const model::Model>(std::move(*m)), bo);
    if (!backend.ok()) {
      std::fprintf(stderr, "%s backend: %s\n", v.name,
                   std::string(backend.status().message()).c_str());
      return 1;
    }
    Runner runner(backend->get(), o, deadline);
    for (int64_t context : o.contexts) {
      for (int64_t batch : o.batches) {
        for (const char* phase : {"prefill", "decode"}) {
          absl::StatusOr<Cell> c = std::string(phase) == "prefill"
                                       ? runner.prefill_cell(batch, context)
                                       : runner.decode_cell(batch, context);
          if (!c.ok()) {
            std::fprintf(stderr, "%s %s b%lld ctx%lld: %s\n", v.name, phase,
                         static_cast<long long>(batch), static_cast<long long>(context),
                         std::string(c.status().message()).c_str());
            rc = 1;
            continue;
          }
          cells[{v.name, phase, batch, context}] = *c;
          print_row(v.name, phase, batch, context, *c);
        }
      }
    }
  }

  {
    model::PrecisionPolicy policy;
    policy.linear = model::Precision::kFP8;
    policy.kv_cache = model::KvCacheDtype::kFP8;
    model::BackendOptions bo;
    bo.memory_budget_bytes = model::gpu_memory_budget_bytes(*probe.device, o.gpu_memory_fraction);
    bo.kv_block_tokens = 16;
    bo.max_step_tokens = std::max(o.prefill_tokens, max_context);
    if (absl::Status s = install_lines(config, sets.at(model::WeightFormat::kFP8), policy, bo,
                                       probe.device->name);
        !s.ok()) {
      std::fprintf(stderr, "install: %s\n", std::string(s.message()).c_str());
      rc = 1;
    }
  }

  return rc;
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
