// Trainer groups through the service path (docs/design/training.md "Trainer groups"): the
// coordinator's rendezvous service on loopback, Trainers joining a group through it (JoinGroup),
// the same InitPolicy / TrainStep / Publish sent to every rank against one Trainer alone; the
// worker registry's group selection; JoinGroup's argument errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "common/service/grpc_server.h"
#include "services/coordinator/rendezvous_service.h"
#include "services/coordinator/worker_registry.h"
#include "services/trainer_worker/rendezvous_client.h"
#include "tests/unit/trainer_worker/trainer_test_util.h"
#include "tests/unit/weight_sync/test_server.h"

namespace fp8rl::trainer {
namespace {

using namespace testing;  // NOLINT: the shared trainer test helpers

struct RendezvousServer {
  coordinator::RendezvousImpl impl;
  std::unique_ptr<service::GrpcServer> server;
  std::string address;
  RendezvousServer() {
    service::GrpcServerOptions o;
    o.address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<service::GrpcServer>> s = service::GrpcServer::start(o, {&impl});
    EXPECT_TRUE(s.ok()) << s.status();
    server = std::move(*s);
    address = absl::StrCat("127.0.0.1:", server->port());
  }
  ~RendezvousServer() { server->shutdown(std::chrono::milliseconds(100)); }
};

TEST(Rendezvous, SetGetWaitsAndTimesOutNamingTheKey) {
  RendezvousServer rv;
  GrpcRendezvousStore store(grpc::CreateChannel(rv.address, grpc::InsecureChannelCredentials()));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(store.set("g/1", std::string("\x01\x00\x02", 3)).ok());
  });
  absl::StatusOr<std::string> v = store.get("g/1", std::chrono::seconds(10));
  late.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("\x01\x00\x02", 3));
  absl::StatusOr<std::string> missing = store.get("g/2", std::chrono::milliseconds(300));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded) << missing.status();
  EXPECT_NE(missing.status().message().find("g/2"), std::string::npos);
  EXPECT_EQ(store.set("", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkerRegistry, TrainerGroupIsTheFirstLiveTrainersByName) {
  coordinator::WorkerRegistry registry(std::chrono::seconds(60));
  registry.register_worker(coordinator::WorkerKind::kTrainer, "b:1", "", "trainer-1", 0);
  registry.register_worker(coordinator::WorkerKind::kGeneration, "g:1", "", "gen-0", 0);
  registry.register_worker(coordinator::WorkerKind::kTrainer, "a:1", "", "trainer", 0);
  registry.register_worker(coordinator::WorkerKind::kTrainer, "c:1", "", "trainer-2", 0);
  EXPECT_TRUE(registry.trainer_group(4).empty());
  const std::vector<coordinator::WorkerInfo> two = registry.trainer_group(2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].name, "trainer");
  EXPECT_EQ(two[1].name, "trainer-1");
  EXPECT_EQ(registry.trainer_group(3).size(), 3u);
}

