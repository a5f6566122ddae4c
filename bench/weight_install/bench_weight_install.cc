// fp8rl-bench-weight-install: CPU-seconds, wall time and minor page faults for a generation
// worker to take in one FP8 weight version, the previous way (assemble into a string, copy into a
// WeightSet, build a whole Model with its fp32 master, re-quantization and transposed blocks) next
// to installing in place (chunks straight into the idle slot's receive buffer, then written into
// that slot's inference-only model; docs/design/weight-sync.md "Installing a weight version in
// place"). Both paths start from the same manifest and 4 MiB chunks, so the gRPC receive itself is
// not in either number. Usage: fp8rl-bench-weight-install [config.json] [versions]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/fs.h"
#include "model/config.h"
#include "model/model.h"
#include "model/rng.h"
#include "services/generation_worker/weight_double_buffer.h"
#include "services/generation_worker/weight_loader.h"
#include "services/weight_sync/payload.h"

namespace fp8rl {
namespace {

struct Sample {
  double cpu_s = 0, wall_s = 0;
  long faults = 0;
};

struct Meter {
  rusage ru0{};
  std::chrono::steady_clock::time_point t0;
  Meter() {
    getrusage(RUSAGE_SELF, &ru0);
    t0 = std::chrono::steady_clock::now();
  }
  static double secs(const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; }
  Sample stop() const {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    Sample s;
    s.cpu_s = secs(ru.ru_utime) + secs(ru.ru_stime) - secs(ru0.ru_utime) - secs(ru0.ru_stime);
    s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.faults = ru.ru_minflt - ru0.ru_minflt;
    return s;
  }
};

struct Version {
  v1::VersionManifest manifest;
  std::vector<v1::WeightChunk> chunks;
};

Version wire_version(const model::WeightSet& set) {
  Version out;
  auto manifest = weight_sync::build_manifest(set, v1::WEIGHT_FORMAT_FP8);
  if (!manifest.ok()) {
    std::fprintf(stderr, "build_manifest: %s\n", std::string(manifest.status().message()).c_str());
    std::exit(1);
  }
  out.manifest = *manifest;
  (void)weight_sync::for_each_chunk(set, weight_sync::kDefaultChunkBytes,
                                    [&](uint64_t offset, std::string_view data) {
                                      v1::WeightChunk c;
                                      c.set_version(set.version);
                                      c.set_offset(offset);
                                      c.set_data(std::string(data));
                                      out.chunks.push_back(std::move(c));
                                      return absl::OkStatus();
                                    });
  return out;
}

void check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

int run(int argc, char** argv) {
  const std::string path =
      argc > 1 ? argv[1] : std::string(FP8RL_BENCH_SOURCE_DIR) + "/configs/models/llama-100m.json";
  const int versions = argc > 2 ? std::atoi(argv[2]) : 6;
  auto text = read_text_file(path);
  check(text.status(), "config");
  auto config = model::parse_model_config(*text);
  check(config.status(), "config");
  model::PrecisionPolicy policy;
  policy.linear = model::Precision::kFP8;
  policy.kv_cache = model::KvCacheDtype::kBF16;

  // Two versions of different weights (the trainer's step 1 and step 2), alternated.
  std::vector<Version> wire;
  {
    auto m = model::Model::Init(*config, policy, 1);
    check(m.status(), "init");
    for (int64_t v = 1; v <= 2; ++v) {
      auto set = (*m)->export_weights(model::WeightFormat::kFP8, v);
      check(set.status(), "export");
      wire.push_back(wire_version(*set));
      model::Rng rng(v);
      for (float& w : (*m)->params()) w += static_cast<float>(rng.normal() * 1e-3);
      (*m)->refresh();
    }
  }
  std::printf("config %s, FP8 version of %.1f MB, %d versions per path\n", path.c_str(),
              wire[0].manifest.total_bytes() / 1e6, versions);

  std::vector<Sample> before, after;
  {
    // The previous path: the served model stays alive while the next one is built.
    std::shared_ptr<const model::Model> served;
    for (int i = 0; i < versions; ++i) {
      Version& w = wire[i % 2];
      w.manifest.set_version(i + 1);
      Meter meter;
      weight_sync::PayloadAssembler a;
      check(a.begin(w.manifest), "begin");
      for (v1::WeightChunk& c : w.chunks) {
        c.set_version(i + 1);
        check(a.add(c), "add");
      }
      auto done = a.finish();
      check(done.status(), "finish");
      auto set = weight_sync::to_weight_set(done->manifest, done->payload);
      check(set.status(), "to_weight_set");
      done->payload = std::string();
      auto loaded = generation::load_weights(*set, {});
      check(loaded.status(), "load_weights");
      served = loaded->model;
      before.push_back(meter.stop());
    }
  }
  {
    generation::WeightDoubleBuffer buffer(generation::PrecisionOverrides{});
    std::shared_ptr<const model::Model> served;
    for (int i = 0; i < versions; ++i) {
      Version& w = wire[i % 2];
      w.manifest.set_version(i + 1);
      Meter meter;
      auto target = buffer.receive_target(w.manifest.total_bytes());
      check(target.status(), "receive_target");
      weight_sync::PayloadAssembler a;
      check(a.begin_into(w.manifest, *target), "begin_into");
      for (v1::WeightChunk& c : w.chunks) {
        c.set_version(i + 1);
        check(a.add(c), "add");
      }
      auto done = a.finish();
      check(done.status(), "finish");
      auto view =
          weight_sync::to_weight_view(done->manifest, target->first(done->manifest.total_bytes()));
      check(view.status(), "to_weight_view");
      auto loaded = buffer.install(*view);
      check(loaded.status(), "install");
      served = loaded->model;  // the scheduler's pointer flip
      buffer.served(served.get());
      after.push_back(meter.stop());
    }
    const auto stats = buffer.stats();
    std::printf(
        "double buffer: %lld models built, %lld in-place installs, %lld receive buffers "
        "(%.1f MB), MADV_HUGEPAGE %s\n",
        static_cast<long long>(stats.models_built), static_cast<long long>(stats.in_place_installs),
        static_cast<long long>(stats.buffer_allocations), stats.buffer_bytes / 1e6,
        stats.huge_pages ? "accepted" : "refused");
  }
  std::printf("%-8s %12s %12s %14s %12s %12s %14s\n", "version", "before cpu s", "before wall",
              "before faults", "after cpu s", "after wall", "after faults");
  for (int i = 0; i < versions; ++i) {
    std::printf("%-8d %12.3f %12.3f %14ld %12.3f %12.3f %14ld\n", i + 1, before[i].cpu_s,
                before[i].wall_s, before[i].faults, after[i].cpu_s, after[i].wall_s,
                after[i].faults);
  }
  return 0;
}

}  // namespace
}  // namespace fp8rl

int main(int argc, char** argv) { return fp8rl::run(argc, argv); }
