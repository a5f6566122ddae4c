// The generation worker end to end, in-process over real gRPC on loopback: results bit-identical
// to model::generate, continuous batching across concurrent calls, weight swaps between batches,
// request validation, cancellation (freed slots go to queued work), metrics, weight sync through a
// real weight-sync service, registration with a (fake) coordinator registry, and the SIGTERM drain.
#include "services/generation_worker/generation_worker.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_server.h"
#include "fp8rl/v1/generation.grpc.pb.h"
#include "fp8rl/v1/worker_registry.grpc.pb.h"
#include "services/generation_worker/generation_service.h"
#include "services/weight_sync/client.h"
#include "services/weight_sync/fanout.h"
#include "services/weight_sync/weight_sync_service.h"
#include "tests/unit/generation_worker/test_util.h"

namespace fp8rl::generation {
namespace {

using namespace std::chrono_literals;
using testing::export_set;
using testing::prompt_for;
using testing::random_model;
using testing::reference;

const model::PrecisionPolicy kFp8Policy =
    testing::policy_of(model::Precision::kFP8, model::KvCacheDtype::kBF16);

// A WorkerRegistry that records calls; `reregister` makes the next heartbeat ask to register again.
class FakeRegistry final : public v1::WorkerRegistry::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    std::lock_guard lock(mu);
    registers.push_back(*req);
    resp->set_worker_id(absl::StrCat(req->name(), "#", registers.size()));
    resp->set_heartbeat_interval_ms(30);
    resp->set_expiry_ms(1000);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::lock_guard lock(mu);
    heartbeats.push_back(*req);
    resp->set_reregister(reregister.exchange(false));
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* req,
                          v1::DeregisterResponse*) override {
    std::lock_guard lock(mu);
    deregistered.push_back(req->worker_id());
    return grpc::Status::OK;
  }

  std::mutex mu;
  std::vector<v1::RegisterWorkerRequest> registers;
  std::vector<v1::HeartbeatRequest> heartbeats;
  std::vector<std::string> deregistered;
  std::atomic<bool> reregister{false};
};

struct CallResult {
  grpc::Status status;
  std::map<std::string, v1::SampleResult> results;  // by sample id
  int messages = 0;
};

// Polls `done` every `poll` for up to `timeout`.
template <typename F>
bool eventually(F done, std::chrono::milliseconds timeout = 5000ms,
                std::chrono::milliseconds poll = 10ms) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(poll);
  }
  return done();
}

// A sample for Scheduler::submit: prompt_for(n), sampled at temperature 1 with `seed`.
SampleSpec sample_spec(int n, int max_new_tokens, uint64_t seed) {
  SampleSpec s;
  s.sample_id = absl::StrCat("s", n);
  s.prompt = prompt_for(n);
  s.params.temperature = 1.0f;
  s.params.max_new_tokens = max_new_tokens;
  s.params.seed = seed;
  return s;
}

// Takes every result of `request` (waiting up to `timeout` in all).
std::vector<SampleOutcome> take_all(GenerationRequest& request, std::chrono::milliseconds timeout) {
  std::vector<SampleOutcome> out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!request.done() && std::chrono::steady_clock::now() < end) {
    for (SampleOutcome& o : request.take(20ms)) out.push_back(std::move(o));
  }
  for (SampleOutcome& o : request.take(0ms)) out.push_back(std::move(o));
  return out;
}

// `got` equals model::generate on `set` for `spec` bit for bit.
void expect_outcome(const SampleOutcome& got, const SampleSpec& spec, const model::WeightSet& set,
                    const model::PrecisionPolicy& policy) {
  const model::GenerationResult want =
      reference(set, policy, spec.prompt, spec.params, spec.params.seed);
  EXPECT_EQ(got.sample_id, spec.sample_id);
  ASSERT_EQ(got.tokens, want.tokens) << spec.sample_id;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  EXPECT_EQ(
      std::memcmp(got.logprobs.data(), want.logprobs.data(), want.logprobs.size() * sizeof(float)),
      0)
      << spec.sample_id;
  EXPECT_EQ(got.reason, want.reason);
}

class GenerationWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ws_metrics = weight_sync::WeightSyncMetrics::create(&ws_registry_);
    ASSERT_TRUE(ws_metrics.ok()) << ws_metrics.status();
    ws_metrics_ = std::move(*ws_metrics);
    weight_sync_ =
        std::make_unique<weight_sync::WeightSyncServiceImpl>(ws_options_, ws_metrics_.get());
    service::GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    auto backend = service::GrpcServer::start(options, {weight_sync_.get(), &registry_});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    backend_address_ = absl::StrCat("127.0.0.1:", backend_->port());
  }

  void TearDown() override {
    worker_.reset();
    weight_sync_->begin_shutdown();
    backend_->shutdown(0ms);
  }

  GenerationWorkerConfig config(std::chrono::milliseconds batch_wait = 0ms) {
    GenerationWorkerConfig c;
    c.service = default_generation_worker_options();
    c.service.listen_host = "127.0.0.1";
    c.service.grpc_port = 0;
    c.metrics_port = 0;
    c.service.coordinator = backend_address_;
    c.weight_sync = backend_address_;
    c.worker_id = "gen-test";
    c.scheduler.batch_wait = batch_wait;
    c.max_samples_per_request = 16;
    return c;
  }

  void start_worker(const GenerationWorkerConfig& c) {
    auto w = GenerationWorker::start(c);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::move(*w);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", worker_->grpc_port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::GenerationService::NewStub(channel_);
  }

  static v1::GenerateRequest make_request(const std::vector<int>& prompts, uint64_t seed0,
                                          int max_new_tokens, float temperature = 1.0f) {
    v1::GenerateRequest req;
    req.set_request_id("test");
    for (int n : prompts) {
      v1::SampleRequest* s = req.add_samples();
      s->set_sample_id(absl::StrCat("s", n));
      const std::vector<int32_t> p = prompt_for(n);
      s->mutable_prompt_tokens()->Add(p.begin(), p.end());
      s->set_seed(seed0 + static_cast<uint64_t>(n));
    }
    req.mutable_sampling()->set_temperature(temperature);
    req.mutable_sampling()->set_max_new_tokens(max_new_tokens);
    return req;
  }

  CallResult call(const v1::GenerateRequest& req, std::chrono::milliseconds deadline = 30000ms) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    CallResult out;
    auto reader = stub_->Generate(&context, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      ++out.messages;
      for (const v1::SampleResult& r : resp.results()) out.results[r.sample_id()] = r;
    }
    out.status = reader->Finish();
    return out;
  }

  v1::GenerationStatus status() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::GenerationStatus s;
    EXPECT_TRUE(stub_->GetStatus(&context, {}, &s).ok());
    return s;
  }

  // Every result of `call` equals model::generate on `set` with the sample's prompt and seed,
  // bit for bit (tokens and float logprobs).
  static void expect_reference(const CallResult& result, const v1::GenerateRequest& req,
                               const model::WeightSet& set, const model::PrecisionPolicy& policy,
                               int64_t version) {
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    ASSERT_EQ(result.results.size(), static_cast<size_t>(req.samples_size()));
    model::SamplingParams params;
    params.temperature = req.sampling().temperature();
    params.max_new_tokens = req.sampling().max_new_tokens();
    params.stop_tokens.assign(req.sampling().stop_token_ids().begin(),
                              req.sampling().stop_token_ids().end());
    for (const v1::SampleRequest& s : req.samples()) {
      const v1::SampleResult& got = result.results.at(s.sample_id());
      const model::GenerationResult want = reference(
          set, policy, {s.prompt_tokens().begin(), s.prompt_tokens().end()}, params, s.seed());
      EXPECT_EQ(got.weight_version(), version) << s.sample_id();
      ASSERT_EQ(std::vector<int32_t>(got.tokens().begin(), got.tokens().end()), want.tokens)
          << s.sample_id();
      ASSERT_EQ(got.logprobs_size(), static_cast<int>(want.logprobs.size()));
      for (size_t i = 0; i < want.logprobs.size(); ++i) {
        const float g = got.logprobs(static_cast<int>(i));
        EXPECT_EQ(std::memcmp(&g, &want.logprobs[i], sizeof(float)), 0)
            << s.sample_id() << " token " << i << ": " << g << " vs " << want.logprobs[i];
        EXPECT_LT(g, 0.0f);
      }
      EXPECT_EQ(got.finish_reason(), want.reason == model::FinishReason::kStop
                                         ? v1::FINISH_REASON_STOP
                                         : v1::FINISH_REASON_LENGTH);
    }
  }

  service::MetricsRegistry ws_registry_;
  std::unique_ptr<weight_sync::WeightSyncMetrics> ws_metrics_;
  std::unique_ptr<weight_sync::WeightSyncServiceImpl> weight_sync_;
  FakeRegistry registry_;
  std::unique_ptr<service::GrpcServer> backend_;
  std::string backend_address_;
  weight_sync::WeightSyncOptions ws_options_;  // the weight sync SetUp starts
  std::unique_ptr<GenerationWorker> worker_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GenerationService::Stub> stub_;
};

