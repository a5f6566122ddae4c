// gRPC clients of the generation and trainer workers (see grpc_cluster.h).
#include "services/coordinator/grpc_cluster.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "common/service/log.h"
#include "common/service/security.h"
#include "fp8rl/v1/generation.grpc.pb.h"
#include "fp8rl/v1/trainer.grpc.pb.h"
#include "proto/algorithm_proto.h"
#include "proto/precision_proto.h"
#include "proto/step_metrics_proto.h"
#include "rl/sft_batch.h"
#include "rl/tasks.h"

namespace fp8rl::coordinator {
namespace {

constexpr char kLog[] = "cluster";

void set_deadline(grpc::ClientContext& context, std::chrono::milliseconds timeout) {
  context.set_deadline(std::chrono::system_clock::now() + timeout);
}

// KV-scale calibration before the first rollout: the prompts of the first RL step, each with its
// reference answer, stand in for the rollouts the first update will see. At most this many.
constexpr int64_t kMaxCalibrationSequences = 64;

// The sequences InitPolicy sends for the first publish's KV calibration (empty when the KV
// cache is not FP8 or the task or the prompt format cannot be built; the trainer then keeps its
// initial scales). Tokenized as the SFT warm start tokenizes (rl/sft_batch.h), in the job's
// prompt format.
std::vector<TrainSequence> calibration_sequences(const rl::JobConfig& config) {
  std::vector<TrainSequence> out;
  if (config.precision.kv_cache != Precision::kFP8) return out;
  absl::StatusOr<rl::Task> task = rl::make_task(config.task);
  if (!task.ok() || task->train().empty()) return out;
  absl::StatusOr<rl::PromptFormat> format = job_prompt_format(config);
  if (!format.ok()) return out;
  const int64_t n = std::min(config.algorithm.prompts_per_step, kMaxCalibrationSequences);
  for (int64_t i : rl::prompt_indices(static_cast<int64_t>(task->train().size()),
                                      config.algorithm.seed, /*step=*/1, n)) {
    const rl::Example& ex = task->train()[static_cast<size_t>(i)];
    absl::StatusOr<rl::TokenizedExample> tokenized = rl::tokenize_with_answer(ex, *format);
    if (!tokenized.ok()) return {};
    TrainSequence seq;
    seq.tokens = std::move(tokenized->tokens);
    seq.prompt_length = tokenized->prompt_length;
    out.push_back(std::move(seq));
  }
  return out;
}

// Mixture-of-experts step statistics as step values (docs/metrics.md "Mixture of experts"):
// routing disagreement, the load-balancing loss, and per sparse layer the tokens of the busiest
// expert over the mean (1 = perfectly balanced) and the share of experts that got no token.
void add_moe_stats(const v1::MoeStats& moe, TrainStepStats* stats) {
  const double tokens = static_cast<double>(moe.routed_tokens());
  stats->values["moe_routed_tokens"] = tokens;
  stats->values["moe_routing_disagreement"] =
      tokens > 0 ? static_cast<double>(moe.routing_differ_tokens()) / tokens : 0.0;
  stats->values["moe_routing_replay"] = moe.routing_replay() ? 1.0 : 0.0;
  stats->values["moe_aux_loss"] = moe.aux_loss();
  const int n_exp = moe.num_experts();
  if (n_exp <= 0) return;
  const int layers = moe.expert_tokens_size() / n_exp;
  double worst = 0;
  for (int l = 0; l < layers; ++l) {
    double sum = 0, max = 0;
    int idle = 0;
    for (int e = 0; e < n_exp; ++e) {
      const double v = static_cast<double>(moe.expert_tokens(l * n_exp + e));
      sum += v;
      max = std::max(max, v);
      idle += v == 0 ? 1 : 0;
    }
    const double ratio = sum > 0 ? max / (sum / n_exp) : 0.0;
    stats->values[absl::StrCat("moe_layer", l, "_load_max_over_mean")] = ratio;
    stats->values[absl::StrCat("moe_layer", l, "_idle_experts")] =
        static_cast<double>(idle) / n_exp;
    worst = std::max(worst, ratio);
  }
  stats->values["moe_load_max_over_mean"] = worst;
}

void fill_sequence(const TrainSequence& in, v1::TrainSequence* out) {
  out->mutable_tokens()->Add(in.tokens.begin(), in.tokens.end());
  out->set_prompt_length(static_cast<int32_t>(in.prompt_length));
  out->set_advantage(in.advantage);
  out->mutable_gen_logprobs()->Add(in.gen_logprobs.begin(), in.gen_logprobs.end());
  out->mutable_routed_experts()->Add(in.routing.begin(), in.routing.end());
}

class GrpcGenerationClient final : public GenerationClient {
 public:
  explicit GrpcGenerationClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::GenerationService::NewStub(channel)) {}

