// fp8rl-bench-weight-sync-fanout: time from "publish version v" to "all N workers hold v" for
// --fanout direct vs chain (docs/design/weight-sync-fanout.md), N = 1, 2, 4, 8, interleaved in one
// run so both see the same load; and the CPU-seconds per GB per hop of the upload and of one relay
// hop. Everything runs in one process on loopback: a WeightSyncServiceImpl on a gRPC server, and
// per worker a WeightSubscriber receiving in place into two alternating buffers plus a
// WeightRelay on its own gRPC server. A worker's install here only records the version (the real
// install is fp8rl-bench-weight-install's figure), so the times are the data plane alone.
// Usage: fp8rl-bench-weight-sync-fanout [--mib 64] [--versions 4] [--workers 1,2,4,8]
//        [--modes direct,chain] [--chunk-kib 4096] [--link-mbps 0]
// --link-mbps R emulates one host per process: every chunk weight sync or a relay sends waits its
// turn on a link of R MB/s shared by that process's streams (send_pacer.h), so direct's weight
// sync carries N copies through one link and a chain's relays one each. The upload (trainer ->
// weight sync) is not paced.
#include <grpc/grpc.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "common/service/metrics.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/fanout.h"
#include "services/weight_sync/relay.h"
#include "services/weight_sync/weight_sync_metrics.h"
#include "services/weight_sync/weight_sync_service.h"

namespace fp8rl::weight_sync {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// A version of about `mib` MiB: FP8 linears of 4096 x 4096 codes with their 128x128 F32 scales,
// random non-zero codes (never NaN), different per version.
model::WeightSet make_version(int64_t version, int mib) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + version));
  std::uniform_int_distribution<int> mag(1, 0x7E), sign(0, 1);
  std::uniform_real_distribution<float> scale(1e-4f, 1e-2f);
  model::WeightSet set;
  set.version = version;
  set.config_json =
      R"({"model_type": "llama", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", )"
      R"("activation_scheme": "dynamic", "weight_block_size": [128, 128]}})";
  const int64_t n = 4096;  // each linear is [4096, 1024]: 4 MiB of codes
  const int layers = std::max(1, mib / 4);
  for (int l = 0; l < layers; ++l) {
    std::vector<uint8_t> codes(static_cast<size_t>(n * 1024));
    for (auto& b : codes) b = static_cast<uint8_t>(mag(rng) | (sign(rng) << 7));
    const std::string name = absl::StrCat("model.layers.", l, ".mlp.up_proj.weight");
    set.tensors.push_back({name, DType::kF8E4M3, {n, 1024}, std::move(codes)});
    std::vector<uint8_t> scales(32 * 8 * 4);
    for (size_t i = 0; i < scales.size(); i += 4) {
      const float s = scale(rng);
      std::memcpy(scales.data() + i, &s, 4);
    }
    set.tensors.push_back({name + "_scale_inv", DType::kF32, {32, 8}, std::move(scales)});
  }
  return set;
}

// One worker: subscriber (in place, two alternating buffers) and, when `relays`, a relay on its
// own server (direct mode runs without one, as workers do today).
class Worker {
 public:
  Worker(const std::string& id, const std::shared_ptr<grpc::Channel>& root, bool relays,
         double link_bytes_per_second)
      : relay_([&] {
          WeightSyncOptions o = relay_options();
          o.emulated_link_bytes_per_second = link_bytes_per_second;
          return o;
        }()) {
    server_ = service::GrpcServer::start(
                  {.address = "127.0.0.1:0", .max_message_bytes = service::kDataPathMessageBytes},
                  {&relay_.service()})
                  .value();
    SubscriberOptions options;
    options.worker_id = id;
    options.accept_delta = false;
    options.initial_backoff = 20ms;
    options.max_backoff = 200ms;
    if (relays) {
      options.relay_address = absl::StrCat("127.0.0.1:", server_->port());
      options.tap = &relay_;
    }
    InPlaceReceiver receiver;
    receiver.target = [this](const v1::VersionManifest& m) -> absl::StatusOr<std::span<char>> {
      std::string& b = buffers_[next_++ % 2];
      b.resize(m.total_bytes());
      return std::span<char>(b.data(), b.size());
    };
    receiver.install = [](const v1::VersionManifest&, std::span<const char>) {
      return absl::OkStatus();
    };
    subscriber_ = std::make_unique<WeightSubscriber>(root, options, std::move(receiver));
    if (!subscriber_->start().ok()) std::abort();
  }
  ~Worker() {
    relay_.begin_shutdown();
    server_->shutdown(0ms);
    subscriber_->stop();
  }
  WeightSubscriber& subscriber() { return *subscriber_; }

