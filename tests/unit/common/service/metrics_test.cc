// Tests the Prometheus registry (on prometheus-cpp): naming rules, exposition format, histogram
// buckets, and the small service helpers (CRC-32C, options, log lines) every service relies on.
#include "common/service/metrics.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <thread>

#include "common/service/crc32c.h"
#include "common/service/log.h"
#include "common/service/options.h"

namespace fp8rl::service {
namespace {

TEST(Metrics, RejectsBadNames) {
  MetricsRegistry r;
  EXPECT_FALSE(r.add_counter("fp8rl_requests", "no _total").ok());
  EXPECT_FALSE(r.add_gauge("fp8rl_things_total", "gauge with _total").ok());
  EXPECT_FALSE(r.add_gauge("requests", "no prefix").ok());
  EXPECT_FALSE(r.add_gauge("fp8rl_Bad", "upper case").ok());
  EXPECT_FALSE(r.add_gauge("fp8rl_x", "bad label", {"__reserved"}).ok());
  EXPECT_FALSE(r.add_gauge("fp8rl_x", "dup label", {"a", "a"}).ok());
  EXPECT_FALSE(r.add_histogram("fp8rl_h_seconds", "le label", {"le"}, {1.0}).ok());
  EXPECT_FALSE(r.add_histogram("fp8rl_h_seconds", "unsorted", {}, {2.0, 1.0}).ok());
  ASSERT_TRUE(r.add_gauge("fp8rl_ok", "fine").ok());
  const auto dup = r.add_gauge("fp8rl_ok", "again");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("fp8rl_ok"), std::string::npos);
}

TEST(Metrics, RendersCountersGaugesWithLabels) {
  MetricsRegistry r;
  // prometheus-cpp does not escape HELP text, so the registry refuses what would need it.
  EXPECT_FALSE(r.add_counter("fp8rl_test_requests_total", "Two\nlines.", {"code"}).ok());
  EXPECT_FALSE(r.add_counter("fp8rl_test_requests_total", "Back \\ slash.", {"code"}).ok());
  auto* c = r.add_counter("fp8rl_test_requests_total", "Requests seen.", {"code"}).value();
  auto* g = r.add_gauge("fp8rl_test_temperature_celsius", "A gauge.").value();
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(0.5, 3.0);
  double expected = 0.0;
  for (int i = 0; i < 10; ++i) {
    const double x = dist(rng);
    expected += x;
    c->with({"200"}).inc(x);
  }
  c->with({"4\"0\n0"}).inc(2);
  c->with({"200"}).inc(-5);  // ignored
  g->get().set(-1.25);
  EXPECT_DOUBLE_EQ(c->with({"200"}).value(), expected);
  const std::string text = r.render();
  EXPECT_NE(text.find("# HELP fp8rl_test_requests_total Requests seen.\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE fp8rl_test_requests_total counter\n"), std::string::npos);
  const std::string ok_series = "fp8rl_test_requests_total{code=\"200\"} ";
  const size_t at = text.find(ok_series);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_DOUBLE_EQ(std::stod(text.substr(at + ok_series.size())), expected);
  EXPECT_NE(text.find("fp8rl_test_requests_total{code=\"4\\\"0\\n0\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("fp8rl_test_temperature_celsius -1.25\n"), std::string::npos);
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  MetricsRegistry r;
  auto* h =
      r.add_histogram("fp8rl_test_latency_seconds", "Latency.", {"phase"}, {0.1, 1, 10}).value();
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0, 30.0}) h->with({"train"}).observe(v);
  const std::string text = r.render();
  EXPECT_NE(text.find("fp8rl_test_latency_seconds_bucket{phase=\"train\",le=\"0.1\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("fp8rl_test_latency_seconds_bucket{phase=\"train\",le=\"1\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("fp8rl_test_latency_seconds_bucket{phase=\"train\",le=\"10\"} 4\n"),
            std::string::npos);
  EXPECT_NE(text.find("fp8rl_test_latency_seconds_bucket{phase=\"train\",le=\"+Inf\"} 6\n"),
            std::string::npos);
  EXPECT_NE(text.find("fp8rl_test_latency_seconds_sum{phase=\"train\"} 52.65\n"),
            std::string::npos);
  EXPECT_NE(text.find("fp8rl_test_latency_seconds_count{phase=\"train\"} 6\n"), std::string::npos);
}

TEST(Metrics, SpecialValuesAndUnusedFamilies) {
  MetricsRegistry r;
  auto* g = r.add_gauge("fp8rl_test_values", "Values.", {"kind"}).value();
  ASSERT_TRUE(r.add_gauge("fp8rl_test_unused", "Labelled, never used.", {"kind"}).ok());
  ASSERT_TRUE(r.add_counter("fp8rl_test_idle_total", "No labels, never used.").ok());
  g->with({"third"}).set(1.0 / 3.0);
  g->with({"inf"}).set(1.0 / 0.0);
  g->with({"neg_inf"}).set(-1.0 / 0.0);
  g->with({"nan"}).set(std::nan(""));
  g->with({"big"}).set(3e18);
  const std::string text = r.render();
  // Values Prometheus parses back exactly (round-trip precision).
  const std::string third = "fp8rl_test_values{kind=\"third\"} ";
  const size_t at = text.find(third);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(std::stod(text.substr(at + third.size())), 1.0 / 3.0);
  EXPECT_NE(text.find("fp8rl_test_values{kind=\"inf\"} +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fp8rl_test_values{kind=\"neg_inf\"} -Inf\n"), std::string::npos);
  EXPECT_NE(text.find("fp8rl_test_values{kind=\"big\"} 3e+18\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fp8rl_test_values{kind=\"nan\"} N"), std::string::npos);
  // An unlabelled family is exported at 0 from registration; a labelled one only once used.
  EXPECT_NE(text.find("fp8rl_test_idle_total 0\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("fp8rl_test_unused{"), std::string::npos) << text;
}

TEST(Metrics, ConcurrentUpdatesAreCounted) {
  MetricsRegistry r;
  auto* c = r.add_counter("fp8rl_test_events_total", "Events.", {"worker"}).value();
  auto* h = r.add_histogram("fp8rl_test_wait_seconds", "Waits.", {}, {0.5, 1.5}).value();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        c->with({t % 2 == 0 ? "even" : "odd"}).inc(0.5);
        h->get().observe(i % 3);  // 0, 1, 2
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_DOUBLE_EQ(c->with({"even"}).value(), 1000.0);
  EXPECT_DOUBLE_EQ(c->with({"odd"}).value(), 1000.0);
  const Histogram::Snapshot snap = h->get().snapshot();
  ASSERT_EQ(snap.cumulative.size(), 3u);
  EXPECT_EQ(snap.cumulative[0], 4u * 334u);  // i % 3 == 0 for 334 of 1000
  EXPECT_EQ(snap.cumulative[1], 4u * 667u);
  EXPECT_EQ(snap.cumulative[2], 4000u);
  EXPECT_EQ(snap.count, 4000u);
  EXPECT_DOUBLE_EQ(snap.sum, 4.0 * (333 * 1 + 333 * 2));
}

TEST(Crc32c, KnownVectorsAndChaining) {
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4
  std::mt19937 rng(3);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = crc32c(data);
  EXPECT_EQ(crc32c(data.substr(333), crc32c(data.substr(0, 333))), whole);
  data[500] ^= 1;
  EXPECT_NE(crc32c(data), whole);
}

// The SSE4.2 path and the portable tables agree on every length 0..300 at every alignment 0..7
// (the instruction's 8-byte body and its byte tail), on the known vector, and when chained.
TEST(Crc32c, HardwareMatchesTheTables) {
  if (!crc32c_hardware_available()) GTEST_SKIP() << "no SSE4.2 crc32 on this CPU";
  EXPECT_EQ(crc32c_hardware("123456789", 9), 0xE3069283u);
  std::mt19937 rng(5);
  std::string data(320, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t align = 0; align < 8; ++align) {
    for (size_t n = 0; n + align <= 308; ++n) {
      const char* p = data.data() + align;
      ASSERT_EQ(crc32c_hardware(p, n, 0x1234u), crc32c_software(p, n, 0x1234u))
          << "length " << n << ", alignment " << align;
    }
  }
  const uint32_t head = crc32c_hardware(data.data(), 101);
  EXPECT_EQ(crc32c_hardware(data.data() + 101, 219, head), crc32c_software(data.data(), 320));
}

TEST(Options, DefaultsYamlThenFlags) {
  ServiceOptions defaults;
  defaults.name = "test";
  defaults.grpc_port = 50051;
  defaults.extra["heartbeat_seconds"] = "1";
  const std::string path = testing::TempDir() + "/opts.yaml";
  std::ofstream(path) << "grpc_port: 6000\nhttp_port: 7000\nheartbeat_seconds: 2.5\n";
  auto o = parse_service_options(defaults, {"--config", path, "--http-port=7100"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->grpc_port, 6000);
  EXPECT_EQ(o->http_port, 7100);
  EXPECT_DOUBLE_EQ(extra_double(*o, "heartbeat_seconds").value(), 2.5);

  auto bad_port = parse_service_options(defaults, {"--grpc-port", "70000"});
  ASSERT_FALSE(bad_port.ok());
  EXPECT_NE(bad_port.status().message().find("--grpc-port"), std::string::npos);
  auto unknown = parse_service_options(defaults, {"--nope", "1"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--nope: unknown flag"), std::string::npos);
  std::ofstream(path) << "grpc_portt: 1\n";
  auto bad_key = parse_service_options(defaults, {"--config", path});
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("grpc_portt: unknown option"), std::string::npos);
  auto missing = parse_service_options(defaults, {"--http-port"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing value"), std::string::npos);
}

TEST(Log, KeyValueLineQuotesWhenNeeded) {
  const std::string line = format_log_line(LogLevel::kWarn, "coordinator", "job failed",
                                           {{"job", "job-1"}, {"error", "a \"b\"\nc"}});
  EXPECT_NE(line.find(" level=warn component=coordinator msg=\"job failed\" job=job-1 "
                      "error=\"a \\\"b\\\"\\nc\""),
            std::string::npos)
      << line;
  EXPECT_EQ(line.rfind("ts=", 0), 0u);
  EXPECT_FALSE(parse_log_level("verbose").ok());
}

}  // namespace
}  // namespace fp8rl::service