TEST_F(GenerationWorkerTest, NoWeightsYetIsUnavailable) {
  start_worker(config());
  const CallResult r = call(make_request({1}, 7, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(r.status.error_message().find("no weights yet"), std::string::npos);
  const v1::GenerationStatus s = status();
  EXPECT_FALSE(s.ready());
  EXPECT_EQ(s.weight_version(), 0);
}

TEST_F(GenerationWorkerTest, Fp8ResultsMatchModelGenerateBitExactly) {
  start_worker(config());
  auto m = random_model(11);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(worker_->install_weights(set).ok());
  const v1::GenerationStatus s = status();
  EXPECT_TRUE(s.ready());
  EXPECT_EQ(s.weight_version(), 1);
  EXPECT_EQ(s.weight_format(), v1::WEIGHT_FORMAT_FP8);

  v1::GenerateRequest req = make_request({0, 1, 2, 3, 4}, 100, 12);
  req.mutable_sampling()->add_stop_token_ids(7);
  const CallResult r = call(req);
  expect_reference(r, req, set, kFp8Policy, 1);
  // Different seeds and prompts give different samples (the comparison is not trivial).
  std::set<std::vector<int32_t>> distinct;
  for (const auto& [id, result] : r.results) {
    distinct.insert({result.tokens().begin(), result.tokens().end()});
  }
  EXPECT_GT(distinct.size(), 1u);
}

TEST_F(GenerationWorkerTest, Bf16ResultsMatchModelGenerateBitExactly) {
  start_worker(config());
  auto m = random_model(12);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kBF16, 5);
  ASSERT_TRUE(worker_->install_weights(set).ok());
  EXPECT_EQ(status().weight_format(), v1::WEIGHT_FORMAT_BF16);
  const v1::GenerateRequest req = make_request({5, 6, 7}, 9, 10, 0.8f);
  expect_reference(call(req), req, set,
                   testing::policy_of(model::Precision::kBF16, model::KvCacheDtype::kBF16), 5);
  // Greedy too.
  const v1::GenerateRequest greedy = make_request({8}, 1, 6, 0.0f);
  expect_reference(call(greedy), greedy, set,
                   testing::policy_of(model::Precision::kBF16, model::KvCacheDtype::kBF16), 5);
}

TEST_F(GenerationWorkerTest, ConcurrentCallsShareBatchesAndMatchRunningAlone) {
  start_worker(config(/*batch_wait=*/300ms));
  auto m = random_model(13);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(worker_->install_weights(set).ok());
  constexpr int kCalls = 4;
  std::vector<v1::GenerateRequest> reqs;
  for (int c = 0; c < kCalls; ++c)
    reqs.push_back(make_request({3 * c, 3 * c + 1, 3 * c + 2}, 50, 10));
  std::vector<std::future<CallResult>> futures;
  for (int c = 0; c < kCalls; ++c) {
    futures.push_back(std::async(std::launch::async, [&, c] { return call(reqs[c]); }));
  }
  for (int c = 0; c < kCalls; ++c) expect_reference(futures[c].get(), reqs[c], set, kFp8Policy, 1);
  const Scheduler::Snapshot snap = worker_->scheduler().snapshot();
  EXPECT_GT(snap.peak_batch_size, 3) << "samples of different calls never shared a batch";
  // 12 samples x 10 tokens in far fewer steps than running them one after another.
  EXPECT_LT(snap.steps, 12 * 10);
  EXPECT_EQ(snap.generated_tokens, 12u * 10u);
}

TEST_F(GenerationWorkerTest, SwapBetweenBatchesChangesVersionAndResults) {
  start_worker(config());
  auto m1 = random_model(21);
  auto m2 = random_model(22);
  const model::WeightSet v1_set = export_set(*m1, model::WeightFormat::kFP8, 1);
  const model::WeightSet v2_set = export_set(*m2, model::WeightFormat::kFP8, 2);
  ASSERT_TRUE(worker_->install_weights(v1_set).ok());
  const v1::GenerateRequest req = make_request({1, 2}, 5, 8);
  const CallResult before = call(req);
  expect_reference(before, req, v1_set, kFp8Policy, 1);

  // A long request admitted at v1 keeps v1 even though v2 arrives while it runs.
  const v1::GenerateRequest long_req = make_request({3}, 77, 200);
  auto running = std::async(std::launch::async, [&] { return call(long_req); });
  ASSERT_TRUE(eventually([&] { return worker_->scheduler().snapshot().running_samples > 0; }));
  EXPECT_EQ(worker_->scheduler().snapshot().prepared_swaps, 0);
  ASSERT_TRUE(worker_->install_weights(v2_set).ok());
  expect_reference(running.get(), long_req, v1_set, kFp8Policy, 1);
  // v2 waited for that batch to drain, and was announced to the generator meanwhile (on cuda
  // with two weight slots: copied into the idle slot while v1 still served).
  EXPECT_EQ(worker_->scheduler().snapshot().prepared_swaps, 1);

  EXPECT_EQ(status().weight_version(), 2);
  const CallResult after = call(req);
  expect_reference(after, req, v2_set, kFp8Policy, 2);
  EXPECT_NE(std::vector<int32_t>(before.results.at("s1").tokens().begin(),
                                 before.results.at("s1").tokens().end()),
            std::vector<int32_t>(after.results.at("s1").tokens().begin(),
                                 after.results.at("s1").tokens().end()));
  // Older or equal versions are refused.
  const absl::Status stale = worker_->install_weights(v1_set);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_EQ(worker_->scheduler().snapshot().swaps, 2);
}

TEST_F(GenerationWorkerTest, BadRequestsAreInvalidArgumentNamingTheField) {
  start_worker(config());
  auto m = random_model(31);
  ASSERT_TRUE(worker_->install_weights(export_set(*m, model::WeightFormat::kFP8, 3)).ok());
  const v1::GenerateRequest good = make_request({1, 2}, 1, 4);
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"no samples", [](auto& r) { r.clear_samples(); }, "samples"},
      {"empty prompt", [](auto& r) { r.mutable_samples(1)->clear_prompt_tokens(); },
       "samples[1].prompt_tokens"},
      {"token out of vocab", [](auto& r) { r.mutable_samples(0)->set_prompt_tokens(2, 96); },
       "samples[0].prompt_tokens[2]"},
      {"negative token", [](auto& r) { r.mutable_samples(0)->set_prompt_tokens(0, -1); },
       "samples[0].prompt_tokens[0]"},
      {"negative temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1); },
       "sampling.temperature"},
      {"top_p above 1", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }, "sampling.top_p"},
      {"max_new_tokens 0", [](auto& r) { r.mutable_sampling()->set_max_new_tokens(0); },
       "sampling.max_new_tokens"},
      {"stop token out of vocab", [](auto& r) { r.mutable_sampling()->add_stop_token_ids(500); },
       "sampling.stop_token_ids[0]"},
      {"context overflow", [](auto& r) { r.mutable_sampling()->set_max_new_tokens(255); },
       "samples[0].prompt_tokens"},
      {"duplicate id", [](auto& r) { r.mutable_samples(1)->set_sample_id("s1"); },
       "samples[1].sample_id"},
      {"too many samples",
       [](auto& r) {
         for (int i = 0; i < 20; ++i) {
           *r.add_samples() = r.samples(0);
           r.mutable_samples(r.samples_size() - 1)->set_sample_id(absl::StrCat("x", i));
         }
       },
       "samples"},
      {"negative min version", [](auto& r) { r.set_min_weight_version(-1); }, "min_weight_version"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req = good;
    c.mutate(req);
    const CallResult r = call(req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_EQ(r.status.error_message().rfind(c.field, 0), 0u)
        << c.name << ": " << r.status.error_message();
  }
  v1::GenerateRequest newer = good;
  newer.set_min_weight_version(4);
  EXPECT_EQ(call(newer).status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // The worker keeps serving.
  EXPECT_TRUE(call(good).status.ok());
}

TEST_F(GenerationWorkerTest, DeadlineDropsTheCallsSequences) {
  start_worker(config());
  auto m = random_model(41);
  ASSERT_TRUE(worker_->install_weights(export_set(*m, model::WeightFormat::kFP8, 1)).ok());
  // Far more work than fits in the deadline. On a loaded machine a 100 ms deadline can expire
  // before the call reaches the worker at all (the client gives up, the worker never sees it:
  // nothing submitted, nothing cancelled); then the call is made again with a longer deadline.
  const v1::GenerateRequest big = make_request({0, 1, 2, 3, 4, 5, 6, 7}, 3, 110);
  bool reached = false;
  for (const std::chrono::milliseconds deadline : {100ms, 300ms, 900ms}) {
    const CallResult r = call(big, deadline);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    // Reached: its samples were submitted, so all 8 end cancelled; not reached: none ever run.
    reached = eventually(
        [&] {
          const Scheduler::Snapshot s = worker_->scheduler().snapshot();
          return s.cancelled_samples == 8 && s.running_samples == 0 && s.queued_samples == 0;
        },
        2000ms);
    if (reached || worker_->scheduler().snapshot().generated_tokens > 0) break;
  }
  ASSERT_TRUE(reached) << "the call never ended with its 8 samples cancelled";
  const Scheduler::Snapshot s = worker_->scheduler().snapshot();
  EXPECT_LT(s.generated_tokens, 8u * 110u);
  // Every sample was cancelled (queued or running) and gave its KV cache back.
  EXPECT_EQ(s.cancelled_samples, 8);
  EXPECT_EQ(s.kv_cache_usage, 0.0);
  EXPECT_EQ(s.kv_cache_bytes, 0);
  EXPECT_TRUE(call(make_request({1}, 1, 3)).status.ok());
  // The abandoned call counts as cancelled, not as a worker error.
  httplib::Client http("127.0.0.1", worker_->metrics_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << "GET /metrics failed";
  EXPECT_NE(res->body.find("fp8rl_generation_requests_total{status=\"cancelled\"} 1"),
            std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("fp8rl_generation_requests_total{status=\"error\"} 0"),
            std::string::npos);
  EXPECT_NE(res->body.find("fp8rl_generation_requests_total{status=\"ok\"} 1"), std::string::npos);
}

TEST_F(GenerationWorkerTest, CancelledRequestFreesItsSlotsForTheQueue) {
  // KV blocks of 16 tokens, 640 / 16 = 40 in all: a = 4 + 200 tokens = 13 blocks, b = (5 + 200)
  // + (6 + 200) = 13 + 13, c = 7 + 20 = 2: c does not fit beside a and b (41 > 40), so without
  // the cancellation it would wait ~200 steps for them.
  GenerationWorkerConfig cfg = config();
  cfg.scheduler.kv_cache_tokens = 640;
  start_worker(cfg);
  auto m = random_model(52);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(worker_->install_weights(set).ok());
  Scheduler& scheduler = worker_->scheduler();
  const SampleSpec a_spec = sample_spec(1, 200, 11), c_spec = sample_spec(4, 20, 14);
  auto a = scheduler.submit({a_spec}, 0);
  auto b = scheduler.submit({sample_spec(2, 200, 12), sample_spec(3, 200, 13)}, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  // All three decoding (a few steps in) before anything else arrives.
  ASSERT_TRUE(eventually(
      [&] {
        const Scheduler::Snapshot s = scheduler.snapshot();
        return s.running_samples == 3 && s.steps >= 3;
      },
      5000ms, 1ms));
  auto c = scheduler.submit({c_spec}, 0);
  auto d = scheduler.submit({sample_spec(5, 20, 15)}, 0);
  ASSERT_TRUE(c.ok() && d.ok());
  const Scheduler::Snapshot full = scheduler.snapshot();
  ASSERT_EQ(full.running_samples, 3);
  EXPECT_EQ(full.queued_samples, 2);
  EXPECT_DOUBLE_EQ(full.kv_cache_usage, 39.0 / 40.0);
  ASSERT_LT(full.steps, 150) << "a and b must still be far from their end";

  // A request that is only queued leaves the queue at once.
  scheduler.cancel(**d);
  EXPECT_EQ(scheduler.snapshot().queued_samples, 1);
  EXPECT_EQ(scheduler.snapshot().cancelled_samples, 1);
  EXPECT_TRUE((*d)->cancelled());
  EXPECT_TRUE((*d)->done());
  EXPECT_EQ((*d)->status().code(), absl::StatusCode::kCancelled);

  // A running request leaves the batch at the next step; c takes its slots right away.
  scheduler.cancel(**b);
  const int64_t steps_at_cancel = scheduler.snapshot().steps;
  const std::vector<SampleOutcome> c_out = take_all(**c, 20000ms);
  const Scheduler::Snapshot at_c = scheduler.snapshot();
  ASSERT_EQ(c_out.size(), 1u);
  expect_outcome(c_out[0], c_spec, set, kFp8Policy);
  // c is admitted within two steps of the cancellation and needs 20 (its prefill gives the
  // first token); waiting for a and b would have taken until step >= 200.
  EXPECT_LT(at_c.steps, 200) << "cancelled at step " << steps_at_cancel;
  EXPECT_FALSE((*a)->done());
  EXPECT_EQ(at_c.cancelled_samples, 3);
  // The gauges follow at the scheduler's next iteration: a alone holds slots and KV cache.
  ASSERT_TRUE(eventually([&] {
    const Scheduler::Snapshot s = scheduler.snapshot();
    return s.kv_cache_usage == 13.0 / 40.0 && s.running_samples == 1;
  }));
  EXPECT_LT(scheduler.snapshot().kv_cache_bytes, full.kv_cache_bytes / 2);

  // a finishes exactly as it would have alone; b never delivers anything.
  const std::vector<SampleOutcome> a_out = take_all(**a, 20000ms);
  ASSERT_EQ(a_out.size(), 1u);
  expect_outcome(a_out[0], a_spec, set, kFp8Policy);
  EXPECT_TRUE((*b)->take(0ms).empty());
  EXPECT_TRUE((*d)->take(0ms).empty());
  ASSERT_TRUE(eventually([&] { return scheduler.snapshot().running_samples == 0; }));
  const Scheduler::Snapshot end = scheduler.snapshot();
  EXPECT_EQ(end.queued_samples, 0);
  EXPECT_EQ(end.kv_cache_usage, 0.0);
  EXPECT_EQ(end.kv_cache_bytes, 0);
  // a's 200 + c's 20 + what b's two samples had generated before they were cancelled.
  EXPECT_GE(end.generated_tokens, 220u + 2u * 3u);
  EXPECT_LT(end.generated_tokens, 220u + 2u * 150u);
  std::printf("cancelled at step %lld; c finished by step %lld; %llu tokens generated in all\n",
              static_cast<long long>(steps_at_cancel), static_cast<long long>(at_c.steps),
              static_cast<unsigned long long>(end.generated_tokens));
  EXPECT_EQ((*b)->status().code(), absl::StatusCode::kCancelled);
  // Cancelling again, or a finished request, changes nothing.
  scheduler.cancel(**b);
  scheduler.cancel(**a);
  EXPECT_EQ(scheduler.snapshot().cancelled_samples, 3);
  EXPECT_TRUE((*a)->status().ok());
  EXPECT_TRUE((*a)->done());
}

TEST_F(GenerationWorkerTest, ClientCancellationDropsOnlyThatCallsSamples) {
  start_worker(config());
  auto m = random_model(53);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(worker_->install_weights(set).ok());
  const v1::GenerateRequest keep = make_request({6, 7}, 21, 60);
  const v1::GenerateRequest drop = make_request({0, 1, 2, 3}, 22, 200);
  grpc::ClientContext drop_context;
  auto dropped = std::async(std::launch::async, [&] {
    auto reader = stub_->Generate(&drop_context, drop);
    v1::GenerateResponse resp;
    int results = 0;
    while (reader->Read(&resp)) results += resp.results_size();
    EXPECT_EQ(results, 0);
    return reader->Finish();
  });
  ASSERT_TRUE(eventually([&] { return worker_->scheduler().snapshot().running_samples == 4; }));
  auto kept = std::async(std::launch::async, [&] { return call(keep); });
  ASSERT_TRUE(eventually([&] { return worker_->scheduler().snapshot().running_samples == 6; },
                         5000ms, 1ms));
  drop_context.TryCancel();
  EXPECT_EQ(dropped.get().error_code(), grpc::StatusCode::CANCELLED);
  // The server sees the cancellation within its poll interval; the 4 samples leave the batch
  // long before their 200 tokens while the other call runs on, unchanged.
  ASSERT_TRUE(eventually([&] { return worker_->scheduler().snapshot().cancelled_samples == 4; }));
  expect_reference(kept.get(), keep, set, kFp8Policy, 1);
  ASSERT_TRUE(eventually([&] { return worker_->scheduler().snapshot().running_samples == 0; }));
  const Scheduler::Snapshot s = worker_->scheduler().snapshot();
  EXPECT_LT(s.generated_tokens, 2u * 60u + 4u * 200u);
  EXPECT_EQ(s.kv_cache_usage, 0.0);
  EXPECT_EQ(s.queued_samples, 0);
}

TEST_F(GenerationWorkerTest, MetricsEndpointExportsTheDocumentedNames) {
  start_worker(config());
  auto m = random_model(51);
  ASSERT_TRUE(worker_->install_weights(export_set(*m, model::WeightFormat::kFP8, 6)).ok());
  ASSERT_TRUE(call(make_request({1, 2}, 1, 5)).status.ok());
  httplib::Client http("127.0.0.1", worker_->metrics_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << "GET /metrics failed";
  ASSERT_EQ(res->status, 200);
  const std::string& text = res->body;
  for (const char* name : {"fp8rl_build_info{service=\"generation-worker\"} 1",
                           "fp8rl_process_start_time_seconds",
                           "fp8rl_generation_tokens_total{kind=\"generated\"} 10",
                           "fp8rl_generation_tokens_total{kind=\"prompt\"}",
                           "fp8rl_generation_requests_total{status=\"ok\"} 1",
                           "fp8rl_generation_requests_total{status=\"error\"} 0",
                           "fp8rl_generation_queue_depth",
                           "fp8rl_generation_batch_size",
                           "fp8rl_generation_kv_cache_usage_ratio",
                           "fp8rl_generation_kv_cache_bytes",
                           "fp8rl_generation_weight_version 6",
                           "fp8rl_generation_weight_swaps_total 1",
                           "fp8rl_generation_request_seconds_count 1",
                           "fp8rl_generation_request_seconds_bucket",
                           "fp8rl_generation_weight_installs_total{mode=\"in_place\"}",
                           "fp8rl_generation_weight_installs_total{mode=\"rebuilt\"} 1",
                           "fp8rl_generation_weight_delta_versions_total 0",
                           "fp8rl_generation_weight_delta_fallbacks_total 0",
                           "fp8rl_generation_weight_delta_received_bytes_total 0",
                           "fp8rl_generation_weight_delta_decode_seconds_count 0",
                           "fp8rl_generation_weight_install_seconds_count 1",
                           "fp8rl_generation_weight_receive_buffer_bytes"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << "\n" << text;
  }
}

// The value of the series `series` (name plus labels, as written) in Prometheus text, or NaN.
double metric_value(const std::string& text, const std::string& series) {
  const std::string prefix = absl::StrCat("\n", series, " ");
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + prefix.size(), nullptr);
}

// `set` as the next version: its number is `version`, and the low mantissa bit of every 5th code
// of each FP8 tensor is flipped (small codes only, so no NaN code appears): a step's worth of
// change that a delta carries in far fewer bytes than the full version.
model::WeightSet next_version(model::WeightSet set, int64_t version) {
  set.version = version;
  int changed = 0;
  for (model::NamedTensor& t : set.tensors) {
    if (t.dtype != DType::kF8E4M3) continue;
    for (size_t i = 0; i < t.bytes.size(); i += 5) {
      if ((t.bytes[i] & 0x7F) < 0x70) {
        t.bytes[i] ^= 1;
        ++changed;
      }
    }
  }
  EXPECT_GT(changed, 0);
  return set;
}

// Cut-through off: with it, a version whose upload is still arriving when the worker's stream
// looks is pushed full as it arrives (a delta waits for the whole version), which on a loaded
// machine happened to v2 and made the count of delta versions depend on timing.
class GenerationWorkerDeltaTest : public GenerationWorkerTest {
 protected:
  GenerationWorkerDeltaTest() { ws_options_.cut_through = false; }
};

TEST_F(GenerationWorkerDeltaTest, MetricsShowDeltaVersionsAndInstalls) {
  start_worker(config());
  auto m = random_model(71);
  auto ws_channel = grpc::CreateChannel(backend_address_, grpc::InsecureChannelCredentials());
  // v1 arrives full; v2 and v3 as deltas against the version before (the worker holds its bytes).
  model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  for (int64_t version = 1; version <= 3; ++version) {
    if (version > 1) set = next_version(std::move(set), version);
    auto uploaded = weight_sync::upload(ws_channel, set, v1::WEIGHT_FORMAT_FP8);
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    ASSERT_TRUE(eventually([&] { return status().weight_version() == version; }, 10000ms))
        << "version " << version;
  }
  const weight_sync::WeightSubscriber::Stats sub = worker_->subscriber().stats();
  ASSERT_EQ(sub.versions_from_delta, 2) << sub.last_error;
  EXPECT_EQ(sub.delta_fallbacks, 0);
  ASSERT_GT(sub.delta_bytes_received, 0u);
  // The delta is well below the full version's bytes.
  EXPECT_LT(sub.delta_bytes_received, static_cast<uint64_t>(set.nbytes()));
  const WeightDoubleBuffer::Stats buffer = worker_->weight_buffer().stats();
  ASSERT_EQ(buffer.installs, 3);
  ASSERT_GT(buffer.buffer_bytes, 0);

  httplib::Client http("127.0.0.1", worker_->metrics_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << "GET /metrics failed";
  ASSERT_EQ(res->status, 200);
  const std::string& text = res->body;
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_delta_versions_total"), 2) << text;
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_delta_fallbacks_total"), 0) << text;
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_delta_received_bytes_total"),
            static_cast<double>(sub.delta_bytes_received))
      << text;
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_delta_decode_seconds_count"), 2) << text;
  EXPECT_GT(metric_value(text, "fp8rl_generation_weight_delta_decode_seconds_sum"), 0) << text;
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_install_seconds_count"), 3) << text;
  EXPECT_GT(metric_value(text, "fp8rl_generation_weight_install_seconds_sum"), 0) << text;
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_installs_total{mode=\"in_place\"}"),
            static_cast<double>(buffer.in_place_installs))
      << text;
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_installs_total{mode=\"rebuilt\"}"),
            static_cast<double>(buffer.installs - buffer.in_place_installs))
      << text;
  // The first two versions build one model per slot; the third reuses the idle slot's model.
  EXPECT_EQ(buffer.installs - buffer.in_place_installs, 2);
  EXPECT_EQ(metric_value(text, "fp8rl_generation_weight_receive_buffer_bytes"),
            static_cast<double>(buffer.buffer_bytes))
      << text;
}

// Long mixture-of-experts samples: three 4.5 MB routing records (each over gRPC's 4 MB default)
// go out in order, as many per message as the byte budget allows, every message within it
// (or a lone sample), and decode to the records sent.
TEST(ResultMessages, SplitsFinishedSamplesUnderTheByteBudget) {
  std::vector<std::vector<int32_t>> records(3);
  std::vector<SampleOutcome> ready(3);
  for (size_t i = 0; i < ready.size(); ++i) {
    ready[i].sample_id = absl::StrCat("s", i);
    ready[i].tokens = {5, 6, 7};
    ready[i].logprobs = {-0.5f, -1.5f};
    for (int32_t v = 0; v < 3'000'000; ++v) records[i].push_back((v * 37 + int32_t(i)) % 256);
    ready[i].routing = records[i];
  }
  auto check = [&](size_t budget, size_t want_messages) {
    std::vector<SampleOutcome> copy = ready;
    const std::vector<v1::GenerateResponse> out = result_messages(copy, budget);
    ASSERT_EQ(out.size(), want_messages) << budget;
    size_t next = 0;
    for (const v1::GenerateResponse& m : out) {
      EXPECT_TRUE(m.ByteSizeLong() <= budget || m.results_size() == 1) << m.ByteSizeLong();
      EXPECT_GT(m.ByteSizeLong(), size_t{4} << 20);
      v1::GenerateResponse decoded;
      ASSERT_TRUE(decoded.ParseFromString(m.SerializeAsString()));
      for (const v1::SampleResult& r : decoded.results()) {
        ASSERT_LT(next, records.size());
        EXPECT_EQ(r.sample_id(), absl::StrCat("s", next));
        EXPECT_TRUE(std::equal(r.routed_experts().begin(), r.routed_experts().end(),
                               records[next].begin(), records[next].end()));
        ++next;
      }
    }
    EXPECT_EQ(next, records.size());
  };
  check(service::kDataPathMessageBytes, 1);  // all three in one message
  check(size_t{8} << 20, 3);                 // ~4.3 MiB each: one per message
  check(size_t{1} << 20, 3);                 // each alone over the budget: still sent, alone
}

TEST(WeightPathRecorder, CountsGrowthAndTakesAShrinkAsANewBaseline) {
  service::MetricsRegistry registry;
  auto metrics = GenerationMetrics::create(&registry);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  GenerationMetrics& g = **metrics;
  WeightPathRecorder recorder(&g);
  WeightPathCounts c;
  c.installs = 3;
  c.in_place_installs = 1;
  c.delta_versions = 1;
  c.delta_fallbacks = 2;
  c.delta_bytes = 1000;
  c.last_delta_seconds = 0.25;
  c.receive_buffer_bytes = 4096;
  recorder.record(c);
  recorder.record(c);  // nothing new: no change, no second decode observation
  EXPECT_EQ(g.weight_installs->with({"in_place"}).value(), 1);
  EXPECT_EQ(g.weight_installs->with({"rebuilt"}).value(), 2);
  EXPECT_EQ(g.weight_delta_versions->get().value(), 1);
  EXPECT_EQ(g.weight_delta_fallbacks->get().value(), 2);
  EXPECT_EQ(g.weight_delta_received_bytes->get().value(), 1000);
  EXPECT_EQ(g.weight_delta_decode_seconds->get().snapshot().count, 1u);
  EXPECT_EQ(g.weight_delta_decode_seconds->get().snapshot().sum, 0.25);
  EXPECT_EQ(g.weight_receive_buffer_bytes->get().value(), 4096);

  c.installs = 4;
  c.in_place_installs = 2;
  c.delta_versions = 2;
  c.delta_bytes = 1500;
  c.last_delta_seconds = 0.5;
  c.receive_buffer_bytes = 8192;
  recorder.record(c);
  EXPECT_EQ(g.weight_installs->with({"in_place"}).value(), 2);
  EXPECT_EQ(g.weight_installs->with({"rebuilt"}).value(), 2);
  EXPECT_EQ(g.weight_delta_versions->get().value(), 2);
  EXPECT_EQ(g.weight_delta_received_bytes->get().value(), 1500);
  EXPECT_EQ(g.weight_delta_decode_seconds->get().snapshot().count, 2u);
  EXPECT_EQ(g.weight_delta_decode_seconds->get().snapshot().sum, 0.75);
  EXPECT_EQ(g.weight_receive_buffer_bytes->get().value(), 8192);

  // Totals that start over (a new subscriber) are the new baseline; growth after it counts.
  WeightPathCounts restarted = c;
  restarted.delta_versions = 0;
  restarted.delta_bytes = 0;
  recorder.record(restarted);
  EXPECT_EQ(g.weight_delta_versions->get().value(), 2);
  restarted.delta_versions = 1;
  restarted.delta_bytes = 300;
  recorder.record(restarted);
  EXPECT_EQ(g.weight_delta_versions->get().value(), 3);
  EXPECT_EQ(g.weight_delta_received_bytes->get().value(), 1800);
}

TEST_F(GenerationWorkerTest, WeightSyncPushesVersionsThatAreServedAndAcked) {
  start_worker(config());
  auto m = random_model(61);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  auto ws_channel = grpc::CreateChannel(backend_address_, grpc::InsecureChannelCredentials());
  auto uploaded = weight_sync::upload(ws_channel, set, v1::WEIGHT_FORMAT_FP8);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  ASSERT_TRUE(eventually([&] { return status().weight_version() == 1; }, 10000ms));
  const v1::GenerateRequest req = make_request({2, 9}, 4, 9);
  expect_reference(call(req), req, set, kFp8Policy, 1);
  // The weight-sync service recorded the ack under the worker's name.
  ASSERT_TRUE(eventually([&] {
    for (const weight_sync::WorkerState& w : weight_sync_->workers().snapshot()) {
      if (w.worker_id == "gen-test" && w.version == 1) return true;
    }
    return false;
  }));
  EXPECT_EQ(worker_->subscriber().stats().versions_loaded, 1);

  // A BF16 v2 follows; results switch to it.
  auto m2 = random_model(62);
  const model::WeightSet set2 = export_set(*m2, model::WeightFormat::kBF16, 2);
  ASSERT_TRUE(weight_sync::upload(ws_channel, set2, v1::WEIGHT_FORMAT_BF16).ok());
  ASSERT_TRUE(eventually([&] { return status().weight_version() == 2; }, 10000ms));
  expect_reference(call(req), req, set2,
                   testing::policy_of(model::Precision::kBF16, model::KvCacheDtype::kBF16), 2);
  EXPECT_EQ(status().weight_format(), v1::WEIGHT_FORMAT_BF16);
}

// --weight-relay on behind weight sync's --fanout chain (docs/design/weight-sync-fanout.md): three
// real workers, each placed behind the one before; weight sync streams the version once and the
// last worker, two relays away, serves it with results equal to the reference bit for bit.
TEST_F(GenerationWorkerTest, WorkersBehindRelaysServeTheVersionWeightSyncSentOnce) {
  weight_sync::WeightSyncOptions options;
  options.fanout = weight_sync::parse_fanout("chain").value();
  options.poll_interval = 20ms;
  service::MetricsRegistry chain_registry;
  auto chain_metrics = weight_sync::WeightSyncMetrics::create(&chain_registry).value();
  weight_sync::WeightSyncServiceImpl chain_sync(options, chain_metrics.get());
  auto chain_server = service::GrpcServer::start({.address = "127.0.0.1:0"}, {&chain_sync});
  ASSERT_TRUE(chain_server.ok()) << chain_server.status();
  const std::string chain_address = absl::StrCat("127.0.0.1:", (*chain_server)->port());
  std::vector<std::unique_ptr<GenerationWorker>> workers;
  for (int i = 0; i < 3; ++i) {
    GenerationWorkerConfig c = config();
    c.weight_sync = chain_address;
    c.worker_id = absl::StrCat("relay-", i);
    c.weight_relay = true;
    auto w = GenerationWorker::start(c);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_NE((*w)->relay(), nullptr);
    workers.push_back(std::move(*w));
    const size_t placed = static_cast<size_t>(i + 1);
    ASSERT_TRUE(eventually([&] { return chain_sync.relay_topology().order().size() == placed; }));
  }
  auto m = random_model(71);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  auto ws_channel = grpc::CreateChannel(chain_address, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(weight_sync::upload(ws_channel, set, v1::WEIGHT_FORMAT_FP8).ok());
  for (auto& w : workers) {
    ASSERT_TRUE(eventually([&] { return w->scheduler().snapshot().weight_version == 1; }, 20000ms))
        << w->name();
  }
  EXPECT_EQ(chain_metrics->sent_bytes->get().value(), static_cast<double>(set.nbytes()));
  EXPECT_EQ(workers[0]->subscriber().stats().relay_redirects, 0);
  EXPECT_GE(workers[2]->subscriber().stats().relay_redirects, 1);
  // Each relay's counters are on its worker's /metrics as fp8rl_worker_relay_*: the first relay
  // streamed the whole version to the second, the last one (nobody behind it) sent nothing.
  auto relay_metrics = [](const GenerationWorker& w) {
    httplib::Client http("127.0.0.1", w.metrics_port());
    auto res = http.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  };
  const std::string first = relay_metrics(*workers[0]), last = relay_metrics(*workers[2]);
  EXPECT_NE(first.find(absl::StrCat("fp8rl_worker_relay_sent_bytes_total ", set.nbytes())),
            std::string::npos)
      << first;
  EXPECT_NE(first.find("fp8rl_worker_relay_latest_version 1"), std::string::npos) << first;
  EXPECT_NE(last.find("fp8rl_worker_relay_sent_bytes_total 0"), std::string::npos) << last;
  EXPECT_EQ(first.find("fp8rl_weight_sync_"), std::string::npos) << first;
  EXPECT_EQ(first.find("fp8rl_build_info{service=\"weight-sync\"}"), std::string::npos) << first;
  channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", workers[2]->grpc_port()),
                                 grpc::InsecureChannelCredentials());
  stub_ = v1::GenerationService::NewStub(channel_);
  const v1::GenerateRequest req = make_request({3, 8}, 5, 9);
  expect_reference(call(req), req, set, kFp8Policy, 1);
  for (auto it = workers.rbegin(); it != workers.rend(); ++it) (*it)->shutdown(0ms);
  chain_sync.begin_shutdown();
  (*chain_server)->shutdown(0ms);
}

TEST_F(GenerationWorkerTest, RegistersHeartbeatsReregistersAndDeregisters) {
  start_worker(config());
  ASSERT_TRUE(eventually([&] { return !worker_->registration().worker_id().empty(); }));
  {
    std::lock_guard lock(registry_.mu);
    ASSERT_EQ(registry_.registers.size(), 1u);
    const v1::RegisterWorkerRequest& r = registry_.registers[0];
    EXPECT_EQ(r.kind(), v1::WORKER_KIND_GENERATION);
    EXPECT_EQ(r.name(), "gen-test");
    EXPECT_EQ(r.address(), absl::StrCat("127.0.0.1:", worker_->grpc_port()));
    EXPECT_EQ(r.metrics_address(), absl::StrCat("127.0.0.1:", worker_->metrics_port()));
  }
  EXPECT_EQ(status().worker_id(), "gen-test#1");
  auto m = random_model(71);
  ASSERT_TRUE(worker_->install_weights(export_set(*m, model::WeightFormat::kFP8, 3)).ok());
  // Heartbeats carry the held version.
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(registry_.mu);
    return !registry_.heartbeats.empty() && registry_.heartbeats.back().weight_version() == 3 &&
           registry_.heartbeats.back().worker_id() == "gen-test#1";
  }));
  // The coordinator forgot us (restart): the worker registers again.
  registry_.reregister = true;
  ASSERT_TRUE(eventually([&] { return worker_->registration().worker_id() == "gen-test#2"; }));
  {
    std::lock_guard lock(registry_.mu);
    EXPECT_EQ(registry_.registers.back().weight_version(), 3);
  }
  worker_->shutdown(1000ms);
  std::lock_guard lock(registry_.mu);
  ASSERT_EQ(registry_.deregistered.size(), 1u);
  EXPECT_EQ(registry_.deregistered[0], "gen-test#2");
}