  absl::Status generate(const std::string& request_id, const std::vector<GenSample>& samples,
                        const GenParams& params, const std::function<void(GenResult)>& on_result,
                        std::chrono::milliseconds deadline) override {
    v1::GenerateRequest req;
    req.set_request_id(request_id);
    for (const GenSample& s : samples) {
      auto* out = req.add_samples();
      out->set_sample_id(s.sample_id);
      out->mutable_prompt_tokens()->Add(s.prompt_tokens.begin(), s.prompt_tokens.end());
      out->set_seed(s.seed);
    }
    auto* sp = req.mutable_sampling();
    sp->set_temperature(static_cast<float>(params.temperature));
    sp->set_top_p(static_cast<float>(params.top_p));
    sp->set_max_new_tokens(static_cast<int32_t>(params.max_new_tokens));
    sp->mutable_stop_token_ids()->Add(params.stop_token_ids.begin(), params.stop_token_ids.end());
    req.set_min_weight_version(params.min_weight_version);
    grpc::ClientContext context;
    set_deadline(context, deadline);
    auto reader = stub_->Generate(&context, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      for (const v1::SampleResult& r : resp.results()) {
        GenResult result;
        result.sample_id = r.sample_id();
        result.tokens.assign(r.tokens().begin(), r.tokens().end());
        result.logprobs.assign(r.logprobs().begin(), r.logprobs().end());
        result.routing.assign(r.routed_experts().begin(), r.routed_experts().end());
        result.weight_version = r.weight_version();
        on_result(std::move(result));
      }
    }
    return service::from_grpc_status(reader->Finish());
  }

  absl::StatusOr<int64_t> weight_version() override {
    grpc::ClientContext context;
    set_deadline(context, std::chrono::seconds(5));
    v1::GenerationStatus status;
    grpc::Status s = stub_->GetStatus(&context, v1::GetGenerationStatusRequest(), &status);
    if (!s.ok()) return service::from_grpc_status(s);
    return status.weight_version();
  }

 private:
  std::unique_ptr<v1::GenerationService::Stub> stub_;
};

// `alive` (optional) says whether the trainer still heartbeats
// (WorkerRegistry::is_same_process_live): a call in progress is abandoned once it says no, so a
// trainer that hangs with its socket open (SIGSTOP, a stuck driver) costs the job the registry's
// expiry time, not the call timeout. The same trainer process registered again after an expiry
// (a partition healed while no call was in flight) counts as alive: it still holds the job.
class GrpcTrainerClient final : public TrainerClient {
 public:
  GrpcTrainerClient(std::shared_ptr<grpc::Channel> channel, std::string weight_sync_address,
                    std::chrono::milliseconds timeout, std::string address = "",
                    std::function<bool()> alive = {})
      : stub_(v1::TrainerService::NewStub(channel)),
        weight_sync_address_(std::move(weight_sync_address)),
        timeout_(timeout),
        address_(std::move(address)),
        alive_(std::move(alive)) {}

