// Tests of the trainer worker's service side on loopback: the gRPC API end to end with an
// in-process weight-sync service (publish -> a subscriber receives the same tensors), status
// codes over the wire, health/status/metrics answering while an update is in flight, the metric
// names of docs/metrics.md, and flag parsing (registration: tests/unit/common/service).
#include "services/trainer_worker/trainer_service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <numeric>
#include <thread>

#include "common/service/grpc_server.h"
#include "common/service/metrics.h"
#include "fp8rl/v1/trainer.grpc.pb.h"
#include "model/rng.h"
#include "services/trainer_worker/trainer_config.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/weight_sync_metrics.h"
#include "services/weight_sync/weight_sync_service.h"
#include "tests/unit/common/temp_dir.h"
#include "tests/unit/trainer_worker/trainer_test_util.h"

namespace fp8rl::trainer {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<grpc::Channel> channel_to(int port) {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                             grpc::InsecureChannelCredentials());
}

// grpc.health.v1.Health/Check with an empty request (all services); true when SERVING.
bool health_serving(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status s =
      grpc::internal::BlockingUnaryCall(channel.get(), method, &context, request, &response);
  if (!s.ok()) return false;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& sl : slices)
    bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return bytes == std::string("\x08\x01", 2);  // status: SERVING
}

