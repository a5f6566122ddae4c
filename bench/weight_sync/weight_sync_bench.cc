// fp8rl-bench-weight-sync: what publishing a policy version costs, phase by phase, with the real
// parts in one process on loopback: a train::Learner takes GRPO steps on random data, exports each
// version (KV calibration + re-quantization), serializes it (manifest with a CRC-32C per tensor),
// uploads it to a WeightSyncServiceImpl on a gRPC server, and N GenerationWorkers (each with its
// own subscriber, install path and scheduler) receive and install it. Prints one row per version
// and the median over the versions after the first, plus the share of publish + sync in a step
// (with --generate the step starts with rollouts on the workers, so it is a whole GRPO step;
// without, rollouts are excluded and the share is an upper bound). bench/weight_sync/run.sh runs it
// for the models of docs/perf.md next to iperf3 on the same loopback.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/service/crc32c.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "common/service/metrics.h"
#include "engine/cpu/train_ops.h"
#include "model/rng.h"
#include "services/generation_worker/generation_worker.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/payload.h"
#include "services/weight_sync/weight_sync_metrics.h"
#include "services/weight_sync/weight_sync_service.h"
#include "train/learner.h"

namespace fp8rl {
namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds used by every thread of this process (client and service alike): on a shared,
// loaded machine a steadier measure of what a phase costs than its wall time.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Options {
  std::string model;  // path to a config.json
  int workers = 1;
  int versions = 3;
  int batch = 4;
  int prompt = 16;
  int response = 48;
  bool delta = false;
  // Also run the calibration pass the trainer used to make (a forward over the step's batch on
  // the updated weights), timed, and compare its KV scales with the ones published.
  bool compare_kv = false;
  // Only export and upload (no workers, no training step): the upload's MB/s on its own.
  bool upload_only = false;
  // Each step starts with rollouts: the batch's prompts are generated to `response` new tokens on
  // the workers (samples spread over them, temperature 1) with the version they hold, so the
  // share column is that of a whole GRPO step (rollouts + step + publish + sync).
  bool generate = false;
  // No training step: every version republishes the initial weights (same bytes, so deltas are
  // trivial); the push path (upload, fan-out, receive, install) on its own, for profiling it and
  // comparing its variants side by side.
  bool no_train = false;
  // > 0: alternate between the previous push path ("old": CRC-32C from tables, a fresh payload
  // buffer per upload, chunks parsed into a message then copied) and the current one ("new")
  // every `ab_block` versions, in one run under the same load; medians per path over the
  // versions that are not the first of their block (that one inherits the other path's buffers)
  // nor 1-2 (they build the worker's slots).
  int ab_block = 0;
  // What --ab switches: "all" (the previous push path above, plus the service's two message
  // copies below and the trainer's copy of upload chunks into messages) or "service" (only those:
  // upload chunks copied from gRPC's slices straight into the payload vs parsed into a message and
  // appended; pushed chunks sent as slices over the stored version vs copied into a
  // SubscribeResponse that gRPC serializes), or "cut-through" (only that: a version pushed while
  // its upload arrives vs once it is stored), or "same-host" (only that: the workers, on weight
  // sync's host, read each version from its same-host file vs receive it over TCP;
  // docs/design/weight-sync.md "Same-host mapping"), or "upload-copy" (only that: upload chunks
  // written as slices over the tensors vs copied into messages), or "publish" (both: the publish
  // path before and after the same-host file and the zero-copy upload).
  std::string ab_what = "all";
  // Weight sync offers its same-host file to the workers (--same-host auto) for every version.
  bool same_host = false;
  // The trainer side hands each version to weight sync as a file in its same-host directory
  // (weight_sync::upload_same_host; implies --same-host). With --ab-what same-host-upload the
  // "old" versions go the default way (zero-copy stream upload, TCP push with cut-through) and
  // the "new" ones with weight sync's --same-host auto: uploaded as a file and read by the
  // workers from the same file.
  bool same_host_upload = false;
  // Parallel upload: version v is uploaded in upload_parts[(v - 1) % size] parts on as many
  // streams, each on its own connection (weight_sync::upload_parallel); more than one entry
  // rotates them version by version in one run and prints a median per part count.
  std::vector<int> upload_parts = {1};
};