TEST(WorkerRegistry, TheSameProcessRegisteredAgainAfterItsExpiryIsStillLive) {
  int64_t now = 1000;
  coordinator::WorkerRegistry registry(std::chrono::milliseconds(5000), std::chrono::seconds(1),
                                       [&now] { return now; });
  const std::string id = registry.register_worker(coordinator::WorkerKind::kTrainer, "t:1", "",
                                                  "trainer-0", 0, "00000000000000a1");
  const std::string other = registry.register_worker(coordinator::WorkerKind::kTrainer, "t:2", "",
                                                     "trainer-1", 0, "00000000000000b2");
  const std::optional<coordinator::WorkerInfo> info = registry.find(id);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->instance, "00000000000000a1");
  EXPECT_TRUE(registry.is_same_process_live(*info));
  // Silent past the expiry (a partition): not live, old id gone.
  now += 6000;
  EXPECT_FALSE(registry.heartbeat(other, 0, 0));  // trainer-1 expired too
  EXPECT_FALSE(registry.is_same_process_live(*info));
  // The same process registers again: a new id, but the old registration's process is live.
  const std::string again = registry.register_worker(coordinator::WorkerKind::kTrainer, "t:1", "",
                                                     "trainer-0", 0, "00000000000000a1");
  EXPECT_NE(again, id);
  EXPECT_FALSE(registry.is_live(id));
  EXPECT_TRUE(registry.is_same_process_live(*info));
  // Another process under the same name (a restart): the old registration's process is gone.
  registry.register_worker(coordinator::WorkerKind::kTrainer, "t:1", "", "trainer-0", 0,
                           "00000000000000c3");
  EXPECT_FALSE(registry.is_same_process_live(*info));
  // A registration without an instance (an older worker) is live only under its own id.
  const std::string bare =
      registry.register_worker(coordinator::WorkerKind::kTrainer, "t:3", "", "trainer-2", 0);
  const coordinator::WorkerInfo bare_info = *registry.find(bare);
  EXPECT_TRUE(registry.is_same_process_live(bare_info));
  registry.register_worker(coordinator::WorkerKind::kTrainer, "t:3", "", "trainer-2", 0);
  EXPECT_FALSE(registry.is_same_process_live(bare_info));
}