TEST(TrainerServiceTest, TrainAndPublishThroughWeightSync) {
  service::MetricsRegistry sync_registry;
  auto sync_metrics = weight_sync::WeightSyncMetrics::create(&sync_registry);
  ASSERT_TRUE(sync_metrics.ok());
  weight_sync::WeightSyncServiceImpl sync({}, sync_metrics->get());
  auto sync_server = service::GrpcServer::start({"127.0.0.1:0"}, {&sync});
  ASSERT_TRUE(sync_server.ok()) << sync_server.status();
  const std::string sync_address = "127.0.0.1:" + std::to_string((*sync_server)->port());

  service::MetricsRegistry registry;
  auto metrics = TrainerMetrics::create(&registry);
  ASSERT_TRUE(metrics.ok());
  auto publisher = make_grpc_weight_publisher(30s);
  TrainerOptions options;
  options.default_weight_sync_address = sync_address;
  Trainer trainer(options, publisher.get(), metrics->get());
  TrainerServiceImpl impl(&trainer);
  auto server = service::GrpcServer::start({"127.0.0.1:0"}, {&impl});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = channel_to((*server)->port());
  auto stub = v1::TrainerService::NewStub(channel);
  EXPECT_TRUE(health_serving(channel));

  {
    grpc::ClientContext ctx;
    v1::InitPolicyResponse resp;
    ASSERT_TRUE(stub->InitPolicy(&ctx, testing::init_request(), &resp).ok());
    EXPECT_GT(resp.num_parameters(), 0);
    EXPECT_NE(resp.model_config_json().find("\"hidden_size\""), std::string::npos);
  }
  v1::TrainStepRequest step = testing::random_step(31, 4);
  {
    grpc::ClientContext ctx;
    v1::ComputeLogprobsRequest req;
    *req.mutable_sequences() = step.batch();
    v1::ComputeLogprobsResponse resp;
    ASSERT_TRUE(stub->ComputeLogprobs(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.sequences_size(), 4);
    for (int i = 0; i < 4; ++i) {
      *step.mutable_batch(i)->mutable_gen_logprobs() = resp.sequences(i).logprobs();
    }
  }
  {
    grpc::ClientContext ctx;
    v1::TrainStepResponse resp;
    grpc::Status s = stub->TrainStep(&ctx, step, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.mismatch().token_mult_prob_error(), 1.0);
    EXPECT_EQ(resp.version(), 1);
  }
  {  // A bad request crosses the wire as INVALID_ARGUMENT naming the field.
    v1::TrainStepRequest bad = step;
    bad.mutable_batch(2)->set_prompt_length(0);
    grpc::ClientContext ctx;
    v1::TrainStepResponse resp;
    grpc::Status s = stub->TrainStep(&ctx, bad, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("batch[2].prompt_length"), std::string::npos);
  }

  // A generation-side subscriber receives exactly what was published.
  std::mutex mu;
  model::WeightSet received;
  weight_sync::SubscriberOptions sub_options;
  sub_options.worker_id = "gen-0";
  weight_sync::WeightSubscriber subscriber(channel_to((*sync_server)->port()), sub_options,
                                           [&](model::WeightSet set) {
                                             std::lock_guard<std::mutex> lock(mu);
                                             received = std::move(set);
                                             return absl::OkStatus();
                                           });
  ASSERT_TRUE(subscriber.start().ok());
  {
    grpc::ClientContext ctx;
    v1::PublishRequest req;  // no address: the trainer's default (the weight sync above)
    req.set_calibrate_kv_scales(true);
    v1::PublishResponse resp;
    grpc::Status s = stub->Publish(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.version(), 1);
    EXPECT_GT(resp.bytes(), 0u);
  }
  EXPECT_EQ(sync.store().latest_version(), 1);
  ASSERT_TRUE(subscriber.wait_for_version(1, 10s));
  subscriber.stop();
  {
    std::lock_guard<std::mutex> lock(mu);
    const model::WeightSet& sent = trainer.last_published();
    ASSERT_EQ(received.tensors.size(), sent.tensors.size());
    for (size_t i = 0; i < sent.tensors.size(); ++i) {
      const model::NamedTensor* t = received.find(sent.tensors[i].name);
      ASSERT_NE(t, nullptr) << sent.tensors[i].name;
      EXPECT_EQ(t->bytes, sent.tensors[i].bytes) << t->name;
      EXPECT_EQ(t->dtype, sent.tensors[i].dtype) << t->name;
    }
  }
  {
    grpc::ClientContext ctx;
    v1::TrainerStatus st;
    ASSERT_TRUE(stub->GetStatus(&ctx, v1::GetTrainerStatusRequest(), &st).ok());
    EXPECT_TRUE(st.ready());
    EXPECT_EQ(st.published_version(), 1);
    EXPECT_EQ(st.job_id(), "job-1");
  }

  // Every trainer metric of docs/metrics.md is exported and the text passes promtool.
  const std::string text = registry.render();
  for (const char* name :
       {"fp8rl_build_info", "fp8rl_process_start_time_seconds", "fp8rl_trainer_steps_total",
        "fp8rl_trainer_tokens_total", "fp8rl_trainer_loss", "fp8rl_trainer_grad_norm",
        "fp8rl_trainer_learning_rate", "fp8rl_trainer_policy_version",
        "fp8rl_trainer_phase_seconds", "fp8rl_trainer_is_weight",
        "fp8rl_trainer_token_mult_prob_error", "fp8rl_trainer_gen_kl_error",
        "fp8rl_trainer_sampling_importance_ratio", "fp8rl_trainer_is_oob_ratio",
        "fp8rl_trainer_probs_ratio_min", "fp8rl_trainer_probs_ratio_max",
        "fp8rl_trainer_recalibration_seconds", "fp8rl_trainer_weight_scale_inv",
        "fp8rl_trainer_kv_scale"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_NE(text.find("fp8rl_trainer_steps_total{kind=\"grpo\"} 1"), std::string::npos);
  EXPECT_NE(text.find("fp8rl_trainer_policy_version 1"), std::string::npos);
  EXPECT_NE(text.find("fp8rl_trainer_kv_scale{stat=\"max\",tensor=\"k\"}"), std::string::npos);
  if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
    testing_util::TempDir dir;
    std::ofstream(dir.file("metrics.txt")) << text;
    const std::string cmd = "promtool check metrics < " + dir.file("metrics.txt") + " >&2";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << text;
  }
  sync.begin_shutdown();
}

// A mixture-of-experts train batch whose routing record is over gRPC's 4 MB default (a long
// sample of a many-layer, many-expert model) crosses the wire with the data-path message limit
// and trains: the MoE statistics cover every recorded token.
TEST(TrainerServiceTest, RoutingRecordOverFourMegabytesTrains) {
  testing::RecordingPublisher publisher;
  Trainer trainer({}, &publisher, nullptr);
  TrainerServiceImpl impl(&trainer);
  service::GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.max_message_bytes = service::kDataPathMessageBytes;  // as services/trainer_worker/main.cc
  auto server = service::GrpcServer::start(options, {&impl});
  ASSERT_TRUE(server.ok()) << server.status();
  grpc::ChannelArguments args;
  service::set_data_path_message_limits(&args);
  auto stub = v1::TrainerService::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string((*server)->port()), grpc::InsecureChannelCredentials(), args));

  // 4 sparse layers x top-64 of 256 experts: 256 ids (about 400 encoded bytes) per token. The
  // experts are 1 wide so the step stays cheap; the record's size is what is under test.
  model::ModelConfig c = testing::tiny_config();
  c.model_type = "qwen3_moe";
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.num_hidden_layers = 4;
  c.max_position_embeddings = 1024;
  c.moe.num_experts = 256;
  c.moe.num_experts_per_tok = 64;
  c.moe.moe_intermediate_size = 1;
  c.moe.norm_topk_prob = true;
  v1::InitPolicyRequest init =
      testing::init_request(v1::WEIGHT_FORMAT_BF16, v1::WEIGHT_FORMAT_BF16);
  init.mutable_model()->mutable_init()->set_model_config_json(model::model_config_to_json(c));
  {
    grpc::ClientContext ctx;
    v1::InitPolicyResponse resp;
    grpc::Status s = stub->InitPolicy(&ctx, init, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  constexpr int kSequences = 26, kTokens = 512, kPrompt = 500, kWidth = 4 * 64;
  v1::TrainStepRequest step;
  step.set_job_id("job-1");
  step.set_step(1);
  step.mutable_algorithm()->set_clip_eps(0.2);
  step.mutable_algorithm()->set_is_rule(v1::IS_RULE_NONE);
  step.mutable_algorithm()->set_minibatches(1);
  step.mutable_algorithm()->set_routing_replay(true);
  model::Rng rng(41);
  std::vector<int32_t> experts(256);
  for (int i = 0; i < kSequences; ++i) {
    v1::TrainSequence* seq = step.add_batch();
    for (int t = 0; t < kTokens; ++t) {
      seq->add_tokens(static_cast<int32_t>(rng.next() % testing::kVocab));
    }
    seq->set_prompt_length(kPrompt);
    seq->set_advantage(i % 2 == 0 ? 1.0f : -1.0f);
    for (int t = kPrompt; t < kTokens; ++t) {
      seq->add_gen_logprobs(static_cast<float>(-0.5 - 3.5 * rng.uniform()));
    }
    // Every token generation fed (all but the last), each layer: 64 distinct random experts.
    for (int t = 0; t < kTokens - 1; ++t) {
      for (int layer = 0; layer < 4; ++layer) {
        std::iota(experts.begin(), experts.end(), 0);
        for (int j = 0; j < 64; ++j) {
          std::swap(experts[j], experts[j + rng.next() % (256 - j)]);
          seq->add_routed_experts(experts[j]);
        }
      }
    }
  }
  ASSERT_GT(step.ByteSizeLong(), size_t{4} << 20);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 300s);
  v1::TrainStepResponse resp;
  grpc::Status s = stub->TrainStep(&ctx, step, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(resp.has_moe());
  EXPECT_TRUE(resp.moe().routing_replay());
  EXPECT_EQ(resp.moe().routed_tokens(), kSequences * (kTokens - 1));
  // Random records against a real router: most tokens' router choice differs somewhere.
  EXPECT_GT(resp.moe().routing_differ_tokens(), resp.moe().routed_tokens() / 2);
  ASSERT_EQ(resp.moe().expert_tokens_size(), 4 * 256);
  int64_t slots = 0;
  for (int64_t n : resp.moe().expert_tokens()) slots += n;
  EXPECT_EQ(slots, int64_t{kSequences} * kTokens * kWidth);
  EXPECT_EQ(resp.version(), 1);
}

TEST(TrainerServiceTest, HealthStatusAndMetricsAnswerWhileACallRuns) {
  testing::RecordingPublisher publisher;
  service::MetricsRegistry registry;
  auto metrics = TrainerMetrics::create(&registry);
  ASSERT_TRUE(metrics.ok());
  Trainer trainer({}, &publisher, metrics->get());
  TrainerServiceImpl impl(&trainer);
  auto server = service::GrpcServer::start({"127.0.0.1:0"}, {&impl});
  ASSERT_TRUE(server.ok());
  auto channel = channel_to((*server)->port());
  auto stub = v1::TrainerService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::InitPolicyResponse resp;
    ASSERT_TRUE(stub->InitPolicy(&ctx, testing::init_request(), &resp).ok());
  }
  publisher.set_block(true);  // Publish will hold the trainer until released
  std::future<grpc::Status> publish = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    v1::PublishResponse resp;
    return stub->Publish(&ctx, v1::PublishRequest(), &resp);
  });
  publisher.wait_entered();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(health_serving(channel));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 2s);
    v1::TrainerStatus st;
    ASSERT_TRUE(stub->GetStatus(&ctx, v1::GetTrainerStatusRequest(), &st).ok());
    EXPECT_TRUE(st.ready());
    EXPECT_EQ(st.published_version(), 0);
  }
  EXPECT_NE(registry.render().find("fp8rl_trainer_loss"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(publish.wait_for(0s), std::future_status::timeout);  // still in flight
  publisher.set_block(false);
  EXPECT_TRUE(publish.get().ok());
  EXPECT_EQ(trainer.status().published_version(), 1);
}

// --device, --gpu-memory-fraction, --recompute, --max-step-tokens: the generation worker's
// defaults and one-line errors; cuda resolves through the trainer's probe, which offers a device
// only when this build can train on CUDA (no silent CPU fallback for an explicit cuda).
TEST(TrainerConfigTest, DeviceFlags) {
  absl::StatusOr<TrainerConfig> c = parse_trainer_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "auto");
  EXPECT_EQ(c->gpu_memory_fraction, 0.9);
  EXPECT_EQ(c->recompute, train::Recompute::kNone);
  EXPECT_EQ(c->max_step_tokens, 16384);
  EXPECT_EQ(c->shard, train::ShardMode::kNone);
  EXPECT_EQ(c->upload_streams, 1);
  c = parse_trainer_config({"--upload-streams", "4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->upload_streams, 4);
  c = parse_trainer_config({"--shard", "grads_optimizer"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard, train::ShardMode::kGradsOptimizer);
  c = parse_trainer_config({"--shard", "params"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard, train::ShardMode::kParams);
  c = parse_trainer_config({"--device", "cpu", "--gpu-memory-fraction", "0.5", "--recompute",
                            "layers", "--max-step-tokens", "4096"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "cpu");
  EXPECT_EQ(c->gpu_memory_fraction, 0.5);
  EXPECT_EQ(c->recompute, train::Recompute::kLayers);
  EXPECT_EQ(c->max_step_tokens, 4096);
  for (const auto& [flag, bad] :
       std::vector<std::pair<std::string, std::string>>{{"--device", "gpu"},
                                                        {"--gpu-memory-fraction", "0"},
                                                        {"--gpu-memory-fraction", "1.5"},
                                                        {"--recompute", "all"},
                                                        {"--shard", "zero2"},
                                                        {"--max-step-tokens", "0"},
                                                        {"--upload-streams", "0"},
                                                        {"--upload-streams", "257"}}) {
    c = parse_trainer_config({flag, bad});
    ASSERT_FALSE(c.ok()) << flag << " " << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(c.status().message().find(flag), std::string::npos) << c.status();
  }

  // A visible sm_90 device, as the probe would see it: with the CUDA training backend built,
  // auto and cuda choose it with the --gpu-memory-fraction budget; without it (a build without
  // CUDA), auto picks cpu with the reason and cuda fails naming it.
  auto probe = [] {
    model::DeviceProbeResult r;
    model::CudaDeviceInfo d;
    d.name = "NVIDIA H200";
    d.major = 9;
    d.total_bytes = int64_t{140} << 30;
    r.device = d;
    if (!train::cuda_train_backend_available()) {
      r.detail =
          absl::StrCat(d.name, " visible, but ", train::cuda_train_backend_unavailable_reason());
      r.device.reset();
    }
    return r;
  };
  absl::StatusOr<model::DeviceSelection> cuda = model::select_device("cuda", probe);
  absl::StatusOr<model::DeviceSelection> automatic = model::select_device("auto", probe);
  ASSERT_TRUE(automatic.ok());
  std::string device;
  int64_t budget = -1;
  apply_device(*automatic, *parse_trainer_config({"--gpu-memory-fraction", "0.5"}), &device,
               &budget);
  if (train::cuda_train_backend_available()) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ(device, "cuda");
    EXPECT_EQ(budget, int64_t{70} << 30);
  } else {
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("built without CUDA"), std::string::npos)
        << cuda.status();
    EXPECT_EQ(device, "cpu");
    EXPECT_EQ(budget, 0);
  }
  // This machine has no sm_90 device: the real probe picks cpu.
  absl::StatusOr<model::DeviceSelection> real = model::select_device("auto", trainer_device_probe);
  ASSERT_TRUE(real.ok());
  EXPECT_EQ(real->device, model::Device::kCpu);
}

// The cuda placement reaches the learner: InitPolicy with the trainer on cuda on a machine without
// an sm_90 device is the backend's FAILED_PRECONDITION, not a CPU policy.
TEST(TrainerConfigTest, CudaPlacementFailsInitPolicyClearly) {
  if (model::probe_cuda_device().device.has_value()) GTEST_SKIP() << "an sm_90 device is visible";
  testing::RecordingPublisher publisher;
  TrainerOptions options;
  options.device = "cuda";
  options.gpu_memory_budget_bytes = int64_t{1} << 30;
  Trainer trainer(options, &publisher);
  absl::StatusOr<v1::InitPolicyResponse> r = trainer.init_policy(testing::init_request());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(trainer.learner(), nullptr);
}

// --worker-id is the registered name (the generation worker's name for it); --name and
// --metrics-port, the trainer's old names, still work and each warns naming the new flag.
TEST(TrainerConfigTest, WorkerIdAndDeprecatedAliases) {
  absl::StatusOr<TrainerConfig> c = parse_trainer_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_id, "trainer");
  EXPECT_TRUE(c->warnings.empty());
  c = parse_trainer_config({"--worker-id", "trainer-3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_id, "trainer-3");
  EXPECT_TRUE(c->warnings.empty());
  c = parse_trainer_config({"--name=trainer-4", "--metrics-port", "9503"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_id, "trainer-4");
  EXPECT_EQ(c->metrics_port, 9503);
  EXPECT_EQ(c->warnings,
            (std::vector<std::string>{"--name is deprecated; use --worker-id",
                                      "--metrics-port is deprecated; use --http-port"}));
  c = parse_trainer_config({"--name", "a", "--worker-id", "b"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--name: a disagrees with --worker-id b"), std::string::npos)
      << c.status();
  c = parse_trainer_config({"--worker-id", ""});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--worker-id: must not be empty"), std::string::npos)
      << c.status();
  EXPECT_NE(trainer_usage().find("--name\n      deprecated: use --worker-id"), std::string::npos)
      << trainer_usage();
}

TEST(TrainerConfigTest, DefaultsFlagsAndErrors) {
  absl::StatusOr<TrainerConfig> c = parse_trainer_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.grpc_port, 50053);
  EXPECT_EQ(c->metrics_port, 9403);
  EXPECT_EQ(c->service.coordinator, "localhost:50051");
  EXPECT_EQ(c->weight_sync, "localhost:50052");
  EXPECT_EQ(c->service.advertise_host, "127.0.0.1");
  EXPECT_EQ(c->service.data_dir, "./fp8rl-data/checkpoints");

  c = parse_trainer_config({"--grpc-port", "6000", "--http-port=6001", "--weight-sync", "ws:1",
                            "--coordinator", "co:2", "--advertise-host", "trainer", "--data-dir",
                            "/tmp/x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.grpc_port, 6000);
  EXPECT_EQ(c->metrics_port, 6001);
  EXPECT_EQ(c->weight_sync, "ws:1");
  EXPECT_EQ(c->service.coordinator, "co:2");
  EXPECT_EQ(c->service.advertise_host, "trainer");
  EXPECT_EQ(c->service.data_dir, "/tmp/x");

  testing_util::TempDir dir;
  std::ofstream(dir.file("trainer.yaml")) << "http_port: 7001\nweight_sync: yaml:3\n";
  c = parse_trainer_config({"--config", dir.file("trainer.yaml"), "--weight-sync", "flag:4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_port, 7001);
  EXPECT_EQ(c->weight_sync, "flag:4");  // flags override the file

  c = parse_trainer_config({"--http-port", "abc"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--http-port"), std::string::npos) << c.status();
  c = parse_trainer_config({"--no-such-flag", "1"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no-such-flag"), std::string::npos) << c.status();

  // Trainer-group gradient buckets: MiB (fractions allowed), 4 by default, 0 = off, bounded.
  c = parse_trainer_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->allreduce_bucket_bytes, 4 << 20);
  c = parse_trainer_config({"--allreduce-bucket-mb", "0"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->allreduce_bucket_bytes, 0);
  c = parse_trainer_config({"--allreduce-bucket-mb", "0.5"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->allreduce_bucket_bytes, 512 * 1024);
  for (const char* bad : {"-1", "5000", "lots"}) {
    c = parse_trainer_config({"--allreduce-bucket-mb", bad});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(c.status().message().find("bucket"), std::string::npos) << c.status();
  }
}

}  // namespace
}  // namespace fp8rl::trainer