  absl::StatusOr<int64_t> init_policy(const std::string& job_id,
                                      const rl::JobConfig& config) override {
    v1::InitPolicyRequest req;
    req.set_job_id(job_id);
    if (!config.model.checkpoint.empty()) {
      req.mutable_model()->set_checkpoint_dir(config.model.checkpoint);
    } else {
      auto* init = req.mutable_model()->mutable_init();
      // The trainer resolves a config path itself; an inline config travels as JSON text.
      init->set_model_config_json(config.model.init_config_inline.is_null()
                                      ? config.model.init_config_path
                                      : config.model.init_config_inline.dump());
      init->set_seed(config.model.init_seed);
    }
    *req.mutable_precision() = precision_to_proto(config.precision);
    *req.mutable_optimizer() = optimizer_to_proto(config.algorithm);
    req.set_keep_reference(config.algorithm.kl_beta > 0);
    for (const TrainSequence& s : calibration_sequences(config)) {
      fill_sequence(s, req.add_calibration_sequences());
    }
    v1::InitPolicyResponse resp;
    if (absl::Status s = call(&v1::TrainerService::Stub::InitPolicy, req, &resp); !s.ok()) return s;
    return resp.version();
  }

  absl::StatusOr<TrainStepStats> sft_step(const std::string& job_id,
                                          const std::vector<TrainSequence>& batch,
                                          double learning_rate) override {
    v1::SftStepRequest req;
    req.set_job_id(job_id);
    for (const TrainSequence& s : batch) fill_sequence(s, req.add_batch());
    req.set_learning_rate(learning_rate);
    req.set_minibatches(1);
    v1::SftStepResponse resp;
    if (absl::Status s = call(&v1::TrainerService::Stub::SftStep, req, &resp); !s.ok()) return s;
    TrainStepStats stats;
    stats.values = {{"loss", resp.loss()},
                    {"grad_norm", resp.grad_norm()},
                    {"tokens", static_cast<double>(resp.tokens())}};
    return stats;
  }

  absl::StatusOr<TrainStepStats> train_step(const std::string& job_id, int64_t step,
                                            const std::vector<TrainSequence>& batch,
                                            const rl::JobConfig& config) override {
    v1::TrainStepRequest req;
    req.set_job_id(job_id);
    req.set_step(step);
    for (const TrainSequence& s : batch) fill_sequence(s, req.add_batch());
    *req.mutable_algorithm() = algorithm_to_proto(config.algorithm, step);
    v1::TrainStepResponse resp;
    if (absl::Status s = call(&v1::TrainerService::Stub::TrainStep, req, &resp); !s.ok()) return s;
    TrainStepStats stats;
    stats.values = step_metrics_from_proto(resp);
    for (const auto& [phase, seconds] : resp.phase_seconds()) {
      stats.values[absl::StrCat("trainer_", phase, "_seconds")] = seconds;
    }
    if (resp.has_moe()) add_moe_stats(resp.moe(), &stats);
    return stats;
  }

  absl::StatusOr<int64_t> publish(bool calibrate_kv_scales, int64_t above_version) override {
    if (weight_sync_address_.empty()) {
      return absl::UnavailableError("no weight-sync service registered");
    }
    v1::PublishRequest req;
    req.set_weight_sync_address(weight_sync_address_);
    req.set_calibrate_kv_scales(calibrate_kv_scales);
    req.set_above_version(above_version);
    v1::PublishResponse resp;
    if (absl::Status s = call(&v1::TrainerService::Stub::Publish, req, &resp); !s.ok()) return s;
    return resp.version();
  }

  absl::Status save_checkpoint(const std::string& path) override {
    v1::SaveCheckpointRequest req;
    req.set_path(path);
    req.set_include_optimizer(true);
    v1::SaveCheckpointResponse resp;
    return call(&v1::TrainerService::Stub::SaveCheckpoint, req, &resp);
  }

  absl::StatusOr<int64_t> load_checkpoint(const std::string& path) override {
    v1::LoadCheckpointRequest req;
    req.set_path(path);
    v1::LoadCheckpointResponse resp;
    if (absl::Status s = call(&v1::TrainerService::Stub::LoadCheckpoint, req, &resp); !s.ok()) {
      return s;
    }
    return resp.version();
  }

  // Makes the trainer rank `rank` of a group of `size` (1: leave any group); the trainer meets
  // the others through the coordinator it registered with.
  absl::Status join_group(const std::string& group_id, int rank, int size,
                          std::chrono::milliseconds timeout, const std::string& shard = "") {
    v1::JoinGroupRequest req;
    req.set_group_id(group_id);
    req.set_rank(rank);
    req.set_size(size);
    req.set_timeout_ms(timeout.count());
    req.set_shard(shard);
    v1::JoinGroupResponse resp;
    grpc::ClientContext context;
    set_deadline(context, timeout + std::chrono::seconds(10));
    return service::from_grpc_status(stub_->JoinGroup(&context, req, &resp));
  }