 private:
  WeightRelay relay_;
  std::unique_ptr<service::GrpcServer> server_;
  std::unique_ptr<WeightSubscriber> subscriber_;
  std::string buffers_[2];  // subscriber thread only
  int next_ = 0;            // subscriber thread only
};

struct Run {
  std::vector<double> all_hold_s;  // per timed version
  std::vector<double> cpu_s;       // process CPU per timed version
};

// One configuration: a fresh weight sync and `n` workers (joined in order), `versions` versions
// published; the first is not timed (it maps every buffer).
Run run_config(const std::string& mode, int n, const std::vector<model::WeightSet>& versions,
               uint64_t chunk_bytes, double link_bytes_per_second) {
  WeightSyncOptions options;
  options.deltas = false;
  options.chunk_bytes = chunk_bytes;
  options.poll_interval = 20ms;
  options.fanout = parse_fanout(mode).value();
  options.emulated_link_bytes_per_second = link_bytes_per_second;
  service::MetricsRegistry registry;
  std::unique_ptr<WeightSyncMetrics> metrics = WeightSyncMetrics::create(&registry).value();
  WeightSyncServiceImpl sync(options, metrics.get());
  std::unique_ptr<service::GrpcServer> server =
      service::GrpcServer::start(
          {.address = "127.0.0.1:0", .max_message_bytes = service::kDataPathMessageBytes}, {&sync})
          .value();
  grpc::ChannelArguments args;
  service::set_data_path_message_limits(&args);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", server->port()), grpc::InsecureChannelCredentials(), args);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < n; ++i) {
    workers.push_back(std::make_unique<Worker>(absl::StrCat("w", i), channel,
                                               options.fanout.relays(), link_bytes_per_second));
    // Wait until it is placed (chain order = start order) or, direct, subscribed.
    const auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      const bool placed = options.fanout.relays()
                              ? sync.relay_topology().order().size() == static_cast<size_t>(i + 1)
                              : sync.workers().subscribed_workers() == i + 1;
      if (placed) break;
      std::this_thread::sleep_for(5ms);
    }
  }
  std::this_thread::sleep_for(200ms);  // redirected streams settle on their upstream
  Run run;
  for (size_t v = 0; v < versions.size(); ++v) {
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    absl::StatusOr<v1::UploadVersionResponse> up =
        upload(channel, versions[v], v1::WEIGHT_FORMAT_FP8, {.chunk_bytes = chunk_bytes});
    if (!up.ok()) {
      std::fprintf(stderr, "upload failed: %s\n", std::string(up.status().message()).c_str());
      std::exit(1);
    }
    for (auto& w : workers) {
      if (!w->subscriber().wait_for_version(versions[v].version, 120s)) {
        std::fprintf(stderr, "%s n=%d: version %lld did not reach every worker\n", mode.c_str(), n,
                     static_cast<long long>(versions[v].version));
        std::exit(1);
      }
    }
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = process_cpu_seconds() - cpu0;
    if (v > 0) {
      run.all_hold_s.push_back(wall);
      run.cpu_s.push_back(cpu);
    }
  }
  workers.clear();
  sync.begin_shutdown();
  server->shutdown(0ms);
  return run;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty()      ? 0
         : x.size() % 2 ? x[x.size() / 2]
                        : 0.5 * (x[x.size() / 2 - 1] + x[x.size() / 2]);
}

