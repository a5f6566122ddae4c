// A worker's relay: versions fed by its subscriber, served to its successors (see relay.h).
#include "services/weight_sync/relay.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/service/log.h"

namespace fp8rl::weight_sync {
namespace {

constexpr std::string_view kComponent = "weight-relay";

void log_skipped(int64_t version, const absl::Status& status) {
  service::log_warn(kComponent, "version not relayed",
                    {{"version", absl::StrCat(version)}, {"error", std::string(status.message())}});
}

}  // namespace

WeightSyncOptions relay_options() {
  WeightSyncOptions o;
  // One version: successors take full versions, each chunk as it lands. A delta needs the whole
  // version before it can be encoded, which would add a whole-version wait at every hop.
  o.keep_versions = 1;
  o.deltas = false;
  o.accept_uploads = false;
  return o;
}

WeightRelay::WeightRelay(WeightSyncOptions options, service::MetricsRegistry* registry) {
  options.accept_uploads = false;
  options.fanout = Fanout{};
  absl::StatusOr<std::unique_ptr<WeightSyncMetrics>> metrics = WeightSyncMetrics::create(
      registry != nullptr ? registry : &own_registry_, "fp8rl_worker_relay",
      /*process_metrics=*/false);
  // The fixed names are taken once per registry (one relay per worker): failure is a bug in this
  // binary, not input.
  if (!metrics.ok()) std::abort();
  metrics_ = std::move(*metrics);
  service_ = std::make_unique<WeightSyncServiceImpl>(std::move(options), metrics_.get());
}

WeightRelay::~WeightRelay() {
  upload_.reset();
  service_->begin_shutdown();
}

void WeightRelay::begin(const v1::VersionManifest& manifest) {
  upload_.reset();
  absl::StatusOr<std::unique_ptr<WeightSyncServiceImpl::LocalUpload>> upload =
      service_->begin_local_upload(manifest);
  if (!upload.ok()) {
    log_skipped(manifest.version(), upload.status());
    return;
  }
  upload_ = std::move(*upload);
}

void WeightRelay::bytes(uint64_t offset, std::span<const char> data) {
  if (upload_ == nullptr) return;
  if (absl::Status s = upload_->add(offset, data); !s.ok()) {
    log_skipped(upload_->version(), s);
    upload_.reset();
  }
}

void WeightRelay::end(bool complete) {
  if (upload_ == nullptr) return;
  if (complete) {
    if (absl::Status s = upload_->finish(); !s.ok()) log_skipped(upload_->version(), s);
  }
  upload_.reset();
}

}  // namespace fp8rl::weight_sync