TEST(TrainerGroupJoin, JoinGroupRejectsBadArguments) {
  RecordingPublisher publisher;
  Trainer trainer(TrainerOptions{}, &publisher);
  v1::JoinGroupRequest r;
  r.set_size(0);
  EXPECT_EQ(trainer.join_group(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.set_size(2);
  r.set_rank(2);
  EXPECT_EQ(trainer.join_group(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.set_rank(1);
  r.set_timeout_ms(1000);
  // No group id, then no rendezvous address anywhere.
  EXPECT_EQ(trainer.join_group(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.set_group_id("g");
  absl::Status s = trainer.join_group(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("rendezvous_address"), std::string::npos);
  // The backend follows the trainer's device; an unknown one names the flag.
  TrainerOptions on_tpu;
  on_tpu.device = "tpu";
  on_tpu.coordinator_address = "localhost:1";
  Trainer tpu(on_tpu, &publisher);
  s = tpu.join_group(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("--device: must be cpu, cuda or cuda:<index>, got 'tpu'"),
            std::string::npos)
      << s;
  // The shard mode the coordinator sends (the job's trainer.shard) is checked first, naming it.
  r.set_shard("zero2");
  s = trainer.join_group(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("shard: must be none, grads_optimizer or params, got 'zero2'"),
            std::string::npos)
      << s;
  // Size 1 leaves any group and needs nothing else.
  v1::JoinGroupRequest alone;
  alone.set_size(1);
  EXPECT_TRUE(trainer.join_group(alone).ok());
  EXPECT_EQ(trainer.status().group_size(), 1);
}

// One GRPO step (2 minibatches) and a publish, alone and as a group of two trainers. BF16
// training, so the group differs only by summation order (tolerances as in
// tests/unit/train/data_parallel_test.cc). Parameter: --allreduce-bucket-mb in bytes (0: one
// all-reduce after the backward; 4096: buckets smaller than every weight matrix).
class TrainerGroup : public ::testing::TestWithParam<int64_t> {};

TEST_P(TrainerGroup, TwoTrainersTakeTheSingleTrainersStep) {
  const v1::InitPolicyRequest init =
      init_request(v1::WEIGHT_FORMAT_BF16, v1::WEIGHT_FORMAT_FP8, false, 1e-3);
  v1::TrainStepRequest step = random_step(11, 6);
  step.mutable_algorithm()->set_minibatches(2);

  RecordingPublisher alone_publisher;
  Trainer alone(TrainerOptions{}, &alone_publisher);
  ASSERT_TRUE(alone.init_policy(init).ok());
  absl::StatusOr<v1::TrainStepResponse> want = alone.train_step(step);
  ASSERT_TRUE(want.ok()) << want.status();

  RendezvousServer rv;
  RecordingPublisher publishers[2];
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < 2; ++r) {
    TrainerOptions o;
    o.worker_id = absl::StrCat("trainer-", r);
    o.coordinator_address = rv.address;
    o.allreduce_bucket_bytes = GetParam();
    trainers.push_back(std::make_unique<Trainer>(o, &publishers[r]));
  }
  std::vector<absl::StatusOr<v1::TrainStepResponse>> got(2, absl::UnknownError("not run"));
  std::vector<absl::StatusOr<v1::PublishResponse>> published(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      v1::JoinGroupRequest join;
      join.set_group_id("test-group");
      join.set_rank(r);
      join.set_size(2);
      join.set_timeout_ms(20000);
      absl::StatusOr<v1::JoinGroupResponse> joined = trainers[r]->join_group(join);
      ASSERT_TRUE(joined.ok()) << joined.status();
      EXPECT_EQ(joined->backend(), "gloo");
      ASSERT_TRUE(trainers[r]->init_policy(init).ok());
      got[r] = trainers[r]->train_step(step);
      v1::PublishRequest publish;
      publish.set_calibrate_kv_scales(true);
      published[r] = trainers[r]->publish(publish);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    ASSERT_TRUE(published[r].ok()) << "rank " << r << ": " << published[r].status();
    EXPECT_EQ(trainers[r]->status().group_size(), 2);
    EXPECT_EQ(trainers[r]->status().group_rank(), r);
  }
  // Rank 0 uploads, rank 1 only takes the KV scales.
  EXPECT_EQ(publishers[0].uploads.size(), 1u);
  EXPECT_TRUE(publishers[1].uploads.empty());
  EXPECT_EQ(trainers[0]->policy()->kv_scales().k, trainers[1]->policy()->kv_scales().k);
  const v1::TrainStepResponse& g = *got[0];
  EXPECT_NEAR(g.loss(), want->loss(), 1e-4 * std::max(1.0, std::abs(want->loss())));
  EXPECT_NEAR(g.grad_norm(), want->grad_norm(), 1e-4 * want->grad_norm());
  EXPECT_EQ(g.tokens(), want->tokens());
  EXPECT_EQ(g.version(), want->version());
  EXPECT_TRUE(g.phase_seconds().contains("all_reduce"));
  // Both ranks hold the same weights, within rounding of the single trainer's.
  const auto w0 = trainers[0]->policy()->params(), w1 = trainers[1]->policy()->params();
  const auto wa = alone.policy()->params();
  ASSERT_EQ(w0.size(), wa.size());
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    ASSERT_EQ(w0[i], w1[i]) << i;
    diff2 += (double(w0[i]) - wa[i]) * (double(w0[i]) - wa[i]);
    norm2 += double(wa[i]) * wa[i];
  }
  EXPECT_LE(std::sqrt(diff2 / norm2), 1e-5);
}

// trainer.shard grads_optimizer (docs/design/sharding.md), sent in JoinGroupRequest.shard: a pair
// of sharded trainers takes the same GRPO steps as an unsharded pair, bit for bit (2 ranks: the
// reduce-scatter's sum equals the all-reduce's), with each learner holding its own shard. Both
// pairs then checkpoint (the sharded pair on both ranks, each writing its optimizer shard; the
// unsharded pair on rank 0, as the coordinator calls them), load the checkpoint on both ranks
// and take one more step: still bit for bit equal, so each sharded rank restored its moments.
TEST(TrainerGroup, ShardedPairEqualsUnshardedPair) {
  const v1::InitPolicyRequest init =
      init_request(v1::WEIGHT_FORMAT_FP8, v1::WEIGHT_FORMAT_FP8, false, 1e-3);
  v1::TrainStepRequest step = random_step(12, 6);
  step.mutable_algorithm()->set_minibatches(2);
  RendezvousServer rv;
  RecordingPublisher publishers[5];  // outlive the trainers that point at them
  auto run_pair = [&](train::ShardMode shard, const std::string& group_id) {
    std::vector<std::unique_ptr<Trainer>> trainers;
    const int first = shard == train::ShardMode::kNone ? 0 : 2;
    for (int r = 0; r < 2; ++r) {
      TrainerOptions o;
      o.worker_id = absl::StrCat(group_id, "-", r);
      o.coordinator_address = rv.address;
      o.allreduce_bucket_bytes = 4096;
      trainers.push_back(std::make_unique<Trainer>(o, &publishers[first + r]));
    }
    std::vector<absl::StatusOr<v1::TrainStepResponse>> got(2, absl::UnknownError("not run"));
    std::barrier ready(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        v1::JoinGroupRequest join;
        join.set_group_id(group_id);
        join.set_rank(r);
        join.set_size(2);
        join.set_timeout_ms(20000);
        join.set_shard(std::string(train::shard_mode_name(shard)));
        absl::StatusOr<v1::JoinGroupResponse> joined = trainers[r]->join_group(join);
        ASSERT_TRUE(joined.ok()) << joined.status();
        ASSERT_TRUE(trainers[r]->init_policy(init).ok());
        got[r] = trainers[r]->train_step(step);
        if (got[r].ok()) got[r] = trainers[r]->train_step(random_step(13, 6));
        // Every rank reaches both barriers whatever fails (a failure is recorded in got[r]).
        v1::SaveCheckpointRequest save;
        save.set_path(absl::StrCat(::testing::TempDir(), "/fp8rl-", group_id, "-", getpid()));
        save.set_include_optimizer(true);
        if (got[r].ok() && (r == 0 || shard != train::ShardMode::kNone)) {
          absl::StatusOr<v1::SaveCheckpointResponse> saved = trainers[r]->save_checkpoint(save);
          if (!saved.ok()) got[r] = saved.status();
        }
        ready.arrive_and_wait();  // rank 0 of the unsharded pair wrote the folder
        if (got[r].ok()) {
          v1::LoadCheckpointRequest load;
          load.set_path(save.path());
          absl::StatusOr<v1::LoadCheckpointResponse> loaded = trainers[r]->load_checkpoint(load);
          if (!loaded.ok()) {
            got[r] = loaded.status();
          } else {
            EXPECT_TRUE(loaded->optimizer_restored());
            got[r] = trainers[r]->train_step(random_step(14, 6));
          }
        }
        ready.arrive_and_wait();  // both loaded before the folder goes
        if (r == 0) std::filesystem::remove_all(save.path());
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    return trainers;
  };
  auto plain = run_pair(train::ShardMode::kNone, "plain-pair");
  auto sharded = run_pair(train::ShardMode::kGradsOptimizer, "sharded-pair");
  ASSERT_NE(sharded[0]->learner(), nullptr);
  ASSERT_NE(sharded[0]->learner()->shard_layout(), nullptr);
  EXPECT_EQ(sharded[0]->learner()->shard_layout()->ranks(), 2);
  EXPECT_EQ(plain[0]->learner()->shard_layout(), nullptr);
  const auto want = plain[0]->policy()->params();
  double change2 = 0;
  for (int r = 0; r < 2; ++r) {
    // Each sharded rank holds the fp32 master of its own shard only (docs/design/sharding.md).
    const train::ShardLayout& cut = *sharded[r]->learner()->shard_layout();
    const auto got = sharded[r]->policy()->params();
    ASSERT_EQ(std::ssize(got), cut.end(r) - cut.begin(r));
    EXPECT_EQ(sharded[r]->policy()->master_begin(), cut.begin(r));
    EXPECT_EQ(0, std::memcmp(got.data(), want.data() + cut.begin(r), got.size() * sizeof(float)))
        << "rank " << r;
  }
  // The steps changed the weights (so the comparison is not of two untouched copies).
  Trainer fresh(TrainerOptions{}, &publishers[4]);
  ASSERT_TRUE(fresh.init_policy(init).ok());
  const auto w0 = fresh.policy()->params();
  for (size_t i = 0; i < want.size(); ++i)
    change2 += (double(want[i]) - w0[i]) * (double(want[i]) - w0[i]);
  EXPECT_GT(change2, 0.0);
}

// The same two trainers take a grads_optimizer job, form the group again for it (a re-formed group
// keeps the policy), then a params job: JoinGroup drops the earlier job's policy, which cannot
// change its mode, and the next InitPolicy and TrainStep run sharded as params. Before, the
// second JoinGroup failed with "sharded as grads_optimizer; it cannot change to params".
TEST(TrainerGroup, AJobInAnotherShardModeFollowsOnTheSameTrainers) {
  v1::InitPolicyRequest init =
      init_request(v1::WEIGHT_FORMAT_FP8, v1::WEIGHT_FORMAT_FP8, false, 1e-3);
  RendezvousServer rv;
  RecordingPublisher publishers[2];
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < 2; ++r) {
    TrainerOptions o;
    o.worker_id = absl::StrCat("modes-", r);
    o.coordinator_address = rv.address;
    trainers.push_back(std::make_unique<Trainer>(o, &publishers[r]));
  }
  // Every rank runs `body` at once; returns each rank's status.
  auto on_both = [&](const std::function<absl::Status(int)>& body) {
    std::vector<absl::Status> got(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) threads.emplace_back([&, r] { got[r] = body(r); });
    for (std::thread& t : threads) t.join();
    return got;
  };
  auto join = [&](int r, train::ShardMode shard, const std::string& group_id) -> absl::Status {
    v1::JoinGroupRequest request;
    request.set_group_id(group_id);
    request.set_rank(r);
    request.set_size(2);
    request.set_timeout_ms(20000);
    request.set_shard(std::string(train::shard_mode_name(shard)));
    return trainers[r]->join_group(request).status();
  };
  auto step = [&](int r, uint64_t seed) -> absl::Status {
    v1::TrainStepRequest request = random_step(seed, 6);
    request.set_job_id(init.job_id());
    return trainers[r]->train_step(request).status();
  };
  init.set_job_id("job-zero2");
  for (const absl::Status& s : on_both([&](int r) {
         if (absl::Status j = join(r, train::ShardMode::kGradsOptimizer, "g1"); !j.ok()) return j;
         if (absl::Status i = trainers[r]->init_policy(init).status(); !i.ok()) return i;
         return step(r, 31);
       })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  const train::Learner* first = trainers[0]->learner();
  // The group re-formed for the same job and mode: the policy stays and trains on.
  for (const absl::Status& s : on_both([&](int r) {
         if (absl::Status j = join(r, train::ShardMode::kGradsOptimizer, "g2"); !j.ok()) return j;
         return step(r, 32);
       })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(trainers[0]->learner(), first);
  init.set_job_id("job-zero3");
  for (const absl::Status& s : on_both([&](int r) {
         if (absl::Status j = join(r, train::ShardMode::kParams, "g3"); !j.ok()) return j;
         // The earlier job's policy is gone: its calls now ask for InitPolicy.
         EXPECT_EQ(trainers[r]->learner(), nullptr);
         if (absl::Status i = trainers[r]->init_policy(init).status(); !i.ok()) return i;
         return step(r, 33);
       })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_NE(trainers[r]->learner(), nullptr);
    EXPECT_EQ(trainers[r]->learner()->shard_mode(), train::ShardMode::kParams);
    EXPECT_EQ(trainers[r]->learner()->job_id(), "job-zero3");
  }
}

// Parallel upload from a sharded group (docs/design/weight-sync-fanout.md "Parallel upload from N
// trainer ranks"): each rank of a grads_optimizer pair uploads its own part of the version to a
// real weight-sync service on loopback; the version weight sync assembles from the two parts is
// byte for byte the one an unsharded pair's rank 0 uploads alone to another weight sync (the
// pairs take the same step bit for bit), with the same manifest.
TEST(TrainerGroup, ShardedPairUploadsOnePartPerRankTheSameVersion) {
  const v1::InitPolicyRequest init =
      init_request(v1::WEIGHT_FORMAT_FP8, v1::WEIGHT_FORMAT_FP8, false, 1e-3);
  v1::TrainStepRequest step = random_step(21, 6);
  step.mutable_algorithm()->set_minibatches(2);
  RendezvousServer rv;
  weight_sync::testing::TestServer whole_sync, parts_sync;
  auto run_pair = [&](train::ShardMode shard, const std::string& group_id,
                      weight_sync::testing::TestServer& sync) {
    std::vector<std::unique_ptr<WeightPublisher>> publishers;
    std::vector<std::unique_ptr<Trainer>> trainers;
    for (int r = 0; r < 2; ++r) {
      publishers.push_back(make_grpc_weight_publisher(std::chrono::seconds(60)));
      TrainerOptions o;
      o.worker_id = absl::StrCat(group_id, "-", r);
      o.coordinator_address = rv.address;
      o.default_weight_sync_address = sync.address();
      trainers.push_back(std::make_unique<Trainer>(o, publishers.back().get()));
    }
    std::vector<absl::StatusOr<v1::PublishResponse>> published(2, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        v1::JoinGroupRequest join;
        join.set_group_id(group_id);
        join.set_rank(r);
        join.set_size(2);
        join.set_timeout_ms(20000);
        join.set_shard(std::string(train::shard_mode_name(shard)));
        absl::StatusOr<v1::JoinGroupResponse> joined = trainers[r]->join_group(join);
        ASSERT_TRUE(joined.ok()) << joined.status();
        ASSERT_TRUE(trainers[r]->init_policy(init).ok());
        absl::StatusOr<v1::TrainStepResponse> trained = trainers[r]->train_step(step);
        if (!trained.ok()) {
          published[r] = trained.status();
          return;
        }
        v1::PublishRequest publish;
        publish.set_calibrate_kv_scales(true);
        published[r] = trainers[r]->publish(publish);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(published[r].ok()) << group_id << " rank " << r << ": " << published[r].status();
    }
    return published;
  };
  auto whole = run_pair(train::ShardMode::kNone, "whole-pair", whole_sync);
  auto parts = run_pair(train::ShardMode::kGradsOptimizer, "parts-pair", parts_sync);
  ASSERT_TRUE(whole[0].ok() && parts[0].ok() && parts[1].ok());
  weight_sync::StoredVersionPtr want = whole_sync.service().store().latest();
  weight_sync::StoredVersionPtr got = parts_sync.service().store().latest();
  ASSERT_NE(want, nullptr);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->version(), want->version());
  EXPECT_EQ(parts[0]->version(), want->version());
  EXPECT_EQ(parts[1]->version(), want->version());
  ASSERT_EQ(got->payload.size(), want->payload.size());
  EXPECT_TRUE(got->payload == want->payload) << "the assembled version differs";
  ASSERT_EQ(got->manifest.tensors_size(), want->manifest.tensors_size());
  for (int i = 0; i < want->manifest.tensors_size(); ++i) {
    EXPECT_EQ(got->manifest.tensors(i).name(), want->manifest.tensors(i).name());
    EXPECT_EQ(got->manifest.tensors(i).crc32c(), want->manifest.tensors(i).crc32c()) << i;
  }
  // Each rank sent one non-empty part, together the whole version, stored once.
  EXPECT_GT(parts[0]->bytes(), 0u);
  EXPECT_GT(parts[1]->bytes(), 0u);
  EXPECT_EQ(parts[0]->bytes() + parts[1]->bytes(), want->payload.size());
  EXPECT_EQ(whole[0]->bytes(), want->payload.size());
  EXPECT_EQ(parts_sync.metrics().uploads->with({"accepted"}).value(), 1);
  EXPECT_EQ(parts_sync.metrics().uploads->with({"rejected"}).value(), 0);
}

INSTANTIATE_TEST_SUITE_P(Buckets, TrainerGroup, ::testing::Values(int64_t{0}, int64_t{4096}),
                         [](const auto& info) {
                           return absl::StrCat("bucket_bytes_", info.param);
                         });

}  // namespace
}  // namespace fp8rl::trainer