void usage() {
  std::fprintf(stderr,
               "usage: fp8rl-bench-weight-sync --model configs/models/<m>.json [--workers N] "
               "[--versions V] [--batch B] [--prompt P] [--response R] [--delta] "
               "[--compare-kv] [--upload-only] [--generate] [--no-train] [--ab BLOCK] "
               "[--ab-what all|service|cut-through|same-host|upload-copy|publish|same-host-upload] "
               "[--same-host] [--same-host-upload] "
               "[--upload-parts N[,N...]]\n");
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--delta" || a == "--compare-kv" || a == "--upload-only" || a == "--generate" ||
        a == "--same-host-upload" || a == "--no-train" || a == "--same-host") {
      (a == "--delta"              ? o->delta
       : a == "--compare-kv"       ? o->compare_kv
       : a == "--generate"         ? o->generate
       : a == "--no-train"         ? o->no_train
       : a == "--same-host"        ? o->same_host
       : a == "--same-host-upload" ? o->same_host_upload
                                   : o->upload_only) = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    int* field = a == "--workers"    ? &o->workers
                 : a == "--versions" ? &o->versions
                 : a == "--batch"    ? &o->batch
                 : a == "--prompt"   ? &o->prompt
                 : a == "--response" ? &o->response
                 : a == "--ab"       ? &o->ab_block
                                     : nullptr;
    if (a == "--model") {
      o->model = v;
    } else if (a == "--upload-parts") {
      o->upload_parts.clear();
      for (absl::string_view item : absl::StrSplit(v, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(item, &n) || n < 1 ||
            n > static_cast<int>(weight_sync::kMaxUploadParts)) {
          std::fprintf(stderr,
                       "--upload-parts: expected part counts in [1, %u] like 1,2,4, got '%s'\n",
                       weight_sync::kMaxUploadParts, v.c_str());
          return false;
        }
        o->upload_parts.push_back(n);
      }
    } else if (a == "--ab-what") {
      if (v != "all" && v != "service" && v != "cut-through" && v != "same-host" &&
          v != "upload-copy" && v != "publish" && v != "same-host-upload") {
        std::fprintf(stderr,
                     "--ab-what: expected all, service, cut-through, same-host, upload-copy, "
                     "publish or same-host-upload, got '%s'\n",
                     v.c_str());
        return false;
      }
      o->ab_what = v;
    } else if (field == nullptr || !absl::SimpleAtoi(v, field) || *field < 1) {
      std::fprintf(stderr, "%s: expected a positive integer, got '%s'\n", a.c_str(), v.c_str());
      return false;
    }
  }
  return !o->model.empty();
}

// A GRPO batch of random tokens: advantages alternate +1/-1, gen logprobs random in [-4, -0.5].
std::vector<train::Sequence> random_batch(const Options& o, int64_t vocab, uint64_t seed) {
  model::Rng rng(seed);
  std::vector<train::Sequence> out(o.batch);
  for (int i = 0; i < o.batch; ++i) {
    train::Sequence& s = out[i];
    for (int t = 0; t < o.prompt + o.response; ++t) {
      s.tokens.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab)));
    }
    s.prompt_length = o.prompt;
    s.advantage = i % 2 == 0 ? 1.0f : -1.0f;
    for (int t = 0; t < o.response; ++t) {
      s.gen_logprobs.push_back(static_cast<float>(-0.5 - 3.5 * rng.uniform()));
    }
  }
  return out;
}

