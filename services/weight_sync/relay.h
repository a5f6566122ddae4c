// A generation worker's relay for fan-out through workers (docs/design/weight-sync-fanout.md):
// the worker's WeightSubscriber hands it every version as it lands (VersionTap), and it serves
// those bytes to the workers behind it through the same WeightSyncService Subscribe/Ack API that
// weight sync serves, with cut-through (each chunk goes on as soon as it is in); full versions
// only (relay_options()). Uploads to it are refused. The worker registers service() on its gRPC
// server and advertises that address as SubscriberOptions::relay_address.
#pragma once

#include <memory>
#include <span>

#include "common/service/metrics.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/weight_sync_metrics.h"
#include "services/weight_sync/weight_sync_service.h"

namespace fp8rl::weight_sync {

// The options a relay runs with: keeps 1 version, pushes full versions only (no whole-version
// wait per hop for a delta), takes no uploads, sends directly to the successors weight sync
// places behind it.
WeightSyncOptions relay_options();

class WeightRelay final : public VersionTap {
 public:
  // `options.accept_uploads` and `options.fanout` are forced to false and direct. The relay's
  // metrics are registered as fp8rl_worker_relay_* in `registry` (the worker's, which must outlive
  // the relay), or in a registry of its own when `registry` is nullptr.
  explicit WeightRelay(WeightSyncOptions options = relay_options(),
                       service::MetricsRegistry* registry = nullptr);
  ~WeightRelay() override;

  // The gRPC service successors subscribe to.
  WeightSyncServiceImpl& service() { return *service_; }
  // Ends the successors' streams (call before the gRPC server's shutdown). Idempotent.
  void begin_shutdown() { service_->begin_shutdown(); }

  // VersionTap (the subscriber's thread): a version the relay cannot take (not newer than the one
  // it holds, too large) is logged and skipped, never an error for the worker.
  void begin(const v1::VersionManifest& manifest) override;
  void bytes(uint64_t offset, std::span<const char> data) override;
  void end(bool complete) override;

 private:
  // Used only without a registry from the caller.
  service::MetricsRegistry own_registry_;
  std::unique_ptr<WeightSyncMetrics> metrics_;
  std::unique_ptr<WeightSyncServiceImpl> service_;
  // The version being passed on (subscriber thread only; nullptr: none, or skipped).
  std::unique_ptr<WeightSyncServiceImpl::LocalUpload> upload_;
};

}  // namespace fp8rl::weight_sync
