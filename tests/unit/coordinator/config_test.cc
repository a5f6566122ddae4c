// The coordinator's flag table: defaults, typed durations and limits, the --metrics-port alias,
// and one bad value per flag kind naming the flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/coordinator/coordinator_config.h"

namespace fp8rl::coordinator {
namespace {

TEST(CoordinatorConfigTest, Defaults) {
  absl::StatusOr<CoordinatorConfig> c = parse_coordinator_config({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.grpc_port, 50051);
  EXPECT_EQ(c->service.http_port, 8080);
  EXPECT_EQ(c->service.data_dir, "/tmp/fp8rl/coordinator");
  EXPECT_EQ(c->job_store, "");
  EXPECT_EQ(c->heartbeat_interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(c->worker_expiry, std::chrono::milliseconds(5000));
  EXPECT_EQ(c->generate_deadline, std::chrono::seconds(120));
  EXPECT_EQ(c->worker_wait, std::chrono::seconds(120));
  EXPECT_EQ(c->trainer_timeout, std::chrono::seconds(3600));
  EXPECT_EQ(c->trainer_resume, std::chrono::seconds(120));
  EXPECT_EQ(c->sync_wait, std::chrono::seconds(60));
  EXPECT_EQ(c->limits.max_inflight_requests, 16);
  EXPECT_EQ(c->limits.max_queued_jobs, 256);
  EXPECT_EQ(c->limits.retry_after, std::chrono::milliseconds(1000));
  EXPECT_EQ(c->limits.max_job_tokens, 0);
  EXPECT_TRUE(c->warnings.empty());
}

TEST(CoordinatorConfigTest, FlagsSetTypedValues) {
  absl::StatusOr<CoordinatorConfig> c = parse_coordinator_config({"--http-port=8181",
                                                                  "--job-store",
                                                                  "/tmp/j.db",
                                                                  "--heartbeat-interval-ms",
                                                                  "250",
                                                                  "--worker-expiry-ms=900",
                                                                  "--generate-deadline-seconds",
                                                                  "7",
                                                                  "--trainer-resume-seconds=0",
                                                                  "--sync-wait-seconds",
                                                                  "3",
                                                                  "--max-inflight-requests",
                                                                  "0",
                                                                  "--retry-after-ms",
                                                                  "40",
                                                                  "--max-job-tokens",
                                                                  "123456789012",
                                                                  "--auth-token-file",
                                                                  "/run/t",
                                                                  "--data-root",
                                                                  "/d"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.http_port, 8181);
  EXPECT_EQ(c->job_store, "/tmp/j.db");
  EXPECT_EQ(c->heartbeat_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(c->worker_expiry, std::chrono::milliseconds(900));
  EXPECT_EQ(c->generate_deadline, std::chrono::seconds(7));
  EXPECT_EQ(c->trainer_resume, std::chrono::seconds(0));
  EXPECT_EQ(c->sync_wait, std::chrono::seconds(3));
  EXPECT_EQ(c->limits.max_inflight_requests, 0);
  EXPECT_EQ(c->limits.retry_after, std::chrono::milliseconds(40));
  EXPECT_EQ(c->limits.max_job_tokens, 123456789012);
  EXPECT_EQ(c->auth_token_file, "/run/t");
  EXPECT_EQ(c->data_root, "/d");
}

TEST(CoordinatorConfigTest, MetricsPortIsADeprecatedAliasOfHttpPort) {
  absl::StatusOr<CoordinatorConfig> c = parse_coordinator_config({"--metrics-port", "8282"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->service.http_port, 8282);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0], "--metrics-port is deprecated; use --http-port");
}

TEST(CoordinatorConfigTest, BadValuesNameTheFlag) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--heartbeat-interval-ms", "0"}, "--heartbeat-interval-ms: must be in [1, 3600000], got 0"},
      {{"--worker-expiry-ms", "soon"}, "--worker-expiry-ms: expected an integer, got 'soon'"},
      {{"--trainer-resume-seconds", "-1"}, "--trainer-resume-seconds: must be in [0, 604800]"},
      {{"--sync-wait-seconds", "0"}, "--sync-wait-seconds: must be in [1, 86400], got 0"},
      {{"--max-queued-jobs", "-5"}, "--max-queued-jobs: must be in [0, 1073741824], got -5"},
      {{"--retry-after-ms", "0"}, "--retry-after-ms: must be in [1, 3600000], got 0"},
      {{"--http-port", "65536"}, "--http-port: must be in [0, 65535], got 65536"},
      {{"--log-level", "loud"}, "--log-level: must be debug, info, warn or error, got 'loud'"},
      {{"--data-dir", ""}, "--data-dir: must not be empty"},
      {{"--heartbeat-seconds", "1"}, "--heartbeat-seconds: unknown flag"},
  };
  for (const auto& [args, expect] : cases) {
    SCOPED_TRACE(expect);
    absl::StatusOr<CoordinatorConfig> c = parse_coordinator_config(args);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(expect), std::string::npos) << c.status();
  }
}

TEST(CoordinatorConfigTest, UsageIsGeneratedFromTheTable) {
  const std::string usage = coordinator_usage();
  EXPECT_EQ(usage.rfind("usage: fp8rl-coordinator [--config FILE] [flags]\n", 0), 0u) << usage;
  for (const char* flag :
       {"--http-port INT in [0, 65535] (default: 8080)", "--sync-wait-seconds SECONDS",
        "--retry-after-ms MILLISECONDS in [1, 3600000] (default: 1000)", "--auth-token-file",
        "--metrics-port\n      deprecated: use --http-port"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag << "\nin:\n" << usage;
  }
}

}  // namespace
}  // namespace fp8rl::coordinator
