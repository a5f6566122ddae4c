// fp8rl-generation-worker: parses flags, starts a GenerationWorker (scheduler, gRPC service,
// /metrics, weight-sync subscriber, coordinator registration) and drains it on SIGTERM.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/service/auth.h"
#include "common/service/log.h"
#include "common/service/shutdown.h"
#include "model/device.h"
#include "services/generation_worker/generation_worker.h"
#include "services/generation_worker/worker_config.h"

namespace {

using namespace fp8rl;  // NOLINT: main() only

int fail(const absl::Status& status, int code = 1) {
  std::fprintf(stderr, "fp8rl-generation-worker: %s\n", std::string(status.message()).c_str());
  return code;
}

int run(const std::vector<std::string>& args) {
  if (flags::wants_help(args)) {
    std::cout << generation::generation_worker_usage();
    return 0;
  }
  absl::StatusOr<generation::GenerationWorkerConfig> config =
      generation::parse_generation_worker_config(args);
  if (!config.ok()) return fail(config.status(), 2);
  for (const std::string& w : config->warnings) {
    std::fprintf(stderr, "fp8rl-generation-worker: %s\n", w.c_str());
  }
  absl::StatusOr<service::LogLevel> level = service::parse_log_level(config->service.log_level);
  if (!level.ok()) return fail(level.status(), 2);
  service::set_log_level(*level);
  // --device: cuda when an sm_90 device is visible (auto), else cpu; `cuda` without one is an
  // error before anything starts.
  absl::StatusOr<model::DeviceSelection> device =
      model::select_device(config->device, generation::worker_device_probe);
  if (!device.ok()) return fail(device.status(), 2);
  service::log_info("generation-worker", device->description);
  if (absl::Status s = generation::apply_device(*device, &*config); !s.ok()) return fail(s, 2);
  if (absl::Status s = service::install_shutdown_handlers(); !s.ok()) return fail(s);
  // SIGHUP re-reads --cluster-token-file (the worker's TokenReloader does the reading).
  if (absl::Status s = service::install_reload_handler(); !s.ok()) return fail(s);

  absl::StatusOr<std::unique_ptr<generation::GenerationWorker>> worker =
      generation::GenerationWorker::start(*config);
  if (!worker.ok()) return fail(worker.status());

  service::wait_for_shutdown();
  service::log_info("generation-worker", "shutting down");
  (*worker)->shutdown(std::chrono::milliseconds(
      static_cast<int64_t>(config->service.shutdown_grace_seconds * 1000.0)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(std::vector<std::string>(argv + 1, argv + argc)); }
