// Flag parsing of fp8rl-generation-worker: defaults, the documented flags, and errors that name
// the flag.
#include "services/generation_worker/worker_config.h"

#include <gtest/gtest.h>

namespace fp8rl::generation {
namespace {

TEST(WorkerConfigTest, Defaults) {
  auto c = parse_generation_worker_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.grpc_port, 50061);
  EXPECT_EQ(c->metrics_port, 9461);
  EXPECT_EQ(c->service.coordinator, "localhost:50051");
  EXPECT_EQ(c->weight_sync, "localhost:50052");
  EXPECT_EQ(c->service.advertise_host, "127.0.0.1");
  EXPECT_TRUE(c->worker_id.empty());
  EXPECT_FALSE(c->precision.linear.has_value());
  EXPECT_FALSE(c->precision.kv_cache.has_value());
  EXPECT_EQ(c->device, "auto");
  EXPECT_EQ(c->gpu_memory_fraction, 0.9);
  EXPECT_EQ(c->scheduler.gpu_weight_slots, 2);
  EXPECT_EQ(c->scheduler.kv_block_size, 16);
  EXPECT_EQ(kv_budget_blocks(c->scheduler), 262144 / 16);
}

TEST(WorkerConfigTest, ComposeFlags) {
  auto c = parse_generation_worker_config(
      {"--grpc-port=50063", "--http-port=9463", "--coordinator=coordinator:50051", "--weight-sync",
       "weight-sync:50052", "--advertise-host=gen-2", "--max-batch-tokens=512", "--worker-id=gen-2",
       "--precision=fp8", "--kv-cache=fp8", "--device=cpu", "--gpu-memory-fraction=0.5",
       "--kv-block-size=32", "--kv-cache-tokens=1000", "--gpu-weight-slots=1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.grpc_port, 50063);
  EXPECT_EQ(c->metrics_port, 9463);
  EXPECT_EQ(c->service.coordinator, "coordinator:50051");
  EXPECT_EQ(c->weight_sync, "weight-sync:50052");
  EXPECT_EQ(c->service.advertise_host, "gen-2");
  EXPECT_EQ(c->scheduler.max_batch_tokens, 512);
  EXPECT_EQ(c->worker_id, "gen-2");
  EXPECT_EQ(c->precision.linear, model::Precision::kFP8);
  EXPECT_EQ(c->precision.kv_cache, model::KvCacheDtype::kFP8);
  EXPECT_EQ(c->device, "cpu");
  EXPECT_EQ(c->gpu_memory_fraction, 0.5);
  EXPECT_EQ(c->scheduler.gpu_weight_slots, 1);
  EXPECT_EQ(c->scheduler.kv_block_size, 32);
  EXPECT_EQ(kv_budget_blocks(c->scheduler), 31);  // floor(1000 / 32): whole blocks only
  for (const char* d : {"cuda", "auto"}) {
    auto other = parse_generation_worker_config({std::string("--device=") + d});
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(other->device, d);
  }
}

TEST(WorkerConfigTest, WeightRelayIsOffByDefault) {
  auto c = parse_generation_worker_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->weight_relay);
  EXPECT_EQ(c->relay_stall_ms, 10000);
  c = parse_generation_worker_config({"--weight-relay=on", "--relay-stall-ms=2500"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->weight_relay);
  EXPECT_EQ(c->relay_stall_ms, 2500);
}

// --weight-same-host: asks for weight sync's same-host file by default (weight sync decides).
TEST(WorkerConfigTest, WeightSameHostIsAutoByDefault) {
  auto c = parse_generation_worker_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->weight_same_host, weight_sync::SameHostMode::kAuto);
  c = parse_generation_worker_config({"--weight-same-host=off"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->weight_same_host, weight_sync::SameHostMode::kOff);
}

// --http-port is the HTTP port on every service; --metrics-port, the worker's old name, still
// works and warns naming the new flag.
TEST(WorkerConfigTest, MetricsPortIsADeprecatedAlias) {
  auto c = parse_generation_worker_config({"--metrics-port=9555"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_port, 9555);
  EXPECT_EQ(c->service.http_port, 9555);
  EXPECT_EQ(c->warnings,
            (std::vector<std::string>{"--metrics-port is deprecated; use --http-port"}));
  c = parse_generation_worker_config({"--http-port=9556"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_port, 9556);
  EXPECT_TRUE(c->warnings.empty());
  const std::string usage = generation_worker_usage();
  EXPECT_NE(usage.find("--http-port INT in [0, 65535] (default: 9461)"), std::string::npos)
      << usage;
  EXPECT_NE(usage.find("--batch-wait-ms MILLISECONDS in [0, 10000] (default: 2)"),
            std::string::npos)
      << usage;
}

TEST(WorkerConfigTest, BadValuesNameTheFlag) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--max-batch-tokens=0"}, "--max-batch-tokens"},
      {{"--max-batch-tokens=lots"}, "--max-batch-tokens"},
      {{"--precision=fp4"}, "--precision"},
      {{"--kv-cache=int8"}, "--kv-cache"},
      {{"--weight-sync=nohost"}, "--weight-sync"},
      {{"--coordinator=host:99999"}, "--coordinator"},
      {{"--http-port=70000"}, "--http-port"},
      {{"--batch-wait-ms=-1"}, "--batch-wait-ms"},
      {{"--no-such-flag=1"}, "--no-such-flag"},
      {{"--device=gpu"}, "--device"},
      {{"--gpu-memory-fraction=0"}, "--gpu-memory-fraction"},
      {{"--gpu-memory-fraction=1.5"}, "--gpu-memory-fraction"},
      {{"--gpu-memory-fraction=most"}, "--gpu-memory-fraction"},
      {{"--gpu-weight-slots=0"}, "--gpu-weight-slots"},
      {{"--gpu-weight-slots=3"}, "--gpu-weight-slots"},
      {{"--kv-block-size=0"}, "--kv-block-size"},
      {{"--kv-block-size=4096"}, "--kv-block-size"},
      {{"--kv-cache-tokens=8"}, "--kv-cache-tokens"},  // under one block of 16
      {{"--weight-relay=yes"}, "--weight-relay"},
      {{"--relay-stall-ms=10"}, "--relay-stall-ms"},
      {{"--weight-same-host=on"}, "--weight-same-host"},
  };
  for (const auto& [args, flag] : cases) {
    auto c = parse_generation_worker_config(args);
    ASSERT_FALSE(c.ok()) << args[0];
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(c.status().message().find(flag), std::string::npos) << c.status();
  }
}

}  // namespace
}  // namespace fp8rl::generation