struct Row {
  double rollout = 0;  // --generate: the step's samples generated on the workers
  double step = 0, calibrate = 0, quantize = 0, serialize = 0, upload = 0, sync = 0;
  double mb = 0;
  double export_cpu = 0;  // process CPU seconds during the export
  double upload_cpu = 0;  // process CPU seconds during the upload
  double sync_cpu = 0;    // process CPU seconds during publish -> all hold it
  // Of the sync, on the slowest worker: its manifest to last byte verified (transfer + CRC-32C;
  // it overlaps the upload under cut-through), and writing the verified bytes into its model.
  double receive = 0, install = 0;
  double old_calibrate = 0, kv_diff = 0;  // --compare-kv
  int delta_pushes = 0, pushes = 0;       // of this version, to the workers (deltas column)
  int parts = 1;                          // upload parts (streams)
  double publish() const { return calibrate + quantize + serialize + upload + sync; }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void print_row(const std::string& label, const Row& r, int workers) {
  const double share = r.publish() / (r.rollout + r.step + r.publish());
  const double copy = workers > 0 ? r.mb / r.sync : 0.0;
  std::printf(
      "%-8s %8.1f %8.3f %8.3f %8.4f %8.4f %8.3f %8.1f %8.3f %8.3f %8.3f %9.1f %8.1f %8.3f %6.1f%% "
      "%9.3f %8.4f %3d/%d %8.3f %8.3f %8.3f\n",
      label.c_str(), r.mb, r.rollout, r.step, r.calibrate, r.quantize, r.serialize, r.mb / r.upload,
      r.upload_cpu, r.sync, r.sync_cpu, copy, workers * copy, r.publish(), 100.0 * share,
      r.old_calibrate, r.kv_diff, r.delta_pushes, r.pushes, r.receive, r.install, r.export_cpu);
}

// Largest |a - b| / b over the layers of both K and V scales.
double max_relative_difference(const model::KvScales& a, const model::KvScales& b) {
  double worst = 0;
  for (size_t i = 0; i < a.k.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a.k[i]) - b.k[i]) / b.k[i]);
    worst = std::max(worst, std::abs(static_cast<double>(a.v[i]) - b.v[i]) / b.v[i]);
  }
  return worst;
}

// --ab: the current push path (`current`) or the previous one, on the service and every worker.
// `upload` is what the next uploads use.
void set_push_path(bool current, const std::string& what, weight_sync::WeightSyncServiceImpl& sync,
                   const std::vector<std::unique_ptr<generation::GenerationWorker>>& workers,
                   weight_sync::UploadOptions* upload, bool* same_host_upload) {
  upload->zero_copy = current || (what != "all" && what != "upload-copy" && what != "publish");
  if (what == "same-host-upload") {
    sync.set_same_host(current);
    *same_host_upload = current;
    return;
  }
  if (what == "same-host" || what == "publish") {
    sync.set_same_host(current);  // "old": every version over TCP
    return;
  }
  if (what == "upload-copy") return;
  sync.set_cut_through(current);
  if (what == "cut-through") return;
  sync.set_zero_copy_send(current);
  sync.set_zero_copy_receive(current);
  if (what == "service") return;
  service::crc32c_use_hardware(current);
  sync.payload_pool().set_max_spares(current ? 1 : 0);
  for (const auto& w : workers) w->subscriber().set_zero_copy_receive(current);
}

// The rollouts of one step: every sequence's prompt generated to o.response new tokens on the
// workers (sample i on worker i % workers) at version >= `version`; seconds until the last sample.
absl::StatusOr<double> generate_rollouts(
    const Options& o, const std::vector<train::Sequence>& batch, int64_t version,
    const std::vector<std::unique_ptr<generation::GenerationWorker>>& workers) {
  const auto start = Clock::now();
  std::vector<std::vector<generation::SampleSpec>> per_worker(workers.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    generation::SampleSpec s;
    s.sample_id = absl::StrCat(i);
    s.prompt.assign(batch[i].tokens.begin(), batch[i].tokens.begin() + o.prompt);
    s.params.temperature = 1.0f;
    s.params.max_new_tokens = o.response;
    s.params.seed = static_cast<uint64_t>(version * 1000 + static_cast<int64_t>(i));
    per_worker[i % workers.size()].push_back(std::move(s));
  }
  std::vector<std::pair<std::shared_ptr<generation::GenerationRequest>, size_t>> requests;
  for (size_t w = 0; w < workers.size(); ++w) {
    if (per_worker[w].empty()) continue;
    const size_t n = per_worker[w].size();
    absl::StatusOr<std::shared_ptr<generation::GenerationRequest>> r =
        workers[w]->scheduler().submit(std::move(per_worker[w]), version);
    if (!r.ok()) return r.status();
    requests.emplace_back(std::move(*r), n);
  }
  for (auto& [request, n] : requests) {
    size_t got = 0;
    while (got < n) {
      got += request->take(std::chrono::milliseconds(100)).size();
      if (!request->status().ok()) return request->status();
    }
  }
  return seconds_since(start);
}