int main_impl(int argc, char** argv) {
  int mib = 64, versions = 4, chunk_kib = 4096;
  double link_mbps = 0;  // MB/s of each emulated host's link (0: none)
  std::vector<int> counts = {1, 2, 4, 8};
  std::vector<std::string> modes = {"direct", "chain"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    auto bad = [&] {
      std::fprintf(stderr, "fp8rl-bench-weight-sync-fanout: bad value '%s' for %s\n", value.c_str(),
                   a.c_str());
      return 2;
    };
    if (a == "--mib") {
      if (!absl::SimpleAtoi(value, &mib) || mib < 4 || mib > 4096) return bad();
    } else if (a == "--versions") {
      if (!absl::SimpleAtoi(value, &versions) || versions < 2 || versions > 100) return bad();
    } else if (a == "--link-mbps") {
      if (!absl::SimpleAtod(value, &link_mbps) || !(link_mbps >= 0 && link_mbps <= 1e6)) {
        return bad();
      }
    } else if (a == "--chunk-kib") {
      if (!absl::SimpleAtoi(value, &chunk_kib) || chunk_kib < 64 || chunk_kib > 8191) return bad();
    } else if (a == "--workers") {
      counts.clear();
      const std::vector<std::string> parts = absl::StrSplit(value, ',');
      for (const std::string& p : parts) {
        int c = 0;
        if (!absl::SimpleAtoi(p, &c) || c < 0 || c > 64) return bad();
        counts.push_back(c);
      }
    } else if (a == "--modes") {
      modes.clear();
      const std::vector<std::string> parts = absl::StrSplit(value, ',');
      for (const std::string& p : parts) {
        if (!parse_fanout(p).ok()) return bad();
        modes.push_back(p);
      }
    } else {
      std::fprintf(stderr, "fp8rl-bench-weight-sync-fanout: unknown argument '%s'\n", a.c_str());
      return 2;
    }
    ++i;
  }
  grpc_init();
  service::set_log_level(service::LogLevel::kWarn);
  std::vector<model::WeightSet> sets;
  for (int v = 1; v <= versions; ++v) sets.push_back(make_version(v, mib));
  const double gb = 1e-9 * static_cast<double>(sets[0].nbytes());
  std::printf(
      "# version %.3f GB, %d versions per config (first untimed), chunk %d KiB, emulated link %s\n",
      gb, versions, chunk_kib,
      link_mbps > 0 ? absl::StrCat(link_mbps, " MB/s per sending process").c_str() : "none");

  // Upload alone (no worker): its CPU-seconds per GB.
  const Run upload_only = run_config("direct", 0, sets, uint64_t(chunk_kib) << 10, link_mbps * 1e6);
  const double upload_cpu_per_gb = median(upload_only.cpu_s) / gb;
  std::printf("upload only: all_hold_s %.3f  cpu_s %.3f  cpu_s_per_gb %.3f\n",
              median(upload_only.all_hold_s), median(upload_only.cpu_s), upload_cpu_per_gb);
  std::printf("%-8s %3s %10s %8s %14s %16s\n", "mode", "N", "all_hold_s", "cpu_s", "x_of_N=1",
              "hop_cpu_s_per_gb");
  std::map<std::string, double> first;
  for (int n : counts) {
    for (const std::string& mode : modes) {
      const Run r = run_config(mode, n, sets, uint64_t(chunk_kib) << 10, link_mbps * 1e6);
      const double wall = median(r.all_hold_s), cpu = median(r.cpu_s);
      if (!first.count(mode)) first[mode] = wall;
      // Everything beyond the upload, per worker and GB: one weight-sync -> worker copy (direct)
      // or one hop of the chain (receive, verify, relay copy, send on).
      const double hop = n > 0 ? (cpu - upload_cpu_per_gb * gb) / (n * gb) : 0;
      std::printf("%-8s %3d %10.3f %8.3f %14.2f %16.3f\n", mode.c_str(), n, wall, cpu,
                  wall / first[mode], hop);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace fp8rl::weight_sync

int main(int argc, char** argv) { return fp8rl::weight_sync::main_impl(argc, argv); }