TEST_F(GenerationWorkerTest, ShutdownDrainsInFlightWorkWithinTheGrace) {
  start_worker(config());
  auto m = random_model(81);
  const model::WeightSet set = export_set(*m, model::WeightFormat::kFP8, 1);
  ASSERT_TRUE(worker_->install_weights(set).ok());
  const v1::GenerateRequest req = make_request({4, 5}, 8, 60);
  auto running = std::async(std::launch::async, [&] { return call(req); });
  ASSERT_TRUE(eventually([&] { return worker_->scheduler().snapshot().running_samples > 0; }));
  worker_->shutdown(10000ms);
  expect_reference(running.get(), req, set, kFp8Policy, 1);
}

TEST_F(GenerationWorkerTest, ShutdownPastTheGraceCancelsInFlightWork) {
  start_worker(config());
  auto m = random_model(82);
  ASSERT_TRUE(worker_->install_weights(export_set(*m, model::WeightFormat::kFP8, 1)).ok());
  const v1::GenerateRequest req = make_request({0, 1, 2, 3, 4, 5, 6, 7}, 8, 110);
  auto running = std::async(std::launch::async, [&] { return call(req); });
  ASSERT_TRUE(eventually([&] { return worker_->scheduler().snapshot().running_samples > 0; }));
  const auto start = std::chrono::steady_clock::now();
  worker_->shutdown(0ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  const CallResult r = running.get();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
}

}  // namespace
}  // namespace fp8rl::generation