int run(const Options& o) {
  service::set_log_level(service::LogLevel::kError);
  service::MetricsRegistry registry;
  std::unique_ptr<weight_sync::WeightSyncMetrics> metrics =
      weight_sync::WeightSyncMetrics::create(&registry).value();
  weight_sync::WeightSyncOptions sync_options;
  sync_options.deltas = o.delta;  // full versions unless --delta
  if (o.same_host || o.same_host_upload) sync_options.same_host = weight_sync::SameHostMode::kAuto;
  weight_sync::WeightSyncServiceImpl sync(sync_options, metrics.get());
  absl::StatusOr<std::unique_ptr<service::GrpcServer>> server =
      service::GrpcServer::start({.address = "127.0.0.1:0"}, {&sync});
  if (!server.ok()) {
    std::fprintf(stderr, "weight sync server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  std::vector<std::unique_ptr<generation::GenerationWorker>> workers;
  for (int i = 0; i < (o.upload_only ? 0 : o.workers); ++i) {
    generation::GenerationWorkerConfig c;
    c.service = generation::default_generation_worker_options();
    c.service.listen_host = "127.0.0.1";
    c.service.grpc_port = 0;
    c.service.coordinator = address;  // no coordinator: registration retries in the background
    c.metrics_port = 0;
    c.weight_sync = address;
    c.worker_id = absl::StrCat("bench-gen-", i);
    absl::StatusOr<std::unique_ptr<generation::GenerationWorker>> w =
        generation::GenerationWorker::start(c);
    if (!w.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", i, w.status().ToString().c_str());
      return 1;
    }
    workers.push_back(std::move(*w));
  }

  train::InitRequest init;
  init.job_id = "bench";
  init.model_config_json = o.model;
  init.seed = 1;
  init.adamw.lr = 1e-5;
  absl::StatusOr<std::unique_ptr<train::Learner>> learner = train::Learner::create(init);
  if (!learner.ok()) {
    std::fprintf(stderr, "%s\n", learner.status().ToString().c_str());
    return 1;
  }
  train::Learner& l = **learner;
  const int64_t vocab = l.policy().config().vocab_size;
  std::printf("model %s (%lld params), %d worker(s), batch %d x (%d + %d) tokens, FP8, %s%s\n",
              o.model.c_str(), static_cast<long long>(l.policy().num_params()),
              static_cast<int>(workers.size()), o.batch, o.prompt, o.response,
              o.delta ? "deltas on" : "full versions",
              o.upload_only ? ", upload only"
              : o.no_train  ? ", no training step"
                            : "");
  std::printf(
      "%-8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %9s %8s %8s %7s %9s %8s %s %8s %8s %8s\n",
      "version", "MB", "gen_s", "step_s", "calib_s", "quant_s", "serial_s", "up_MB/s", "up_cpu_s",
      "sync_s", "sync_cpu", "copy_MB/s", "all_MB/s", "publ_s", "share", "oldcal_s", "kv_diff",
      "deltas", "recv_s", "inst_s", "exp_cpu");
  // One channel for every upload, as the trainer's publisher caches its channel per address.
  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  // --upload-parts: one channel per part, each with its own connection.
  std::vector<std::shared_ptr<grpc::ChannelInterface>> part_channels;
  for (int i = 0; i < *std::max_element(o.upload_parts.begin(), o.upload_parts.end()); ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    part_channels.push_back(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  weight_sync::UploadOptions upload_options;   // --ab may switch its zero_copy
  bool same_host_upload = o.same_host_upload;  // --ab may switch it
  std::vector<Row> rows;
  std::vector<int> row_path;  // --ab: 0 old, 1 new, -1 first of a block
  for (int v = 1; v <= o.versions; ++v) {
    Row r;
    r.parts = o.upload_parts[static_cast<size_t>(v - 1) % o.upload_parts.size()];
    if (o.ab_block > 0) {
      const bool old_path = (v - 1) / o.ab_block % 2 == 0;
      set_push_path(!old_path, o.ab_what, sync, workers, &upload_options, &same_host_upload);
      // Versions 1-2 build the worker's two slots; the first of a block inherits buffers.
      row_path.push_back(v <= 2 || (v - 1) % o.ab_block == 0 ? -1 : old_path ? 0 : 1);
    }
    train::GrpoRequest step;
    step.batch = random_batch(o, vocab, static_cast<uint64_t>(v));
    step.loss.clip_eps = 0.2;
    if (o.generate && v > 1 && !workers.empty()) {
      // Rollouts with the version published after the previous step (the first step has none).
      absl::StatusOr<double> rollout = generate_rollouts(o, step.batch, v - 1, workers);
      if (!rollout.ok()) {
        std::fprintf(stderr, "rollouts: %s\n", rollout.status().ToString().c_str());
        return 1;
      }
      r.rollout = *rollout;
    }
    auto start = Clock::now();
    if (absl::StatusOr<train::GrpoResult> g =
            o.upload_only || o.no_train ? train::GrpoResult{} : l.grpo_update(step);
        !g.ok()) {
      std::fprintf(stderr, "grpo_update: %s\n", g.status().ToString().c_str());
      return 1;
    }
    r.step = seconds_since(start);
    model::KvScales old_scales;
    if (o.compare_kv && !o.upload_only) {
      // The pass export_for_generation used to run: the updated weights, the step's batch, the
      // scales in force (per-sequence records, as one forward per sequence gave).
      model::KvCalibrator calibrator(l.policy().config().num_hidden_layers);
      model::TokenBatch tokens;
      for (const train::Sequence& s : step.batch) tokens.push_back(s.tokens);
      start = Clock::now();
      if (!engine::cpu_logprobs(l.policy(), tokens, {.calibrator = &calibrator}).ok()) return 1;
      old_scales = calibrator.scales(train::kKvCalibrationPercentile, train::kKvCalibrationMargin);
      r.old_calibrate = seconds_since(start);
    }
    const double export_cpu0 = process_cpu_seconds();
    absl::StatusOr<train::Export> e = l.export_for_generation(Precision::kFP8, v, true);
    r.export_cpu = process_cpu_seconds() - export_cpu0;
    if (!e.ok()) {
      std::fprintf(stderr, "export: %s\n", e.status().ToString().c_str());
      return 1;
    }
    r.calibrate = e->calibrate_seconds;
    r.quantize = e->quantize_seconds;
    r.mb = static_cast<double>(e->weights.nbytes()) / 1e6;
    if (o.compare_kv && !o.upload_only)
      r.kv_diff = max_relative_difference(l.policy().kv_scales(), old_scales);
    start = Clock::now();
    if (!weight_sync::build_manifest(e->weights, v1::WEIGHT_FORMAT_FP8).ok()) return 1;
    r.serialize = seconds_since(start);
    // upload() builds the manifest again: the upload time below includes that CRC pass.
    // Pushes of this version are counted from before its upload (the push starts as it is stored).
    const double deltas0 = metrics->pushes->with({"delta"}).value();
    const double fulls0 = metrics->pushes->with({"full"}).value();
    start = Clock::now();
    const double cpu0 = process_cpu_seconds();
    absl::StatusOr<v1::UploadVersionResponse> up =
        r.parts == 1 && same_host_upload
            ? weight_sync::upload_same_host(channel, e->weights, v1::WEIGHT_FORMAT_FP8,
                                            sync.same_host_files().dir(), upload_options)
        : r.parts == 1
            ? weight_sync::upload(channel, e->weights, v1::WEIGHT_FORMAT_FP8, upload_options)
            : weight_sync::upload_parallel(part_channels, e->weights, v1::WEIGHT_FORMAT_FP8,
                                           static_cast<uint32_t>(r.parts), upload_options);
    if (!up.ok()) {
      std::fprintf(stderr, "upload: %s\n", up.status().ToString().c_str());
      return 1;
    }
    r.upload = seconds_since(start) - r.serialize;
    r.upload_cpu = process_cpu_seconds() - cpu0;
    l.set_published(v);
    std::vector<double> install0;
    for (auto& w : workers) {
      install0.push_back(w->metrics().weight_install_seconds->get().snapshot().sum);
    }
    start = Clock::now();
    const double sync_cpu0 = process_cpu_seconds();
    for (auto& w : workers) {
      if (!w->subscriber().wait_for_version(v, std::chrono::minutes(10))) {
        std::fprintf(stderr, "%s did not receive version %d\n", w->name().c_str(), v);
        return 1;
      }
    }
    r.sync = seconds_since(start);
    r.sync_cpu = process_cpu_seconds() - sync_cpu0;
    for (size_t i = 0; i < workers.size(); ++i) {
      r.receive = std::max(r.receive, workers[i]->subscriber().stats().last_receive_seconds);
      r.install =
          std::max(r.install, workers[i]->metrics().weight_install_seconds->get().snapshot().sum -
                                  install0[i]);
    }
    // The service counts a push after its last chunk went out, before the worker installs it.
    r.delta_pushes = static_cast<int>(metrics->pushes->with({"delta"}).value() - deltas0);
    r.pushes = r.delta_pushes + static_cast<int>(metrics->pushes->with({"full"}).value() - fulls0);
    std::string label = o.ab_block == 0
                            ? absl::StrCat(v)
                            : absl::StrCat(v, (v - 1) / o.ab_block % 2 == 0 ? " old" : " new");
    if (o.upload_parts.size() > 1) absl::StrAppend(&label, " p", r.parts);
    print_row(label, r, static_cast<int>(workers.size()));
    rows.push_back(r);
  }
  if (o.ab_block > 0) {
    for (int path : {0, 1}) {
      std::vector<Row> picked;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (row_path[i] == path) picked.push_back(rows[i]);
      }
      if (picked.empty()) continue;
      auto med = [&](double Row::*field) {
        std::vector<double> v;
        for (const Row& r : picked) v.push_back(r.*field);
        return median(v);
      };
      Row m;
      m.mb = rows.back().mb;
      for (double Row::*f : {&Row::rollout, &Row::step, &Row::calibrate, &Row::quantize,
                             &Row::serialize, &Row::upload, &Row::upload_cpu, &Row::sync,
                             &Row::sync_cpu, &Row::receive, &Row::install, &Row::export_cpu}) {
        m.*f = med(f);
      }
      print_row(path == 0 ? "med old" : "med new", m, static_cast<int>(workers.size()));
    }
  }
  if (o.upload_parts.size() > 1) {
    // Per part count, over the versions after 1-2 (they build the workers' two slots).
    std::vector<int> counts = o.upload_parts;
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    for (int parts : counts) {
      std::vector<const Row*> picked;
      for (size_t i = 2; i < rows.size(); ++i) {
        if (rows[i].parts == parts) picked.push_back(&rows[i]);
      }
      if (picked.empty()) continue;
      Row m;
      m.mb = rows.back().mb;
      for (double Row::*f : {&Row::rollout, &Row::step, &Row::calibrate, &Row::quantize,
                             &Row::serialize, &Row::upload, &Row::upload_cpu, &Row::sync,
                             &Row::sync_cpu, &Row::receive, &Row::install, &Row::export_cpu}) {
        std::vector<double> v;
        for (const Row* r : picked) v.push_back(r->*f);
        m.*f = median(v);
      }
      print_row(absl::StrCat("med p", parts), m, static_cast<int>(workers.size()));
    }
  }
  // Median over the versions after the first (the first pays for warm-up: allocation, channels).
  const size_t first = rows.size() > 1 ? 1 : 0;
  auto med = [&](double Row::*field) {
    std::vector<double> v;
    for (size_t i = first; i < rows.size(); ++i) v.push_back(rows[i].*field);
    return median(v);
  };
  Row m;
  m.mb = rows.back().mb;
  for (double Row::*f :
       {&Row::rollout, &Row::step, &Row::calibrate, &Row::quantize, &Row::serialize, &Row::upload,
        &Row::upload_cpu, &Row::sync, &Row::sync_cpu, &Row::old_calibrate, &Row::kv_diff,
        &Row::receive, &Row::install, &Row::export_cpu}) {
    m.*f = med(f);
  }
  print_row("median", m, static_cast<int>(workers.size()));
  for (auto& w : workers) w->shutdown(std::chrono::milliseconds(0));
  sync.begin_shutdown();
  (*server)->shutdown(std::chrono::milliseconds(0));
  return 0;
}

}  // namespace
}  // namespace fp8rl

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as versions finish, also when piped
  fp8rl::Options o;
  if (!fp8rl::parse(argc, argv, &o)) {
    fp8rl::usage();
    return 2;
  }
  return fp8rl::run(o);
}
