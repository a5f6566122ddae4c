// The gRPC WeightPublisher: GetStatus for the latest version, weight_sync::upload for the data.
#include "services/trainer_worker/weight_publisher.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "common/service/security.h"
#include "fp8rl/v1/weight_sync.grpc.pb.h"
#include "services/weight_sync/client.h"

namespace fp8rl::trainer {
namespace {

// The offer recorded when weight sync could not be asked after a refusal: any answer later
// differs from it, so the file is tried again once weight sync answers.
constexpr char kUnknownOffer[] = "\x01unreachable";
// GetStatus right after a refusal: short, the upload waits on it.
constexpr std::chrono::seconds kRefusalProbeTimeout(2);

class GrpcWeightPublisher final : public WeightPublisher {
 public:
  GrpcWeightPublisher(std::chrono::milliseconds timeout, service::ClientSecurity security,
                      uint32_t upload_streams, weight_sync::SameHostMode same_host)
      : timeout_(timeout),
        security_(std::move(security)),
        upload_streams_(std::max<uint32_t>(upload_streams, 1)),
        host_id_(same_host == weight_sync::SameHostMode::kAuto ? weight_sync::local_host_id()
                                                               : "") {}

  absl::StatusOr<int64_t> latest_version(const std::string& address) override {
    std::unique_ptr<v1::WeightSyncService::Stub> stub =
        v1::WeightSyncService::NewStub(channel(address));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout_);
    v1::GetWeightSyncStatusRequest request;
    v1::WeightSyncStatus status;
    absl::Status s = service::from_grpc_status(stub->GetStatus(&context, request, &status));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("weight sync at ", address, ": ", s.message()));
    }
    // Weight sync on this host that takes same-host uploads: the next upload goes by file.
    if (!host_id_.empty()) note_offer(address, offer_of(status));
    return status.latest_version();
  }

  absl::StatusOr<uint64_t> upload(const std::string& address, const model::WeightSet& set,
                                  v1::WeightFormat format) override {
    weight_sync::UploadOptions options;
    options.timeout = timeout_;
    if (upload_streams_ == 1) {
      if (const std::string dir = same_host_dir(address); !dir.empty()) {
        absl::StatusOr<v1::UploadVersionResponse> response =
            weight_sync::upload_same_host(channel(address), set, format, dir, options);
        if (response.ok()) return response->bytes_received();
        // Not taken (weight sync turned it off, another host after all, a file it cannot read,
        // weight sync unreachable) or not written here: this version and the next ones go over
        // the stream until weight sync's GetStatus offers something else (note_offer).
        if (response.status().code() != absl::StatusCode::kFailedPrecondition &&
            response.status().code() != absl::StatusCode::kUnavailable) {
          return absl::Status(response.status().code(),
                              absl::StrCat("same-host upload to weight sync at ", address, ": ",
                                           response.status().message()));
        }
        refused(address, dir, response.status());
      }
    }
    absl::StatusOr<v1::UploadVersionResponse> response =
        upload_streams_ == 1 ? weight_sync::upload(channel(address), set, format, options)
                             : weight_sync::upload_parallel(part_channels(address, upload_streams_),
                                                            set, format, upload_streams_, options);
    if (!response.ok()) {
      return absl::Status(
          response.status().code(),
          absl::StrCat("upload to weight sync at ", address, ": ", response.status().message()));
    }
    return response->bytes_received();
  }

  absl::StatusOr<uint64_t> upload_part(const std::string& address,
                                       const v1::VersionManifest& manifest,
                                       std::span<const model::NamedTensor> tensors) override {
    weight_sync::UploadOptions options;
    options.timeout = timeout_;
    // On a connection of its own (a local subchannel pool), as every part stream.
    absl::StatusOr<v1::UploadVersionResponse> response =
        weight_sync::upload_part(part_channels(address, 1).front(), manifest, tensors, options);
    if (!response.ok()) {
      return absl::Status(
          response.status().code(),
          absl::StrCat("upload of part ", manifest.part_index(), " to weight sync at ", address,
                       ": ", response.status().message()));
    }
    return response->bytes_received();
  }

 private:
  // What weight sync's GetStatus offers this trainer: its same-host directory when it runs on this
  // host and takes same-host uploads, else empty (the stream).
  std::string offer_of(const v1::WeightSyncStatus& status) const {
    return status.same_host_id() == host_id_ ? status.same_host_dir() : "";
  }

  // Weight sync's same-host directory when the last GetStatus offered it and no refusal since
  // (empty: upload over the stream).
  std::string same_host_dir(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = same_host_.find(address);
    return it == same_host_.end() || it->second.refused ? "" : it->second.offer;
  }

  // A GetStatus of weight sync at `address` offered `offer` (empty: none). After a refusal the
  // stream is kept while weight sync offers what it offered when it refused; once the offer
  // changes (weight sync restarted with --same-host auto after off, another directory, back after
  // being unreachable) the file is tried again. Logged once per change.
  void note_offer(const std::string& address, const std::string& offer) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = same_host_.try_emplace(address);
    SameHostState& state = it->second;
    if (!fresh && state.offer == offer) return;
    state.offer = offer;
    state.refused = false;
    if (!offer.empty()) {
      service::log_info("trainer", "weight sync takes same-host uploads; uploading by file",
                        {{"weight_sync", address}, {"dir", offer}});
    } else if (!fresh) {
      service::log_info("trainer",
                        "weight sync takes no same-host uploads; uploading over the stream",
                        {{"weight_sync", address}});
    }
  }

  // Weight sync at `address` did not take a same-host upload into `dir`: the stream from now on,
  // until a GetStatus offers something else than it offers now (asked at once, so a weight sync
  // that refused because it restarted with --same-host off, or that was unreachable, is told
  // from one that keeps offering the same directory and refusing it).
  void refused(const std::string& address, const std::string& dir, const absl::Status& why) {
    std::string offer = kUnknownOffer;
    {
      std::unique_ptr<v1::WeightSyncService::Stub> stub =
          v1::WeightSyncService::NewStub(channel(address));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + kRefusalProbeTimeout);
      v1::GetWeightSyncStatusRequest request;
      v1::WeightSyncStatus status;
      if (stub->GetStatus(&context, request, &status).ok()) offer = offer_of(status);
    }
    service::log_warn("trainer", "same-host upload not taken; uploading over the stream",
                      {{"weight_sync", address},
                       {"dir", dir},
                       {"error", std::string(why.message())},
                       {"offer_now", offer == kUnknownOffer ? "(unreachable)"
                                     : offer.empty()        ? "(none)"
                                                            : offer}});
    std::lock_guard<std::mutex> lock(mu_);
    SameHostState& state = same_host_[address];
    state.offer = std::move(offer);
    state.refused = true;
  }

  std::shared_ptr<grpc::Channel> channel(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(address);
    if (it != channels_.end()) return it->second;
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    service::set_reconnect_backoff(&args);  // a restarted weight sync is reached again soon
    auto channel = service::make_channel(address, args, security_);
    channels_.emplace(address, channel);
    return channel;
  }

  // At least `count` channels for upload streams, each with its own connection (a local
  // subchannel pool), so the parts do not share one TCP connection.
  std::vector<std::shared_ptr<grpc::ChannelInterface>> part_channels(const std::string& address,
                                                                     uint32_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<grpc::ChannelInterface>>& out = part_channels_[address];
    while (out.size() < count) {
      grpc::ChannelArguments args;
      args.SetMaxSendMessageSize(64 << 20);
      args.SetMaxReceiveMessageSize(64 << 20);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      service::set_reconnect_backoff(&args);
      out.push_back(service::make_channel(address, args, security_));
    }
    return out;
  }

  const std::chrono::milliseconds timeout_;
  const service::ClientSecurity security_;
  const uint32_t upload_streams_;
  const std::string host_id_;  // local_host_id() with --weight-same-host auto, else empty
  std::mutex mu_;
  // Per weight-sync address: the same-host directory its last GetStatus offered (empty: none;
  // kUnknownOffer: unreachable when asked after a refusal) and whether an upload by file to it
  // was refused since that offer was first seen (then the stream is used).
  struct SameHostState {
    std::string offer;
    bool refused = false;
  };
  std::map<std::string, SameHostState> same_host_;                  // guarded by mu_
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // guarded by mu_
  // Guarded by mu_: the channels of upload streams per address (upload_streams_ > 1, or parts).
  std::map<std::string, std::vector<std::shared_ptr<grpc::ChannelInterface>>> part_channels_;
};

}  // namespace

std::unique_ptr<WeightPublisher> make_grpc_weight_publisher(std::chrono::milliseconds timeout,
                                                            service::ClientSecurity security,
                                                            uint32_t upload_streams,
                                                            weight_sync::SameHostMode same_host) {
  return std::make_unique<GrpcWeightPublisher>(timeout, std::move(security), upload_streams,
                                               same_host);
}

}  // namespace fp8rl::trainer