 private:
  template <typename Req, typename Resp>
  absl::Status call(grpc::Status (v1::TrainerService::Stub::*method)(grpc::ClientContext*,
                                                                     const Req&, Resp*),
                    const Req& req, Resp* resp) {
    // A request the trainer would refuse for its size fails here, naming the size and the cure.
    if (const size_t bytes = req.ByteSizeLong();
        bytes > static_cast<size_t>(service::kDataPathMessageBytes)) {
      return absl::FailedPreconditionError(absl::StrCat(
          req.GetDescriptor()->name(), " is ", bytes, " bytes, over the ",
          service::kDataPathMessageBytes,
          "-byte message limit: fewer prompts_per_step x samples_per_prompt or a smaller "
          "max_new_tokens per step"));
    }
    grpc::ClientContext context;
    set_deadline(context, timeout_);
    if (!alive_) return service::from_grpc_status(((*stub_).*method)(&context, req, resp));
    // The watchdog cancels the call once the trainer stops heartbeating.
    std::mutex mu;
    std::condition_variable done_cv;  // signalled when the call returned
    bool done = false;                // guarded by mu
    bool expired = false;             // guarded by mu
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!done_cv.wait_for(lock, kLivenessPoll, [&] { return done; })) {
        lock.unlock();
        const bool alive = alive_();
        lock.lock();
        if (!alive && !done) {
          expired = true;
          context.TryCancel();
          return;
        }
      }
    });
    const grpc::Status status = ((*stub_).*method)(&context, req, resp);
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    done_cv.notify_all();
    watchdog.join();
    if (expired) {
      service::log_warn(kLog, "trainer stopped heartbeating; call abandoned",
                        {{"trainer", address_}, {"call", req.GetDescriptor()->name()}});
      return absl::UnavailableError(absl::StrCat(
          "trainer ", address_, " stopped heartbeating during ", req.GetDescriptor()->name(),
          " (expired from the worker registry); call abandoned"));
    }
    return service::from_grpc_status(status);
  }

  // How often a call in progress checks that the trainer still heartbeats.
  static constexpr std::chrono::milliseconds kLivenessPoll{250};

  std::unique_ptr<v1::TrainerService::Stub> stub_;
  std::string weight_sync_address_;
  std::chrono::milliseconds timeout_;
  std::string address_;
  std::function<bool()> alive_;
};

// A data-parallel trainer group behind one TrainerClient (docs/design/training.md "Trainer
// groups"): the same call goes to every rank at once (each computes its share, the ranks
// all-reduce), except SaveCheckpoint (rank 0 writes it; every rank under trainer.shard
// grads_optimizer, each writing its optimizer shard). Results are rank 0's (every rank computed
// the same update). A failure names every rank that failed, lost ranks first; its code is the
// failed call's, so the RL loop's trainer-loss handling re-forms the group and resumes from the
// last checkpoint.
class GroupTrainerClient final : public TrainerClient {
 public:
  struct Member {
    WorkerInfo worker;
    std::shared_ptr<GrpcTrainerClient> client;
  };
  GroupTrainerClient(std::vector<Member> members, std::string group_id, std::string shard)
      : members_(std::move(members)), group_id_(std::move(group_id)), shard_(std::move(shard)) {}

  // `on_failed` (optional) hears at once of a rank whose JoinGroup failed, so the other ranks'
  // wait for it can be ended (a rank that died is still listed until it expires).
  absl::Status join(std::chrono::milliseconds timeout,
                    const std::function<void(const std::string&, const std::string&)>& on_failed) {
    const int size = static_cast<int>(members_.size());
    return on_all<bool>("join trainer group",
                        [&](GrpcTrainerClient& c, int rank) {
                          absl::Status s = c.join_group(group_id_, rank, size, timeout, shard_);
                          if (s.ok()) return absl::StatusOr<bool>(true);
                          if (on_failed) {
                            const WorkerInfo& w = members_[static_cast<size_t>(rank)].worker;
                            on_failed(group_id_,
                                      absl::StrCat("rank ", rank, " (", w.name, " at ", w.address,
                                                   ") could not join: ", s.message()));
                          }
                          return absl::StatusOr<bool>(s);
                        })
        .status();
  }

