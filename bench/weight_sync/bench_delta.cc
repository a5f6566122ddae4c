// fp8rl-bench-weight-sync-delta: how much of an FP8 policy version changes per training step, and
// what that makes a delta version cost. For each model config and learning rate it trains a
// random-init policy with train::Learner (AdamW SFT steps on random token sequences), exports the
// FP8 version after every step as the trainer publishes it, and prints per step: the fraction of
// E4M3 codes and BF16 elements that changed, full vs delta bytes, and encode / decode (rebuild +
// CRC-32C check) time. Usage: fp8rl-bench-weight-sync-delta [--quick] (quick: demo + 10M only).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "model/rng.h"
#include "services/weight_sync/delta.h"
#include "services/weight_sync/payload.h"
#include "train/learner.h"

namespace fp8rl::weight_sync {
namespace {

struct Version {
  v1::VersionManifest manifest;
  std::string payload;
};

struct Changed {
  int64_t fp8_changed = 0, fp8_total = 0, bf16_changed = 0, bf16_total = 0;
};

Changed count_changes(const Version& a, const Version& b) {
  Changed c;
  for (int i = 0; i < b.manifest.tensors_size(); ++i) {
    const v1::TensorManifestEntry& t = b.manifest.tensors(i);
    const v1::TensorManifestEntry& s = a.manifest.tensors(i);
    const char* x = a.payload.data() + s.offset();
    const char* y = b.payload.data() + t.offset();
    if (t.dtype() == "F8_E4M3") {
      for (uint64_t j = 0; j < t.byte_size(); ++j) c.fp8_changed += x[j] != y[j];
      c.fp8_total += static_cast<int64_t>(t.byte_size());
    } else if (t.dtype() == "BF16") {
      for (uint64_t j = 0; j + 1 < t.byte_size(); j += 2) {
        c.bf16_changed += x[j] != y[j] || x[j + 1] != y[j + 1];
      }
      c.bf16_total += static_cast<int64_t>(t.byte_size() / 2);
    }
  }
  return c;
}

absl::StatusOr<Version> export_version(train::Learner& learner, int64_t version) {
  absl::StatusOr<train::Export> e = learner.export_for_generation(Precision::kFP8, version, true);
  if (!e.ok()) return e.status();
  absl::StatusOr<v1::VersionManifest> m = build_manifest(e->weights, v1::WEIGHT_FORMAT_FP8);
  if (!m.ok()) return m.status();
  Version v{std::move(*m), {}};
  v.payload.reserve(v.manifest.total_bytes());
  for (const model::NamedTensor& t : e->weights.tensors) {
    v.payload.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return v;
}

int fail(const absl::Status& s) {
  std::fprintf(stderr, "fp8rl-bench-weight-sync-delta: %s\n", std::string(s.message()).c_str());
  return 1;
}

struct Case {
  const char* model;
  int steps;
  int batch, length;
};

int run(int argc, char** argv) {
  const std::string src =
      std::getenv("FP8RL_SOURCE_DIR") ? std::getenv("FP8RL_SOURCE_DIR") : FP8RL_BENCH_SOURCE_DIR;
  std::vector<Case> cases = {
      {"small", 3, 8, 32}, {"llama-10m", 3, 4, 64}, {"llama-100m", 2, 2, 64}};
  if (argc > 1 && std::string(argv[1]) == "--quick") cases.resize(2);
  // The demo's GRPO learning rate (configs/demo.yaml) and 10x / 0.1x.
  const std::vector<double> lrs = {1e-5, 1e-4, 1e-3};
  std::printf("%-10s %-6s %4s %10s %10s %10s %10s %7s %9s %9s\n", "model", "lr", "step", "fp8 chg",
              "bf16 chg", "full MB", "delta MB", "ratio", "encode s", "decode s");
  for (const Case& c : cases) {
    for (double lr : lrs) {
      train::InitRequest init;
      init.job_id = "bench";
      init.model_config_json = src + "/configs/models/" + c.model + ".json";
      init.seed = 1;
      init.adamw.lr = lr;
      init.adamw.max_grad_norm = 1.0;
      absl::StatusOr<std::unique_ptr<train::Learner>> learner = train::Learner::create(init);
      if (!learner.ok()) return fail(learner.status());
      const int64_t vocab = (*learner)->policy().config().vocab_size;
      model::Rng rng(7);
      train::SftRequest sft;
      sft.learning_rate = lr;
      sft.batch.resize(c.batch);
      for (train::Sequence& s : sft.batch) {
        for (int t = 0; t < c.length; ++t) {
          s.tokens.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab)));
        }
        s.prompt_length = 8;
      }
      absl::StatusOr<Version> prev = export_version(**learner, 1);
      if (!prev.ok()) return fail(prev.status());
      for (int step = 1; step <= c.steps; ++step) {
        if (absl::StatusOr<train::SftResult> r = (*learner)->sft_update(sft); !r.ok()) {
          return fail(r.status());
        }
        absl::StatusOr<Version> next = export_version(**learner, step + 1);
        if (!next.ok()) return fail(next.status());
        absl::StatusOr<EncodedDelta> d =
            encode_delta(prev->manifest, prev->payload, next->manifest, next->payload);
        if (!d.ok()) return fail(d.status());
        std::string out(next->payload.size(), '\0');
        const auto t0 = std::chrono::steady_clock::now();
        const absl::Status applied = apply_delta(
            d->manifest,
            std::span(reinterpret_cast<const uint8_t*>(prev->payload.data()), prev->payload.size()),
            d->payload, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
        const double decode =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!applied.ok()) return fail(applied);
        if (out != next->payload) return fail(absl::InternalError("round trip differs"));
        const Changed ch = count_changes(*prev, *next);
        const double full = static_cast<double>(next->payload.size());
        const double delta = static_cast<double>(d->payload.size());
        std::printf("%-10s %-6.0e %4d %9.2f%% %9.2f%% %10.2f %10.2f %7.2f %9.3f %9.3f\n", c.model,
                    lr, step, 100.0 * ch.fp8_changed / std::max<int64_t>(ch.fp8_total, 1),
                    100.0 * ch.bf16_changed / std::max<int64_t>(ch.bf16_total, 1), full / 1e6,
                    delta / 1e6, full / delta, d->encode_seconds, decode);
        std::fflush(stdout);
        prev = std::move(next);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace fp8rl::weight_sync

int main(int argc, char** argv) { return fp8rl::weight_sync::run(argc, argv); }
