// The generation worker's weight double buffer with the real scheduler: versions written in place
// into the idle slot while continuous batching runs on the other never mix in one request and
// match a freshly loaded model bit for bit, and 100 versions received in place keep the worker's
// memory flat.
#include "services/generation_worker/weight_double_buffer.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "services/generation_worker/scheduler.h"
#include "services/weight_sync/payload.h"
#include "tests/unit/generation_worker/test_util.h"

// Under AddressSanitizer malloc is ASan's own allocator: mallinfo2 reads zeros and freed blocks
// stay resident in its quarantine (up to 256 MB), so the heap is read from ASan's counter and the
// resident-set bound does not apply (scripts/sanitize.sh).
#if defined(__SANITIZE_ADDRESS__)
#define FP8RL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FP8RL_TEST_ASAN 1
#endif
#endif
#ifdef FP8RL_TEST_ASAN
#include <sanitizer/allocator_interface.h>
#endif

namespace fp8rl::generation {
namespace {

using namespace std::chrono_literals;
using testing::export_set;
using testing::prompt_for;
using testing::random_model;
using testing::reference;

const model::PrecisionPolicy kFp8Policy =
    testing::policy_of(model::Precision::kFP8, model::KvCacheDtype::kBF16);

template <typename F>
bool eventually(F done, std::chrono::milliseconds timeout = 10000ms) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return done();
}

// What GenerationWorker::install_view does: install into the idle slot, swap at the next batch
// boundary, mark the slot serving.
absl::Status install(WeightDoubleBuffer& buffer, Scheduler& scheduler,
                     const model::WeightView& view) {
  absl::StatusOr<LoadedWeights> loaded = buffer.install(view);
  if (!loaded.ok()) return loaded.status();
  const model::Model* served = loaded->model.get();
  if (absl::Status s = scheduler.install(std::move(*loaded)); !s.ok()) return s;
  buffer.served(served);
  return absl::OkStatus();
}

absl::Status install(WeightDoubleBuffer& buffer, Scheduler& scheduler,
                     const model::WeightSet& set) {
  absl::StatusOr<model::WeightView> view = model::view_of(set);
  if (!view.ok()) return view.status();
  return install(buffer, scheduler, *view);
}

std::shared_ptr<GenerationRequest> submit(Scheduler& scheduler, std::vector<int> prompts,
                                          int max_new_tokens, int64_t min_version = 0) {
  std::vector<SampleSpec> samples;
  for (int n : prompts) {
    SampleSpec s;
    s.sample_id = std::to_string(n);
    s.prompt = prompt_for(n);
    s.params.temperature = 1.0f;
    s.params.max_new_tokens = max_new_tokens;
    s.params.seed = 1000 + static_cast<uint64_t>(n);
    samples.push_back(std::move(s));
  }
  auto r = scheduler.submit(std::move(samples), min_version);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : nullptr;
}

std::vector<SampleOutcome> take_all(GenerationRequest& r, size_t n) {
  std::vector<SampleOutcome> out;
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (out.size() < n && std::chrono::steady_clock::now() < end) {
    for (auto& o : r.take(100ms)) out.push_back(std::move(o));
    if (!r.status().ok()) break;
  }
  EXPECT_TRUE(r.status().ok()) << r.status();
  EXPECT_EQ(out.size(), n);
  return out;
}

// Every sample was served entirely at `version` and equals model::generate on a model freshly
// loaded from that version's set (tokens and logprobs bit for bit).
void expect_version(const std::vector<SampleOutcome>& got,
                    const std::map<int64_t, model::WeightSet>& sets, int64_t version,
                    int max_new_tokens) {
  for (const SampleOutcome& o : got) {
    SCOPED_TRACE("sample " + o.sample_id);
    EXPECT_EQ(o.weight_version, version);
    model::SamplingParams params;
    params.temperature = 1.0f;
    params.max_new_tokens = max_new_tokens;
    const int n = std::stoi(o.sample_id);
    const model::GenerationResult want =
        reference(sets.at(version), kFp8Policy, prompt_for(n), params, 1000 + n);
    EXPECT_EQ(o.tokens, want.tokens);
    ASSERT_EQ(o.logprobs.size(), want.logprobs.size());
    EXPECT_EQ(0, std::memcmp(o.logprobs.data(), want.logprobs.data(),
                             want.logprobs.size() * sizeof(float)));
  }
}

TEST(WeightDoubleBufferTest, VersionsSwappedMidStreamNeverMixAndSlotsAreReusedInPlace) {
  std::map<int64_t, model::WeightSet> sets;
  for (int64_t v = 1; v <= 4; ++v) {
    sets[v] =
        export_set(*random_model(40 + static_cast<uint64_t>(v)), model::WeightFormat::kFP8, v);
  }
  WeightDoubleBuffer buffer(PrecisionOverrides{});
  SchedulerOptions options;
  options.batch_wait = 0ms;
  Scheduler scheduler(options, nullptr);
  ASSERT_TRUE(install(buffer, scheduler, sets[1]).ok());

  std::map<int64_t, std::vector<SampleOutcome>> results;  // by the version they must have
  const int kLong = 200, kShort = 10;
  for (int64_t next = 2; next <= 4; ++next) {
    // A long request runs at next-1; next arrives mid-stream and is written into the idle slot
    // (in place from version 3 on, over the model of next-2) while the batch keeps decoding.
    auto running = submit(scheduler, {static_cast<int>(next), static_cast<int>(next) + 10}, kLong);
    ASSERT_TRUE(eventually([&] { return scheduler.snapshot().running_samples == 2; }));
    auto installing =
        std::async(std::launch::async, [&] { return install(buffer, scheduler, sets[next]); });
    ASSERT_TRUE(eventually([&] { return buffer.stats().installs == next; }));
    // The idle slot was written while the batch kept decoding at next-1: still running, or on a
    // loaded machine already through its tokens (each token's version is checked below).
    EXPECT_TRUE(scheduler.snapshot().running_samples == 2 || running->done());
    // Submitted around the swap: admitted at next-1 or queued behind the swap, but one version
    // from its first token to its last.
    auto around = submit(scheduler, {static_cast<int>(next) + 20}, kShort);
    ASSERT_TRUE(installing.get().ok());
    expect_version(take_all(*running, 2), sets, next - 1, kLong);
    const std::vector<SampleOutcome> got = take_all(*around, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(got[0].weight_version == next - 1 || got[0].weight_version == next);
    expect_version(got, sets, got[0].weight_version, kShort);
    // Queued after the swap: the new version.
    auto after = submit(scheduler, {static_cast<int>(next) + 30}, kShort);
    expect_version(take_all(*after, 1), sets, next, kShort);
  }
  const WeightDoubleBuffer::Stats stats = buffer.stats();
  EXPECT_EQ(stats.models_built, 2);
  EXPECT_EQ(stats.in_place_installs, 2);
  EXPECT_EQ(scheduler.snapshot().weight_version, 4);
  scheduler.shutdown(0ms);
}

int64_t heap_in_use() {
#ifdef FP8RL_TEST_ASAN
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
#endif
}

int64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Memory is measured two ways: the allocator's bytes in use (mallinfo2: arena + mmapped chunks,
// exact and immune to pages the allocator keeps cached) and the resident set. A version leaked or
// rebuilt per install would add ~6 MB (this model's storage) to both, 100 times.
TEST(WeightDoubleBufferTest, MemoryStaysFlatAcross100VersionsReceivedInPlace) {
  model::ModelConfig config = testing::tiny_config();
  config.vocab_size = 4000;  // a 1.3 MB payload, 6 MB of model storage per slot
  std::vector<model::WeightSet> contents;
  for (uint64_t seed : {7, 8}) {
    auto m = model::Model::Init(config, kFp8Policy, seed, 0.2f);
    ASSERT_TRUE(m.ok()) << m.status();
    contents.push_back(export_set(**m, model::WeightFormat::kFP8, 1));
  }
  WeightDoubleBuffer buffer(PrecisionOverrides{});
  SchedulerOptions options;
  options.batch_wait = 0ms;
  Scheduler scheduler(options, nullptr);
  weight_sync::PayloadAssembler assembler;
  int64_t heap_after_warmup = 0, rss_after_warmup = 0;
  constexpr uint64_t kChunk = 256 << 10;
  for (int64_t v = 1; v <= 100; ++v) {
    model::WeightSet& set = contents[v % 2];
    set.version = v;
    auto manifest = weight_sync::build_manifest(set, v1::WEIGHT_FORMAT_FP8);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    auto target = buffer.receive_target(manifest->total_bytes());
    ASSERT_TRUE(target.ok()) << target.status();
    ASSERT_TRUE(assembler.begin_into(*manifest, *target).ok());
    ASSERT_TRUE(
        weight_sync::for_each_chunk(set, kChunk, [&](uint64_t offset, std::string_view data) {
          v1::WeightChunk chunk;
          chunk.set_version(v);
          chunk.set_offset(offset);
          chunk.set_data(std::string(data));
          return assembler.add(chunk);
        }).ok());
    auto done = assembler.finish();
    ASSERT_TRUE(done.ok()) << done.status();
    auto view =
        weight_sync::to_weight_view(done->manifest, target->first(done->manifest.total_bytes()));
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE(install(buffer, scheduler, *view).ok()) << "version " << v;
    if (v == 3) {
      heap_after_warmup = heap_in_use();
      rss_after_warmup = rss_bytes();
    }
  }
  const int64_t heap_growth = heap_in_use() - heap_after_warmup;
  const int64_t rss_growth = rss_bytes() - rss_after_warmup;
  std::printf("versions 3..100: heap in use %+lld bytes, RSS %+lld bytes\n",
              static_cast<long long>(heap_growth), static_cast<long long>(rss_growth));
  EXPECT_LT(heap_growth, 256 << 10);
#ifndef FP8RL_TEST_ASAN
  EXPECT_LT(rss_growth, 4 << 20);
#endif
  const WeightDoubleBuffer::Stats stats = buffer.stats();
  EXPECT_EQ(stats.installs, 100);
  EXPECT_EQ(stats.models_built, 2);
  EXPECT_EQ(stats.in_place_installs, 98);
  EXPECT_EQ(stats.buffer_allocations, 2);
  // The 100th version, written in place for the 49th time into its slot, serves exactly what a
  // fresh load of it does.
  auto r = submit(scheduler, {3, 4}, 12);
  const std::vector<SampleOutcome> got = take_all(*r, 2);
  std::map<int64_t, model::WeightSet> sets;
  sets[100] = contents[0];
  expect_version(got, sets, 100, 12);
  scheduler.shutdown(0ms);
}

}  // namespace
}  // namespace fp8rl::generation