  absl::StatusOr<int64_t> init_policy(const std::string& job_id,
                                      const rl::JobConfig& config) override {
    return on_all<int64_t>(
        "InitPolicy", [&](GrpcTrainerClient& c, int) { return c.init_policy(job_id, config); });
  }
  absl::StatusOr<TrainStepStats> sft_step(const std::string& job_id,
                                          const std::vector<TrainSequence>& batch,
                                          double learning_rate) override {
    return on_all<TrainStepStats>("SftStep", [&](GrpcTrainerClient& c, int) {
      return c.sft_step(job_id, batch, learning_rate);
    });
  }
  absl::StatusOr<TrainStepStats> train_step(const std::string& job_id, int64_t step,
                                            const std::vector<TrainSequence>& batch,
                                            const rl::JobConfig& config) override {
    absl::StatusOr<TrainStepStats> stats = on_all<TrainStepStats>(
        "TrainStep",
        [&](GrpcTrainerClient& c, int) { return c.train_step(job_id, step, batch, config); });
    if (stats.ok()) stats->values["trainer_group_size"] = static_cast<double>(members_.size());
    return stats;
  }
  // Every rank takes the new KV scales; rank 0 uploads (a sharded group: every rank its part).
  absl::StatusOr<int64_t> publish(bool calibrate_kv_scales, int64_t above_version) override {
    return on_all<int64_t>("Publish", [&](GrpcTrainerClient& c, int) {
      return c.publish(calibrate_kv_scales, above_version);
    });
  }
  absl::Status save_checkpoint(const std::string& path) override {
    if (shard_ == "none") return members_.front().client->save_checkpoint(path);
    // Sharded: every rank writes its optimizer shard, rank 0 the rest (train/checkpoint.h).
    return on_all<bool>("SaveCheckpoint",
                        [&](GrpcTrainerClient& c, int) {
                          absl::Status s = c.save_checkpoint(path);
                          if (!s.ok()) return absl::StatusOr<bool>(s);
                          return absl::StatusOr<bool>(true);
                        })
        .status();
  }
  absl::StatusOr<int64_t> load_checkpoint(const std::string& path) override {
    return on_all<int64_t>("LoadCheckpoint",
                           [&](GrpcTrainerClient& c, int) { return c.load_checkpoint(path); });
  }

 private:
  template <typename T>
  absl::StatusOr<T> on_all(std::string_view what,
                           const std::function<absl::StatusOr<T>(GrpcTrainerClient&, int)>& fn) {
    std::vector<absl::StatusOr<T>> results(members_.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t r = 0; r < members_.size(); ++r) {
      threads.emplace_back([&, r] { results[r] = fn(*members_[r].client, static_cast<int>(r)); });
    }
    for (std::thread& t : threads) t.join();
    // A rank whose error is not a collective's (it did not fail *because of* a peer) is the lost
    // one: it goes first and gives the code.
    std::vector<size_t> failed;
    for (size_t r = 0; r < results.size(); ++r) {
      if (!results[r].ok()) failed.push_back(r);
    }
    if (failed.empty()) return std::move(results.front());
    std::stable_sort(failed.begin(), failed.end(), [&](size_t a, size_t b) {
      auto secondary = [&](size_t r) {
        const absl::string_view m = results[r].status().message();
        return m.find("failed on rank") != absl::string_view::npos ||
               m.find("waited") != absl::string_view::npos;
      };
      return !secondary(a) && secondary(b);
    });
    std::string message = absl::StrCat(std::string(what), " in trainer group ", group_id_, " of ",
                                       members_.size(), ": ");
    for (size_t i = 0; i < failed.size(); ++i) {
      const size_t r = failed[i];
      absl::StrAppend(&message, i > 0 ? "; " : "", "rank ", r, " (", members_[r].worker.name,
                      " at ", members_[r].worker.address, "): ", results[r].status().message());
    }
    return absl::Status(results[failed.front()].status().code(), message);
  }

  std::vector<Member> members_;
  const std::string group_id_;
  const std::string shard_;  // the job's trainer.shard
};

}  // namespace

GrpcCluster::GrpcCluster(WorkerRegistry* registry, std::chrono::milliseconds rpc_timeout,
                         std::chrono::milliseconds group_timeout)
    : registry_(registry), rpc_timeout_(rpc_timeout), group_timeout_(group_timeout) {}

std::shared_ptr<grpc::Channel> GrpcCluster::channel(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ch = channels_[address];
  if (ch == nullptr) {
    grpc::ChannelArguments args;
    service::set_data_path_message_limits(&args);
    service::set_reconnect_backoff(&args);  // a restarted trainer/worker is reached again soon
    ch = service::make_channel(address, args, security_);
  }
  return ch;
}

std::vector<WorkerRef> GrpcCluster::live_generation_workers() {
  std::vector<WorkerRef> out;
  for (const WorkerInfo& w : registry_->live(WorkerKind::kGeneration)) {
    out.push_back({w.id, w.address});
  }
  return out;
}

bool GrpcCluster::is_live(const std::string& worker_id) { return registry_->is_live(worker_id); }

std::shared_ptr<GenerationClient> GrpcCluster::generation_client(const WorkerRef& worker) {
  return std::make_shared<GrpcGenerationClient>(channel(worker.address));
}

absl::StatusOr<std::shared_ptr<TrainerClient>> GrpcCluster::trainer() {
  const std::vector<WorkerInfo> trainers = registry_->live(WorkerKind::kTrainer);
  if (trainers.empty()) return absl::UnavailableError("no live trainer worker");
  const std::vector<WorkerInfo> syncs = registry_->live(WorkerKind::kWeightSync);
  if (syncs.empty()) return absl::UnavailableError("no live weight-sync service");
  const WorkerInfo& t = trainers.front();
  return std::shared_ptr<TrainerClient>(std::make_shared<GrpcTrainerClient>(
      channel(t.address), syncs.front().address, rpc_timeout_, t.address,
      [registry = registry_, t] { return registry->is_same_process_live(t); }));
}

absl::StatusOr<std::shared_ptr<TrainerClient>> GrpcCluster::trainer_group(
    int size, const std::string& shard) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer.data_parallel: must be >= 1, got ", size));
  }
  const std::vector<WorkerInfo> members = registry_->trainer_group(size);
  if (members.empty()) {
    return absl::UnavailableError(
        absl::StrCat(registry_->live(WorkerKind::kTrainer).size(), " of ", size, " trainers live"));
  }
  const std::vector<WorkerInfo> syncs = registry_->live(WorkerKind::kWeightSync);
  if (syncs.empty()) return absl::UnavailableError("no live weight-sync service");
  std::vector<GroupTrainerClient::Member> clients;
  for (const WorkerInfo& w : members) {
    clients.push_back(
        {w, std::make_shared<GrpcTrainerClient>(
                channel(w.address), syncs.front().address, rpc_timeout_, w.address,
                [registry = registry_, w] { return registry->is_same_process_live(w); })});
  }
  if (size == 1) {
    // A trainer that was in a group leaves it (an older trainer without JoinGroup has none).
    absl::Status left = clients.front().client->join_group("", 0, 1, group_timeout_);
    if (!left.ok() && left.code() != absl::StatusCode::kUnimplemented) return left;
    return std::shared_ptr<TrainerClient>(clients.front().client);
  }
  static std::atomic<int64_t> next_group{0};
  const std::string group_id = absl::StrCat("g",
                                            std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count(),
                                            "-", next_group.fetch_add(1));
  auto group = std::make_shared<GroupTrainerClient>(std::move(clients), group_id, shard);
  if (absl::Status s = group->join(group_timeout_, on_join_failed_); !s.ok()) {
    return absl::UnavailableError(s.message());
  }
  return std::shared_ptr<TrainerClient>(group);
}

}  // namespace fp8rl::coordinator
