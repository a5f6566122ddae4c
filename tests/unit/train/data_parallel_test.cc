// Trainer groups in one process (docs/design/training.md "Trainer groups"): the token-balanced
// share split, Gloo collectives over loopback (results, bit-identical ranks, a rank that never
// joins or never reduces is named / timed out), and the learner's data-parallel SFT and GRPO
// updates against one trainer running the same requests from the same seed; the bucketed all-reduce
// that overlaps the backward against one all-reduce after it.
//
// Tolerances, group vs one trainer (named below, per training precision):
//  - BF16 training: a group changes only the order in which float32 per-token gradient terms are
//    summed (each rank sums its share, then the ranks' sums are added). For an element summing n
//    terms the difference is about n u sum|terms| (u = 2^-24): <= 1e-5 relative for the n <= 64
//    tokens of a minibatch unless the element nearly cancels. AdamW maps a relative gradient error
//    to the same relative update error wherever |g| >> eps (1e-8) and rounding noise stays far
//    below eps where g nearly cancels, so the weight change differs by ~1e-5 relative after a few
//    updates: kBf16.weight_change = 1e-3 (measured: 2e-6 after SFT, 1e-5 after step 3), and
//    the metrics (sums of the same terms) agree to kBf16.metric = 1e-4 relative.
//  - FP8 training additionally quantizes the backward's operands in blocks that run along the
//    token dimension (docs/design/fp8-recipe.md "The FP8 recipe"); a rank's share puts different
//    tokens in a block, so block scales, and with them the E4M3 rounding (<= 2^-4 relative per
//    operand, two operands per product), differ between the runs: up to 2 x 2 x 2^-4 = 25% per
//    gradient element in the worst case, far less on average. kFp8.weight_change = 0.25 (measured:
//    0.12 after the SFT updates, 0.06 after step 3); metrics within kFp8.metric = 5e-2 (measured <=
//    1e-2).
//  - Both: every element within 2 lr per update (the most an AdamW step moves it; measured FP8:
//    0.008 after 14 updates at lr 1e-3).
// A group that lost a rank's gradient, or normalized by the share's tokens instead of the
// minibatch's, moves loss and grad_norm by tens of percent: outside both tolerances.
#include "train/data_parallel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "engine/cpu/train_ops.h"
#include "model/model.h"
#include "model/rng.h"
#include "tests/unit/train/group_util.h"
#include "tests/unit/train/tiny_model.h"
#include "train/checkpoint.h"
#include "train/collectives.h"
#include "train/collectives_bucketed.h"
#include "train/device_train_backend.h"
#include "train/learner.h"
#include "train/memory_plan.h"
#include "train/optimizer_shards.h"
#include "train/unit_gather.h"

namespace fp8rl::train {
namespace {

using test_group::group_options;
using test_group::make_group;
using test_group::on_ranks;
using test_model::kVocab;
using test_model::tiny_config;
struct Tolerance {
  double weight_change;  // ||w_group - w_alone|| / ||w_alone - w_initial|| after each step
  double metric;         // relative (absolute below 1) for loss, grad_norm, KL, ...
};
constexpr Tolerance kBf16{1e-3, 1e-4};
constexpr Tolerance kFp8{0.25, 5e-2};
constexpr double kLr = 1e-3;
// Optimizer steps: the SFT request's, then each GRPO request's (minibatches x epochs).
constexpr int kSftUpdates = 2, kGrpoUpdates = 4;

TEST(TokenBalancedShares, ContiguousCoveringAndBalanced) {
  const std::vector<int64_t> lengths = {10, 10, 40, 10, 10, 10, 10};  // 100 tokens
  const std::vector<int64_t> two = token_balanced_shares(lengths, 2);
  // Midpoints 5, 15, 40, 65, ...: the long sequence's midpoint (40) is below 50, so rank 0 takes
  // the first three (60 tokens), rank 1 the rest (40).
  EXPECT_EQ(two, (std::vector<int64_t>{0, 3, 7}));
  const std::vector<int64_t> one = token_balanced_shares(lengths, 1);
  EXPECT_EQ(one, (std::vector<int64_t>{0, 7}));
  // More ranks than sequences: every sequence is taken once, some ranks get none.
  const std::vector<int64_t> small = {5, 7};
  const std::vector<int64_t> four = token_balanced_shares(small, 4);
  ASSERT_EQ(four.size(), 5u);
  EXPECT_EQ(four.front(), 0);
  EXPECT_EQ(four.back(), 2);
  for (size_t r = 1; r < four.size(); ++r) EXPECT_LE(four[r - 1], four[r]);
  // Equal lengths split evenly.
  const std::vector<int64_t> even(9, 4);
  EXPECT_EQ(token_balanced_shares(even, 3), (std::vector<int64_t>{0, 3, 6, 9}));
}

TEST(GlooCollectives, AllReduceSumMinMaxBitIdenticalOnEveryRank) {
  constexpr int kSize = 3;
  auto groups = make_group(kSize, "reduce");
  ASSERT_TRUE(groups[0] && groups[1] && groups[2]);
  // Rank r's data: random floats from seed r (non-zero, mixed signs), 3000 elements so the ring
  // splits them into several chunks.
  auto data_of = [](int r) {
    std::mt19937 gen(100 + r);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    std::vector<float> v(3000);
    for (float& x : v) x = d(gen);
    return v;
  };
  auto results = on_ranks(kSize, [&](int r) {
    std::vector<float> sum = data_of(r), mn = data_of(r), mx = data_of(r);
    std::vector<int64_t> ids = {r + 1, 10 * (r + 1)};
    EXPECT_TRUE(groups[r]->all_reduce(std::span<float>(sum), ReduceOp::kSum, "sum").ok());
    EXPECT_TRUE(groups[r]->all_reduce(std::span<float>(mn), ReduceOp::kMin, "min").ok());
    EXPECT_TRUE(groups[r]->all_reduce(std::span<float>(mx), ReduceOp::kMax, "max").ok());
    EXPECT_TRUE(groups[r]->all_reduce(std::span<int64_t>(ids), ReduceOp::kSum, "ids").ok());
    EXPECT_EQ(ids, (std::vector<int64_t>{6, 60}));
    return std::vector<std::vector<float>>{sum, mn, mx};
  });
  const auto a = data_of(0), b = data_of(1), c = data_of(2);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(results[0][0][i], a[i] + b[i] + c[i], 1e-5f);
    EXPECT_EQ(results[0][1][i], std::min({a[i], b[i], c[i]}));
    EXPECT_EQ(results[0][2][i], std::max({a[i], b[i], c[i]}));
  }
  // Every rank holds the same bits.
  for (int r = 1; r < kSize; ++r) {
    for (int op = 0; op < 3; ++op) {
      EXPECT_EQ(0, std::memcmp(results[r][op].data(), results[0][op].data(), a.size() * 4));
    }
  }
  const CollectiveStats stats = groups[0]->stats();
  EXPECT_EQ(stats.calls, 4);
  EXPECT_EQ(stats.bytes, 3 * 3000 * 4 + 2 * 8);
}

TEST(GlooCollectives, RankThatNeverJoinsIsNamed) {
  auto store = make_memory_store();
  absl::StatusOr<std::unique_ptr<Collectives>> g =
      make_gloo_collectives(store, group_options(0, 2, "lonely", 500));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDeadlineExceeded) << g.status();
  EXPECT_NE(g.status().message().find("rank(s) 1"), std::string::npos) << g.status();
}

TEST(GlooCollectives, HungPeerTimesOutAndTheGroupRefusesLaterCalls) {
  auto groups = make_group(2, "hung", 800);
  ASSERT_TRUE(groups[0] && groups[1]);
  std::vector<float> v(100, 1.0f);
  // Rank 1 never takes part.
  const absl::Status s = groups[0]->all_reduce(std::span<float>(v), ReduceOp::kSum, "grads");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("grads failed on rank 0 of 2"), std::string::npos) << s;
  EXPECT_EQ(groups[0]->all_reduce(std::span<float>(v), ReduceOp::kSum, "again").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CollectiveBackend, ChosenByTheTrainersDevice) {
  EXPECT_EQ(backend_for_device("cpu").value(), CollectiveBackend::kGloo);
  EXPECT_EQ(backend_for_device("cuda").value(), CollectiveBackend::kNccl);
  EXPECT_EQ(backend_for_device("cuda:3").value(), CollectiveBackend::kNccl);
  EXPECT_EQ(backend_name(CollectiveBackend::kGloo), "gloo");
  EXPECT_EQ(backend_name(CollectiveBackend::kNccl), "nccl");
  for (const char* bad : {"", "gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cpu:0"}) {
    const absl::StatusOr<CollectiveBackend> b = backend_for_device(bad, "--device");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find(absl::StrCat("--device: must be cpu, cuda or cuda:<index>, "
                                                     "got '",
                                                     bad, "'")),
              std::string::npos)
        << b.status();
  }
}

TEST(GlooCollectives, BadRankIsInvalidArgument) {
  auto store = make_memory_store();
  EXPECT_EQ(make_gloo_collectives(store, group_options(2, 2, "x")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(make_gloo_collectives(store, group_options(0, 0, "x")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

InitRequest init_request(Precision training, uint64_t seed = 7,
                         const model::ModelConfig& config = tiny_config()) {
  InitRequest r;
  r.job_id = "job-dp";
  r.model_config_json = model::model_config_to_json(config);
  r.seed = seed;
  r.precision.training = training;
  r.precision.generation = Precision::kFP8;
  r.precision.kv_cache = Precision::kFP8;
  r.adamw.lr = kLr;
  r.adamw.max_grad_norm = 1.0;
  r.keep_reference = true;
  return r;
}

// `n` sequences of different lengths (3-token prompt, 2..12 response tokens), random tokens,
// advantages of both signs, gen logprobs in [-4, -0.5], a few masked-out response tokens.
std::vector<Sequence> random_batch(uint64_t seed, int n) {
  model::Rng rng(seed);
  std::vector<Sequence> out(n);
  for (int i = 0; i < n; ++i) {
    const int resp = 2 + static_cast<int>(rng.next() % 11);
    for (int t = 0; t < 3 + resp; ++t) {
      out[i].tokens.push_back(static_cast<int32_t>(rng.next() % kVocab));
    }
    out[i].prompt_length = 3;
    out[i].advantage = static_cast<float>(rng.uniform() * 2.0 - 1.0);
    for (int t = 0; t < resp; ++t) {
      out[i].gen_logprobs.push_back(static_cast<float>(-0.5 - 3.5 * rng.uniform()));
      out[i].loss_mask.push_back(rng.next() % 7 == 0 ? 0.0f : 1.0f);
    }
  }
  return out;
}

GrpoRequest grpo(uint64_t seed) {
  GrpoRequest r;
  r.batch = random_batch(seed, 9);
  r.loss.clip_eps = 0.2;
  r.loss.kl_beta = 0.05;
  r.loss.is.rule = rl::IsRule::kTis;
  r.minibatches = 2;
  r.epochs = 2;
  return r;
}

// The whole fp32 master of `l` (a collective when sharded: every rank of the group calls it).
std::vector<float> master_of(const Learner& l) {
  absl::StatusOr<std::vector<float>> m = l.whole_master("test");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : std::vector<float>();
}

struct RunOutcome {
  std::vector<float> initial;
  std::vector<std::vector<float>> weights;  // after each step
  std::vector<GrpoResult> grpo;
  SftResult sft;
  std::vector<float> k_scale;         // of the export after the last step
  std::vector<int64_t> shard_bounds;  // Learner::shard_layout (empty unless sharded)
  int64_t master_held = 0;            // fp32 master values the rank holds after the last step
  uint64_t export_hash = 0;           // FNV-1a over the export's tensor names and bytes
  int64_t gradient_peak_bytes = 0;    // Learner::gradient_peak_bytes, the most over the updates
  int64_t weight_bytes = 0;           // model::Model::weight_bytes after the export
  int64_t working_held = -1;          // ZeRO-3: bytes of the rank's own working streams (else -1)
  int64_t staging_bytes = 0;          // TrainBackend::gradient_staging_bytes after the run
  int64_t units_acquired = 0;         // ZeRO-3: unit acquires, and those a prefetch served
  int64_t units_prefetched = 0;
  absl::Status status;
};

std::unique_ptr<Learner> learner_on(bool mirror, Precision training, uint64_t seed,
                                    const model::ModelConfig& config = tiny_config());

// Which backend run() trains on: Learner::create's, or a learner built on the CPU backend or on
// the device backend's host mirror by learner_on.
enum class On { kCreate, kCpu, kMirror };

// One SFT step then kSteps GRPO steps, as rank `rank` of `group` (null: alone).
constexpr int kSteps = 3;
RunOutcome run(Precision training, Collectives* group, uint64_t init_seed = 7,
               int64_t bucket_bytes = 0, ShardMode shard = ShardMode::kNone,
               const model::ModelConfig& config = tiny_config(), On on = On::kCreate) {
  RunOutcome out;
  absl::StatusOr<std::unique_ptr<Learner>> l =
      on == On::kCreate ? Learner::create(init_request(training, init_seed, config))
                        : absl::StatusOr<std::unique_ptr<Learner>>(
                              learner_on(on == On::kMirror, training, init_seed, config));
  if (!l.ok() || *l == nullptr) {
    out.status = l.ok() ? absl::InternalError("no learner") : l.status();
    return out;
  }
  (*l)->set_group(group, bucket_bytes);
  if (absl::Status s = (*l)->set_shard_mode(shard); !s.ok()) {
    out.status = s;
    return out;
  }
  if ((*l)->shard_layout() != nullptr) out.shard_bounds = (*l)->shard_layout()->bounds;
  {
    auto init = master_of(**l);
    out.initial.assign(init.begin(), init.end());
  }
  SftRequest sft;
  sft.batch = random_batch(99, 7);
  sft.learning_rate = kLr;  // kSftUpdates updates
  sft.minibatches = 2;
  absl::StatusOr<SftResult> s = (*l)->sft_update(sft);
  if (!s.ok()) {
    out.status = s.status();
    return out;
  }
  out.sft = *s;
  out.gradient_peak_bytes = (*l)->gradient_peak_bytes();
  auto params = master_of(**l);
  out.weights.emplace_back(params.begin(), params.end());
  for (int step = 1; step <= kSteps; ++step) {
    absl::StatusOr<GrpoResult> r = (*l)->grpo_update(grpo(1000 + step));
    if (!r.ok()) {
      out.status = r.status();
      return out;
    }
    out.grpo.push_back(*r);
    out.gradient_peak_bytes = std::max(out.gradient_peak_bytes, (*l)->gradient_peak_bytes());
    auto p = master_of(**l);
    out.weights.emplace_back(p.begin(), p.end());
  }
  absl::StatusOr<Export> e = (*l)->export_for_generation(Precision::kFP8, kSteps, true);
  if (!e.ok()) {
    out.status = e.status();
    return out;
  }
  out.k_scale = (*l)->policy().kv_scales().k;
  out.staging_bytes = (*l)->backend().gradient_staging_bytes();
  out.master_held = std::ssize((*l)->policy().params());
  out.weight_bytes = (*l)->policy().weight_bytes();
  if (const ShardedUnitWeights* units = (*l)->backend().sharded_units()) {
    out.working_held = units->held_bytes();
    out.units_acquired = units->acquired();
    out.units_prefetched = units->prefetched();
  }
  uint64_t h = 14695981039346656037ull;
  auto add = [&h](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i)
      h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  };
  for (const model::NamedTensor& t : e->weights.tensors) {
    add(t.name.data(), t.name.size());
    add(t.bytes.data(), t.bytes.size());
  }
  out.export_hash = h;
  return out;
}

void expect_rel_near(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::max(1.0, std::abs(want)))
      << what << ": group " << got << " vs alone " << want;
}

class DataParallelLearner : public ::testing::TestWithParam<Precision> {};

TEST_P(DataParallelLearner, GroupsOfTwoAndThreeMatchOneTrainer) {
  const Precision training = GetParam();
  const Tolerance tol = training == Precision::kBF16 ? kBf16 : kFp8;
  const RunOutcome alone = run(training, nullptr);
  ASSERT_TRUE(alone.status.ok()) << alone.status;
  for (int size : {2, 3}) {
    SCOPED_TRACE(testing::Message() << "group of " << size);
    auto groups = make_group(size, absl::StrCat("dp", size, std::string(precision_name(training))));
    auto outcomes = on_ranks(size, [&](int r) { return run(training, groups[r].get()); });
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(outcomes[r].status.ok()) << "rank " << r << ": " << outcomes[r].status;
      // Ranks agree bit for bit (the hash check inside passed too).
      for (size_t k = 0; k < outcomes[r].weights.size(); ++k) {
        EXPECT_EQ(outcomes[r].weights[k], outcomes[0].weights[k]) << "rank " << r << " step " << k;
      }
    }
    const RunOutcome& g = outcomes[0];
    expect_rel_near(g.sft.loss, alone.sft.loss, tol.metric, "sft loss");
    expect_rel_near(g.sft.grad_norm, alone.sft.grad_norm, tol.metric, "sft grad_norm");
    EXPECT_EQ(g.sft.group_size, size);
    EXPECT_GT(g.sft.all_reduce_bytes, 0);
    for (size_t k = 0; k < alone.weights.size(); ++k) {
      // The change since the initial weights, which the difference accumulates over.
      double diff2 = 0, change2 = 0, max_abs = 0;
      for (size_t i = 0; i < alone.initial.size(); ++i) {
        const double d = static_cast<double>(g.weights[k][i]) - alone.weights[k][i];
        const double c = static_cast<double>(alone.weights[k][i]) - alone.initial[i];
        diff2 += d * d;
        change2 += c * c;
        max_abs = std::max(max_abs, std::abs(d));
      }
      std::printf(
          "group of %d, step %zu: ||w_group - w_alone|| = %.3g, change %.3g, "
          "max |diff| %.3g\n",
          size, k, std::sqrt(diff2), std::sqrt(change2), max_abs);
      EXPECT_LE(std::sqrt(diff2), tol.weight_change * std::sqrt(change2)) << "step " << k;
      EXPECT_LE(max_abs, 2.0 * kLr * static_cast<double>(kSftUpdates + kGrpoUpdates * k))
          << "step " << k;
    }
    for (int step = 0; step < kSteps; ++step) {
      const GrpoResult &a = alone.grpo[step], &b = g.grpo[step];
      const std::string at = absl::StrCat("step ", step + 1, " ");
      expect_rel_near(b.loss, a.loss, tol.metric, at + "loss");
      expect_rel_near(b.pg_loss, a.pg_loss, tol.metric, at + "pg_loss");
      expect_rel_near(b.kl, a.kl, tol.metric, at + "kl");
      expect_rel_near(b.grad_norm, a.grad_norm, tol.metric, at + "grad_norm");
      expect_rel_near(b.clip_fraction, a.clip_fraction, tol.metric, at + "clip_fraction");
      EXPECT_EQ(b.tokens, a.tokens);
      expect_rel_near(b.mismatch.token_mult_prob_error, a.mismatch.token_mult_prob_error,
                      tol.metric, at + "token_mult_prob_error");
      expect_rel_near(b.mismatch.probs_ratio_max, a.mismatch.probs_ratio_max, tol.metric,
                      at + "probs_ratio_max");
      expect_rel_near(b.mismatch.probs_ratio_min, a.mismatch.probs_ratio_min, tol.metric,
                      at + "probs_ratio_min");
      ASSERT_EQ(b.logprobs.size(), a.logprobs.size());
      EXPECT_EQ(b.group_size, size);
    }
    // KV calibration saw every rank's records: the scales equal one trainer's.
    ASSERT_EQ(g.k_scale.size(), alone.k_scale.size());
    for (size_t l = 0; l < g.k_scale.size(); ++l) {
      expect_rel_near(g.k_scale[l], alone.k_scale[l], tol.metric, absl::StrCat("k_scale ", l));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, DataParallelLearner,
                         ::testing::Values(Precision::kFP8, Precision::kBF16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(DataParallelLearner, DivergedWeightsFailLoudlyNamingTheRank) {
  auto groups = make_group(2, "diverged");
  // Rank 1 starts from another seed: its weights differ from rank 0's from the start.
  auto outcomes =
      on_ranks(2, [&](int r) { return run(Precision::kBF16, groups[r].get(), r == 0 ? 7 : 8); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kInternal) << outcomes[r].status;
    EXPECT_NE(outcomes[r].status.message().find("rank(s) 1"), std::string::npos)
        << outcomes[r].status;
  }
}

// The hash over pieces equals the hash of the whole, however the pieces are cut (a device backend
// hashes its master in fixed-size chunks).
TEST(WeightHash, PiecesHashLikeTheWhole) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> w(1001);
  for (float& x : w) x = d(gen);
  const uint64_t whole = weight_hash(w);
  for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{64}, size_t{999}, size_t{5000}}) {
    WeightHasher h;
    for (size_t i = 0; i < w.size(); i += piece) {
      h.add(std::span<const float>(w).subspan(i, std::min(piece, w.size() - i)));
    }
    EXPECT_EQ(h.value(), whole) << "pieces of " << piece;
  }
  std::vector<float> flipped = w;
  flipped[500] = std::nextafter(flipped[500], 2.0f);
  EXPECT_NE(weight_hash(flipped), whole);
}

// A learner on the CPU backend or on the device backend's host mirror
// (train/device_train_backend.h), with a reference for the KL term.
std::unique_ptr<Learner> learner_on(bool mirror, Precision training, uint64_t seed,
                                    const model::ModelConfig& config) {
  PrecisionConfig precision;
  precision.training = training;
  precision.generation = Precision::kFP8;
  precision.kv_cache = Precision::kFP8;
  model::AdamWConfig adamw;
  adamw.lr = kLr;
  adamw.max_grad_norm = 1.0;
  auto m = model::Model::Init(config, precision.training_policy(), seed);
  auto ref = model::Model::Init(config, precision.training_policy(), seed);
  EXPECT_TRUE(m.ok() && ref.ok());
  if (!m.ok() || !ref.ok()) return nullptr;
  std::unique_ptr<TrainBackend> backend;
  if (mirror) {
    absl::StatusOr<std::unique_ptr<TrainBackend>> b =
        make_host_mirror_train_backend(std::move(*m), adamw);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return nullptr;
    backend = std::move(*b);
  } else {
    backend = make_cpu_train_backend(std::move(*m), adamw);
  }
  return std::make_unique<Learner>("job-dp", precision, std::move(backend), std::move(*ref), 0, 0);
}

struct BackendRun {
  absl::Status status;
  std::vector<uint64_t> fingerprints;  // after each GRPO update
  int64_t transfer_bytes = 0;
};

BackendRun backend_run(bool mirror, Collectives* group, uint64_t seed) {
  BackendRun out;
  std::unique_ptr<Learner> l = learner_on(mirror, Precision::kFP8, seed);
  if (l == nullptr) {
    out.status = absl::InternalError("no learner");
    return out;
  }
  l->set_group(group);
  for (int step = 1; step <= 2; ++step) {
    absl::StatusOr<GrpoResult> r = l->grpo_update(grpo(2000 + step));
    if (!r.ok()) {
      out.status = r.status();
      return out;
    }
    absl::StatusOr<uint64_t> f = l->backend().master_fingerprint();
    if (!f.ok()) {
      out.status = f.status();
      return out;
    }
    out.fingerprints.push_back(*f);
  }
  out.transfer_bytes = l->backend().gradient_transfer_bytes();
  return out;
}

// The device backend in a trainer group (host mirror): its weight check hashes the device master
// (chunked download), so a group of mirrors trains bit-identically to a group of CPU trainers, a
// CPU rank and a mirror rank agree, and a rank whose weights differ is named.
TEST(DataParallelLearner, DeviceBackendRanksHashTheirDeviceMaster) {
  auto cpu_groups = make_group(2, "mirror-cpu");
  auto cpu = on_ranks(2, [&](int r) { return backend_run(false, cpu_groups[r].get(), 7); });
  auto mirror_groups = make_group(2, "mirror-mirror");
  auto mirror = on_ranks(2, [&](int r) { return backend_run(true, mirror_groups[r].get(), 7); });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(cpu[r].status.ok()) << cpu[r].status;
    ASSERT_TRUE(mirror[r].status.ok()) << mirror[r].status;
    EXPECT_EQ(mirror[r].fingerprints, cpu[0].fingerprints) << "rank " << r;
    // In a group the gradients go through the host all-reduce buffer.
    EXPECT_GT(mirror[r].transfer_bytes, 0);
  }
  EXPECT_NE(cpu[0].fingerprints[0], cpu[0].fingerprints[1]);  // the weights moved
  // Alone, the mirror keeps its gradients on its device (no gradient bytes move) and stays
  // bit-identical to the CPU backend alone.
  const BackendRun alone = backend_run(true, nullptr, 7);
  ASSERT_TRUE(alone.status.ok()) << alone.status;
  EXPECT_EQ(alone.transfer_bytes, 0);
  EXPECT_EQ(alone.fingerprints, backend_run(false, nullptr, 7).fingerprints);

  auto mixed_groups = make_group(2, "mirror-mixed");
  auto mixed = on_ranks(2, [&](int r) { return backend_run(r == 1, mixed_groups[r].get(), 7); });
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(mixed[r].status.ok()) << mixed[r].status;
  EXPECT_EQ(mixed[1].fingerprints, cpu[0].fingerprints);

  auto diverged_groups = make_group(2, "mirror-diverged");
  auto diverged = on_ranks(
      2, [&](int r) { return backend_run(true, diverged_groups[r].get(), r == 0 ? 7 : 8); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(diverged[r].status.code(), absl::StatusCode::kInternal) << diverged[r].status;
    EXPECT_NE(diverged[r].status.message().find("rank(s) 1"), std::string::npos)
        << diverged[r].status;
  }
}

// Bucketed vs one all-reduce (train/collectives_bucketed.h). Each element's result is the float32
// sum of the N ranks' terms in the order the backend adds them, which may differ between a
// bucket and the whole array. For N = 2 the order does not matter (a + b == b + a in IEEE
// arithmetic): bit for bit. For N terms, each order is within gamma_{N-1} sum|x_i| of the exact
// sum (gamma_k = k u / (1 - k u), u = 2^-24), so two orders differ by at most 2 gamma_{N-1}
// sum|x_i|.
double order_bound(int n, double sum_abs) {
  const double u = std::ldexp(1.0, -24), k = n - 1;
  return 2.0 * (k * u / (1.0 - k * u)) * sum_abs;
}

// Rank r's gradient for the simulated backward: random non-zero values of both signs.
std::vector<float> rank_gradient(int r, size_t n) {
  std::mt19937 gen(500 + r);
  std::uniform_real_distribution<float> d(0.01f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = (gen() % 2 ? 1.0f : -1.0f) * d(gen);
  return v;
}

TEST(BucketedAllReduce, EqualsOneAllReduceForBucketsSmallerAndLargerThanATensor) {
  // "Tensors" of a layout, written by the simulated backward from the last to the first.
  const std::vector<int64_t> tensors = {300, 50, 1000, 7, 640, 1, 203};
  int64_t n = 0;
  for (int64_t t : tensors) n += t;
  for (int size : {2, 3}) {
    auto groups = make_group(size, absl::StrCat("bucketed", size));
    // Reference: one all-reduce of the whole array.
    auto whole = on_ranks(size, [&](int r) {
      std::vector<float> g = rank_gradient(r, static_cast<size_t>(n));
      EXPECT_TRUE(groups[r]->all_reduce(std::span<float>(g), ReduceOp::kSum, "whole").ok());
      return g;
    });
    for (int64_t bucket : {int64_t{1}, int64_t{5}, int64_t{64}, int64_t{333}, n, 10 * n}) {
      SCOPED_TRACE(testing::Message() << "group of " << size << ", bucket " << bucket);
      auto bucketed = on_ranks(size, [&](int r) {
        const std::vector<float> mine = rank_gradient(r, static_cast<size_t>(n));
        // NaN until "computed": a bucket reduced before its gradients are final shows as NaN.
        std::vector<float> g(static_cast<size_t>(n), std::nanf(""));
        BucketedAllReduce reducer(groups[r].get(), bucket);
        reducer.begin(std::span<float>(g), "gradient all-reduce");
        int64_t end = n;
        for (auto t = tensors.rbegin(); t != tensors.rend(); ++t) {
          std::copy(mine.begin() + (end - *t), mine.begin() + end, g.begin() + (end - *t));
          end -= *t;
          reducer.final_from(end);
        }
        const absl::Status s = reducer.finish();
        EXPECT_TRUE(s.ok()) << s;
        return g;
      });
      for (int r = 1; r < size; ++r) {
        EXPECT_EQ(0, std::memcmp(bucketed[r].data(), bucketed[0].data(), n * sizeof(float)))
            << "rank " << r << " differs from rank 0";
      }
      std::vector<std::vector<float>> terms;
      for (int r = 0; r < size; ++r) terms.push_back(rank_gradient(r, static_cast<size_t>(n)));
      int64_t different = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float got = bucketed[0][i], want = whole[0][i];
        ASSERT_TRUE(std::isfinite(got)) << "element " << i << " reduced before it was final";
        if (size == 2) {
          ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
              << "element " << i << ": " << got << " vs " << want;
        } else {
          double sum_abs = 0;
          for (const auto& t : terms) sum_abs += std::abs(static_cast<double>(t[i]));
          ASSERT_LE(std::abs(static_cast<double>(got) - want), order_bound(size, sum_abs))
              << "element " << i;
        }
        different += got != want;
      }
      std::printf("group of %d, bucket %lld: %lld of %lld elements differ from one all-reduce\n",
                  size, static_cast<long long>(bucket), static_cast<long long>(different),
                  static_cast<long long>(n));
    }
  }
}

TEST(BucketedAllReduce, ABucketThatTimesOutFailsFinishNamingIt) {
  auto groups = make_group(2, "bucketed-hung", /*timeout_ms=*/500);
  ASSERT_TRUE(groups[0] && groups[1]);
  // Rank 1 never reduces: rank 0's first bucket times out, the rest are skipped.
  std::vector<float> g = rank_gradient(0, 100);
  BucketedAllReduce reducer(groups[0].get(), 40);
  reducer.begin(std::span<float>(g), "minibatch 0: gradient all-reduce");
  reducer.final_from(0);
  const absl::Status s = reducer.finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("minibatch 0: gradient all-reduce (bucket 1 of 3)"), std::string::npos)
      << s;
}

// the training backward's on_final contract, which the buckets rely on: `from` only decreases, ends
// at 0, and grads[from, P) are never written again after the call that names `from`.
TEST(BucketedAllReduce, BackwardReportsGradientsFinalFromTheEnd) {
  model::ModelConfig config = tiny_config();
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    config.tie_word_embeddings = tied;
    absl::StatusOr<std::unique_ptr<model::Model>> m =
        model::Model::Init(config, model::PrecisionPolicy{}, 3);
    ASSERT_TRUE(m.ok()) << m.status();
    const model::TokenBatch batch = {{1, 5, 9, 2, 30, 7}, {4, 4, 11, 40}};
    engine::CpuTrainStep ctx;
    absl::StatusOr<model::TokenValues> lp = ctx.forward(**m, batch, {});
    ASSERT_TRUE(lp.ok()) << lp.status();
    model::TokenValues dlogp = *lp;
    for (auto& row : dlogp) {
      for (float& v : row) v = 0.3f + 0.1f * v;  // non-zero dL/dlogprob on every token
    }
    const int64_t P = (*m)->num_params();
    std::vector<float> grads(static_cast<size_t>(P), 0.0f);
    std::vector<std::pair<int64_t, std::vector<float>>> snapshots;
    ASSERT_TRUE(ctx.backward(**m, dlogp, grads.data(),
                             [&](int64_t from) {
                               snapshots.emplace_back(
                                   from, std::vector<float>(grads.begin() + from, grads.end()));
                             })
                    .ok());
    ASSERT_EQ(snapshots.size(), static_cast<size_t>(config.num_hidden_layers + 2));
    EXPECT_EQ(snapshots.back().first, 0);
    for (size_t k = 0; k < snapshots.size(); ++k) {
      const auto& [from, values] = snapshots[k];
      if (k > 0) {
        EXPECT_LT(from, snapshots[k - 1].first);
      }
      EXPECT_TRUE(std::equal(values.begin(), values.end(), grads.begin() + from))
          << "gradients after offset " << from << " changed after they were reported final";
      EXPECT_TRUE(std::any_of(values.begin(), values.end(), [](float v) { return v != 0.0f; }));
    }
  }
}

class BucketedLearner : public ::testing::TestWithParam<Precision> {};

// The learner with buckets (one smaller than every weight matrix, one of a few tensors, one
// larger than the whole gradient) ends with the same weights, bit for bit, as with one
// all-reduce, in a group of 2 (see order_bound: two terms add the same in any order).
TEST_P(BucketedLearner, GroupOfTwoMatchesOneAllReduceBitForBit) {
  const Precision training = GetParam();
  const std::string name(precision_name(training));
  auto plain_groups = make_group(2, "plain" + name);
  auto plain = on_ranks(2, [&](int r) { return run(training, plain_groups[r].get()); });
  ASSERT_TRUE(plain[0].status.ok()) << plain[0].status;
  for (int64_t bytes : {int64_t{256}, int64_t{40000}, int64_t{1} << 30}) {
    SCOPED_TRACE(testing::Message() << "bucket " << bytes << " bytes");
    auto groups = make_group(2, absl::StrCat("bucketed", name, bytes));
    auto outcomes = on_ranks(2, [&](int r) { return run(training, groups[r].get(), 7, bytes); });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(outcomes[r].status.ok()) << "rank " << r << ": " << outcomes[r].status;
      ASSERT_EQ(outcomes[r].weights.size(), plain[0].weights.size());
      for (size_t k = 0; k < plain[0].weights.size(); ++k) {
        EXPECT_EQ(outcomes[r].weights[k], plain[0].weights[k]) << "rank " << r << " step " << k;
      }
    }
    // The buckets ran: more all-reduce calls than one per minibatch, unless one bucket holds all.
    const int64_t calls = groups[0]->stats().calls, plain_calls = plain_groups[0]->stats().calls;
    if (bytes < (int64_t{1} << 30)) {
      EXPECT_GT(calls, plain_calls);
    } else {
      EXPECT_EQ(calls, plain_calls);
    }
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_EQ(outcomes[0].grpo[step].loss, plain[0].grpo[step].loss);
      EXPECT_EQ(outcomes[0].grpo[step].grad_norm, plain[0].grpo[step].grad_norm);
      EXPECT_GT(outcomes[0].grpo[step].all_reduce_bytes, 0);
    }
  }
}

// In a group of 3 the buckets change the order in which each element's three rank terms are added
// (see order_bound): the same rounding-level difference as a group vs one trainer, so the same
// tolerances apply (kBf16 / kFp8 above), against the group of 3 without buckets.
TEST_P(BucketedLearner, GroupOfThreeMatchesOneAllReduceWithinRounding) {
  const Precision training = GetParam();
  const Tolerance tol = training == Precision::kBF16 ? kBf16 : kFp8;
  const std::string name(precision_name(training));
  auto plain_groups = make_group(3, "plain3" + name);
  auto plain = on_ranks(3, [&](int r) { return run(training, plain_groups[r].get()); });
  auto groups = make_group(3, "bucketed3" + name);
  auto outcomes = on_ranks(3, [&](int r) { return run(training, groups[r].get(), 7, 256); });
  ASSERT_TRUE(plain[0].status.ok()) << plain[0].status;
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(outcomes[r].status.ok()) << "rank " << r << ": " << outcomes[r].status;
    EXPECT_EQ(outcomes[r].weights, outcomes[0].weights) << "rank " << r;
  }
  const RunOutcome &b = outcomes[0], &p = plain[0];
  for (size_t k = 0; k < p.weights.size(); ++k) {
    double diff2 = 0, change2 = 0, max_abs = 0;
    for (size_t i = 0; i < p.initial.size(); ++i) {
      const double d = static_cast<double>(b.weights[k][i]) - p.weights[k][i];
      const double c = static_cast<double>(p.weights[k][i]) - p.initial[i];
      diff2 += d * d;
      change2 += c * c;
      max_abs = std::max(max_abs, std::abs(d));
    }
    std::printf(
        "group of 3, 256-byte buckets, step %zu: ||w_bucketed - w_plain|| = %.3g, "
        "change %.3g\n",
        k, std::sqrt(diff2), std::sqrt(change2));
    EXPECT_LE(std::sqrt(diff2), tol.weight_change * std::sqrt(change2)) << "step " << k;
    EXPECT_LE(max_abs, 2.0 * kLr * static_cast<double>(kSftUpdates + kGrpoUpdates * k));
  }
  for (int step = 0; step < kSteps; ++step) {
    expect_rel_near(b.grpo[step].loss, p.grpo[step].loss, tol.metric, "loss");
    expect_rel_near(b.grpo[step].grad_norm, p.grpo[step].grad_norm, tol.metric, "grad_norm");
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, BucketedLearner,
                         ::testing::Values(Precision::kFP8, Precision::kBF16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

// ZeRO-2 (Learner::set_shard_mode, docs/design/sharding.md). A shape whose FP8 weights span
// several 128-row block rows (gate/up [264, 32]: rows 0-127, 128-255 and a partial 256-263), so
// the cut of 3 and 4 ranks falls inside a tensor, and a partial block sits at a shard's end.
model::ModelConfig odd_config() {
  model::ModelConfig c = tiny_config();
  c.intermediate_size = 264;
  return c;
}

// Whether some cut of `bounds` lies strictly inside a parameter tensor (not at its start).
bool cuts_inside_a_tensor(const std::vector<int64_t>& bounds, const model::ModelConfig& config) {
  absl::StatusOr<std::unique_ptr<Learner>> l =
      Learner::create(init_request(Precision::kBF16, 7, config));
  if (!l.ok()) return false;
  for (size_t r = 1; r + 1 < bounds.size(); ++r) {
    for (const model::ParamInfo& p : (*l)->policy().layout().params()) {
      if (bounds[r] > p.offset && bounds[r] < p.offset + p.numel) return true;
    }
  }
  return false;
}

void expect_same_run(const RunOutcome& got, const RunOutcome& want, const std::string& what) {
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  for (size_t k = 0; k < want.weights.size(); ++k) {
    EXPECT_EQ(0, std::memcmp(got.weights[k].data(), want.weights[k].data(),
                             want.weights[k].size() * sizeof(float)))
        << what << ": weights after step " << k << " differ";
  }
  EXPECT_EQ(got.sft.grad_norm, want.sft.grad_norm) << what;
  EXPECT_EQ(got.sft.loss, want.sft.loss) << what;
  for (size_t step = 0; step < want.grpo.size(); ++step) {
    EXPECT_EQ(got.grpo[step].loss, want.grpo[step].loss) << what << " step " << step;
    EXPECT_EQ(got.grpo[step].grad_norm, want.grpo[step].grad_norm) << what << " step " << step;
  }
  EXPECT_EQ(got.k_scale, want.k_scale) << what;
  // The FP8 payload: from the working copies (FP8 training) or from the gathered master
  // (BF16 training quantized under the generation policy) when sharded.
  EXPECT_EQ(got.export_hash, want.export_hash) << what;
}

class ShardedLearner : public ::testing::TestWithParam<Precision> {};

// With 2 ranks the reduce-scatter's rank-order sum equals the ring all-reduce's (a + b = b + a)
// and the clip norm is summed in one trainer's order, so ZeRO-2 updates equal the unsharded
// group's bit for bit: one SFT and three GRPO steps (14 optimizer steps), with and without
// buckets, on the tiny and the odd shape. ZeRO-3 computes with the same working copies, gathered
// unit by unit, so it equals them too; its ranks keep no working copy between steps (only the
// streams of their shard).
TEST_P(ShardedLearner, GroupOfTwoIsBitIdenticalToUnsharded) {
  const Precision training = GetParam();
  const std::string name(precision_name(training));
  for (const model::ModelConfig& config : {tiny_config(), odd_config()}) {
    const std::string shape = config.intermediate_size == 264 ? "odd" : "tiny";
    auto plain_groups = make_group(2, "zplain" + name + shape);
    auto plain = on_ranks(2, [&](int r) {
      return run(training, plain_groups[r].get(), 7, 0, ShardMode::kNone, config);
    });
    ASSERT_TRUE(plain[0].status.ok()) << plain[0].status;
    for (int64_t bytes : {int64_t{0}, int64_t{256}, int64_t{40000}}) {
      int64_t zero2_weight_bytes[2] = {0, 0};
      for (ShardMode mode : {ShardMode::kGradsOptimizer, ShardMode::kParams}) {
        const std::string what = absl::StrCat(shape, ", ", std::string(shard_mode_name(mode)),
                                              ", bucket ", bytes, " bytes");
        auto groups = make_group(
            2, absl::StrCat("zshard", name, shape, bytes, std::string(shard_mode_name(mode))));
        auto sharded = on_ranks(
            2, [&](int r) { return run(training, groups[r].get(), 7, bytes, mode, config); });
        for (int r = 0; r < 2; ++r) {
          ASSERT_TRUE(sharded[r].status.ok()) << what << " rank " << r << ": " << sharded[r].status;
          ASSERT_EQ(sharded[r].shard_bounds.size(), 3u) << what;
          expect_same_run(sharded[r], plain[0], absl::StrCat(what, ", rank ", r));
          // The rank holds the fp32 master of its own shard only.
          const std::vector<int64_t>& cut = sharded[r].shard_bounds;
          EXPECT_EQ(sharded[r].master_held, cut[r + 1] - cut[r]) << what << " rank " << r;
          if (mode == ShardMode::kGradsOptimizer) {
            zero2_weight_bytes[r] = sharded[r].weight_bytes;
            EXPECT_EQ(sharded[r].working_held, -1);
          } else {
            // ZeRO-3: every unit but the first of each pass came from a prefetch (issued when the
            // unit before it was acquired, run while it computed).
            EXPECT_GT(sharded[r].units_prefetched, 0) << what << " rank " << r;
            EXPECT_GT(2 * sharded[r].units_prefetched, sharded[r].units_acquired)
                << what << " rank " << r;
            // No working copy left in the model after the step and the export (only the
            // master shard, norms and biases), the rank's own streams beside it.
            EXPECT_GT(sharded[r].working_held, 0) << what << " rank " << r;
            EXPECT_LT(sharded[r].weight_bytes + sharded[r].working_held, zero2_weight_bytes[r])
                << what << " rank " << r;
            EXPECT_LT(sharded[r].weight_bytes, (sharded[r].master_held + 4096) * 4)
                << what << " rank " << r;
          }
        }
        EXPECT_EQ(plain[0].master_held, std::ssize(plain[0].initial));
        // Both ranks own part of the parameters.
        const std::vector<int64_t>& b = sharded[0].shard_bounds;
        EXPECT_GT(b[1], 0);
        EXPECT_LT(b[1], b[2]);
        EXPECT_EQ(b[2], static_cast<int64_t>(plain[0].initial.size()));
      }
    }
  }
}

// With 3 and 4 ranks each element's rank terms are added in rank order by the reduce-scatter and
// in the ring's chunk order by the unsharded all-reduce, so the two may differ in the last bits:
// the group-vs-one-trainer tolerances apply against the unsharded group. What is exact: every
// rank ends with the same weights, and the sharded result does not depend on the bucket size.
TEST_P(ShardedLearner, GroupsOfThreeAndFourMatchUnshardedAndAreBucketIndependent) {
  const Precision training = GetParam();
  const Tolerance tol = training == Precision::kBF16 ? kBf16 : kFp8;
  const std::string name(precision_name(training));
  const model::ModelConfig config = odd_config();
  bool cut_inside = false;
  for (int size : {3, 4}) {
    SCOPED_TRACE(testing::Message() << "group of " << size);
    auto plain_groups = make_group(size, absl::StrCat("zplain", size, name));
    auto plain = on_ranks(size, [&](int r) {
      return run(training, plain_groups[r].get(), 7, 0, ShardMode::kNone, config);
    });
    ASSERT_TRUE(plain[0].status.ok()) << plain[0].status;
    std::vector<RunOutcome> by_bucket[2];
    const int64_t buckets[2] = {0, 256};
    for (int k = 0; k < 2; ++k) {
      auto groups = make_group(size, absl::StrCat("zshard", size, name, buckets[k]));
      by_bucket[k] = on_ranks(size, [&](int r) {
        return run(training, groups[r].get(), 7, buckets[k], ShardMode::kGradsOptimizer, config);
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(by_bucket[k][r].status.ok()) << "rank " << r << ": " << by_bucket[k][r].status;
        ASSERT_EQ(by_bucket[k][r].shard_bounds.size(), static_cast<size_t>(size + 1));
        const std::vector<int64_t>& cut = by_bucket[k][r].shard_bounds;
        EXPECT_EQ(by_bucket[k][r].master_held, cut[r + 1] - cut[r]) << "rank " << r;
        expect_same_run(by_bucket[k][r], by_bucket[0][0],
                        absl::StrCat("bucket ", buckets[k], ", rank ", r, " vs rank 0 unbucketed"));
      }
    }
    // ZeRO-3 gathers the working copies ZeRO-2 holds whole: the same run bit for bit, also on a
    // rank that has no sequence in a minibatch (the SFT minibatches hold 3 and 4 sequences, so
    // with 4 ranks one rank runs the gathers of a forward and a backward without data).
    // (Group of 3 without buckets, of 4 with 256-byte buckets: the test's time is bounded.)
    for (int64_t bytes : {size == 3 ? int64_t{0} : int64_t{256}}) {
      auto groups = make_group(size, absl::StrCat("zparams", size, name, bytes));
      const std::vector<RunOutcome> params = on_ranks(size, [&](int r) {
        return run(training, groups[r].get(), 7, bytes, ShardMode::kParams, config);
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(params[r].status.ok()) << "rank " << r << ": " << params[r].status;
        expect_same_run(
            params[r], by_bucket[0][0],
            absl::StrCat("params, bucket ", bytes, ", rank ", r, " vs grads_optimizer"));
        EXPECT_GT(params[r].working_held, 0) << "rank " << r;
      }
    }
    cut_inside = cut_inside || cuts_inside_a_tensor(by_bucket[0][0].shard_bounds, config);
    const RunOutcome &s = by_bucket[0][0], &p = plain[0];
    for (size_t k = 0; k < p.weights.size(); ++k) {
      double diff2 = 0, change2 = 0;
      for (size_t i = 0; i < p.initial.size(); ++i) {
        const double d = static_cast<double>(s.weights[k][i]) - p.weights[k][i];
        const double c = static_cast<double>(p.weights[k][i]) - p.initial[i];
        diff2 += d * d;
        change2 += c * c;
      }
      std::printf("group of %d, sharded vs unsharded, step %zu: ||diff|| = %.3g, change %.3g\n",
                  size, k, std::sqrt(diff2), std::sqrt(change2));
      EXPECT_GT(change2, 0.0) << "step " << k;
      EXPECT_LE(std::sqrt(diff2), tol.weight_change * std::sqrt(change2)) << "step " << k;
    }
    for (int step = 0; step < kSteps; ++step) {
      expect_rel_near(s.grpo[step].loss, p.grpo[step].loss, tol.metric, "loss");
      expect_rel_near(s.grpo[step].grad_norm, p.grpo[step].grad_norm, tol.metric, "grad_norm");
    }
  }
  // The odd shape made at least one cut fall at a 128-row boundary inside a tensor.
  EXPECT_TRUE(cut_inside);
}

// ZeRO-2 on the device backend, run on its host mirror (train/device_train_backend.h): the state
// keeps the master and moments of the rank's shard, the backward's gradients are staged in
// "device" memory tensor by tensor and added into the learner's buckets, the shard's working
// copies are encoded by the state and installed in the state and the engine. Groups of 2 and 3
// (the odd shape, cuts inside tensors), with and without buckets, give the CPU backend's sharded
// run bit for bit: weights after every step, losses, grad norms, KV scales and the FP8 export;
// also its BF16 and F32 exports from the gathered master. The staging holds less than the whole
// gradient array.
TEST_P(ShardedLearner, DeviceBackendShardsLikeTheCpuBackend) {
  const Precision training = GetParam();
  const std::string name(precision_name(training));
  const model::ModelConfig config = odd_config();
  for (int size : {2, 3}) {
    for (int64_t bytes : {int64_t{0}, int64_t{256}}) {
      const std::string what = absl::StrCat(size, " ranks, bucket ", bytes, " bytes");
      auto cpu_groups = make_group(size, absl::StrCat("dzcpu", name, size, "b", bytes));
      auto cpu = on_ranks(size, [&](int r) {
        return run(training, cpu_groups[r].get(), 7, bytes, ShardMode::kGradsOptimizer, config,
                   On::kCpu);
      });
      auto mirror_groups = make_group(size, absl::StrCat("dzmirror", name, size, "b", bytes));
      auto mirror = on_ranks(size, [&](int r) {
        return run(training, mirror_groups[r].get(), 7, bytes, ShardMode::kGradsOptimizer, config,
                   On::kMirror);
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(cpu[r].status.ok()) << what << " rank " << r << ": " << cpu[r].status;
        ASSERT_TRUE(mirror[r].status.ok()) << what << " rank " << r << ": " << mirror[r].status;
        ASSERT_EQ(mirror[r].shard_bounds, cpu[r].shard_bounds) << what;
        expect_same_run(mirror[r], cpu[0], absl::StrCat(what, ", mirror rank ", r));
        const int64_t whole = 4 * std::ssize(cpu[0].initial);
        if (r == 0) {
          std::printf("%s, %s: staging %lld of %lld gradient bytes\n", name.c_str(), what.c_str(),
                      static_cast<long long>(mirror[r].staging_bytes),
                      static_cast<long long>(whole));
        }
        EXPECT_GT(mirror[r].staging_bytes, 0) << what << " rank " << r;
        EXPECT_LT(mirror[r].staging_bytes, whole) << what << " rank " << r;
        EXPECT_EQ(cpu[r].staging_bytes, 0) << what;
      }
      EXPECT_NE(cpu[0].weights.front(), cpu[0].weights.back()) << what;  // the weights moved
    }
  }
  // The checkpoint formats, exported from the master the ranks gather.
  auto cpu_groups = make_group(2, "dzexportcpu" + name);
  auto mirror_groups = make_group(2, "dzexportmirror" + name);
  auto exports = [&](bool mirror, Collectives* group) {
    std::vector<std::string> out;
    std::unique_ptr<Learner> l = learner_on(mirror, training, 7, config);
    if (l == nullptr) return out;
    l->set_group(group, 256);
    if (absl::Status s = l->set_shard_mode(ShardMode::kGradsOptimizer); !s.ok()) {
      out.push_back(s.ToString());
      return out;
    }
    absl::StatusOr<GrpoResult> g = l->grpo_update(grpo(1001));
    if (!g.ok()) {
      out.push_back(g.status().ToString());
      return out;
    }
    for (model::WeightFormat f : {model::WeightFormat::kBF16, model::WeightFormat::kF32}) {
      absl::StatusOr<model::WeightSet> set = l->export_weights(f, 1);
      if (!set.ok()) {
        out.push_back(set.status().ToString());
        continue;
      }
      std::string bytes;
      for (const model::NamedTensor& t : set->tensors) {
        bytes += t.name;
        bytes.append(t.bytes.begin(), t.bytes.end());
      }
      out.push_back(std::move(bytes));
    }
    return out;
  };
  auto cpu = on_ranks(2, [&](int r) { return exports(false, cpu_groups[r].get()); });
  auto mirror = on_ranks(2, [&](int r) { return exports(true, mirror_groups[r].get()); });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cpu[r].size(), 2u);
    ASSERT_EQ(mirror[r].size(), 2u);
    EXPECT_GT(cpu[r][0].size(), 1000u) << cpu[r][0].substr(0, 200);
    EXPECT_TRUE(mirror[r][0] == cpu[0][0])
        << "BF16 export, rank " << r << ": " << mirror[r][0].substr(0, 200);
    EXPECT_TRUE(mirror[r][1] == cpu[0][1])
        << "F32 export, rank " << r << ": " << mirror[r][1].substr(0, 200);
  }
}

// What the device backend does not shard says so: ZeRO-3 (params) names the backend and the mode
// it has; a sharded device backend refuses the unsharded step and its own gradient buffer.
TEST(ShardedLearner, DeviceBackendRefusesParamsAndUnshardedCallsClearly) {
  auto groups = make_group(2, "dzrefuse");
  auto results = on_ranks(2, [&](int r) {
    std::unique_ptr<Learner> l = learner_on(true, Precision::kFP8, 7);
    if (l == nullptr) return absl::InternalError("no learner");
    l->set_group(groups[r].get());
    return l->set_shard_mode(ShardMode::kParams);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kFailedPrecondition) << results[r];
    EXPECT_NE(results[r].message().find("ZeRO-3 is not implemented on the cpu device training "
                                        "backend yet (grads_optimizer is"),
              std::string::npos)
        << results[r];
  }
  auto m = model::Model::Init(tiny_config(), PrecisionConfig().training_policy(), 7);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::unique_ptr<TrainBackend>> b =
      make_host_mirror_train_backend(std::move(*m), model::AdamWConfig());
  ASSERT_TRUE(b.ok()) << b.status();
  const int64_t n = (*b)->num_params();
  // Not a cut point: inside the first tensor, not at a 128-row boundary.
  const absl::Status bad_cut = (*b)->shard_optimizer(1, n);
  EXPECT_EQ(bad_cut.code(), absl::StatusCode::kInvalidArgument) << bad_cut;
  EXPECT_NE(bad_cut.message().find("[1, "), std::string::npos) << bad_cut;
  absl::StatusOr<ShardLayout> cut = shard_parameters((*b)->host_model().layout(), 2);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_TRUE((*b)->shard_optimizer(cut->begin(1), cut->end(1)).ok());
  EXPECT_EQ((*b)->shard_optimizer(cut->begin(1), cut->end(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<float> grads(static_cast<size_t>(n), 0.5f);
  const absl::Status whole_step = (*b)->optimizer_step(grads.data()).status();
  EXPECT_EQ(whole_step.code(), absl::StatusCode::kFailedPrecondition) << whole_step;
  EXPECT_NE(whole_step.message().find("optimizer_step_shard"), std::string::npos) << whole_step;
  const absl::Status f32 = (*b)->export_weights(model::WeightFormat::kF32, 0).status();
  EXPECT_EQ(f32.code(), absl::StatusCode::kFailedPrecondition) << f32;
  EXPECT_NE(f32.message().find("holds a shard"), std::string::npos) << f32;
  // The shard's master is what the state holds: the model's values from the cut on.
  absl::StatusOr<std::vector<float>> shard = (*b)->master_shard();
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(std::ssize(*shard), cut->size(1));
  auto again = model::Model::Init(tiny_config(), PrecisionConfig().training_policy(), 7);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(0, std::memcmp(shard->data(), (*again)->params().data() + cut->begin(1),
                           shard->size() * sizeof(float)));
  // A step on the shard moves it (non-zero gradients).
  std::vector<float> g(shard->size(), 0.25f);
  ASSERT_TRUE((*b)->optimizer_step_shard(g, 1.0).ok());
  absl::StatusOr<std::vector<float>> after = (*b)->master_shard();
  ASSERT_TRUE(after.ok());
  EXPECT_NE(*after, *shard);
}

// The initial shard a placement gives a device backend: the rank's piece of shard_parameters on
// cuda in a sharded group; none on the CPU (it shards when the learner does), alone, or
// unsharded; a bad group is INVALID_ARGUMENT naming the field.
TEST(ShardedLearner, InitialShardIsTheRanksPieceOnADeviceInASharedGroup) {
  const model::ParamLayout layout(odd_config());
  absl::StatusOr<ShardLayout> cut = shard_parameters(layout, 3);
  ASSERT_TRUE(cut.ok());
  TrainPlacement p;
  p.device = model::Device::kCuda;
  p.trainers = 3;
  p.shard = ShardMode::kGradsOptimizer;
  for (int r = 0; r < 3; ++r) {
    p.rank = r;
    absl::StatusOr<InitialShard> got = initial_shard(layout, p);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->begin, cut->begin(r));
    EXPECT_EQ(got->end, cut->end(r));
    EXPECT_LT(got->begin, got->end);
  }
  p.shard = ShardMode::kParams;
  ASSERT_TRUE(initial_shard(layout, p).ok());
  EXPECT_EQ(initial_shard(layout, p)->end, cut->end(2));
  for (const auto& change : std::vector<std::function<void(TrainPlacement&)>>{
           [](TrainPlacement& q) { q.device = model::Device::kCpu; },
           [](TrainPlacement& q) { q.shard = ShardMode::kNone; },
           [](TrainPlacement& q) {
             q.trainers = 1;
             q.rank = 0;
           }}) {
    TrainPlacement q = p;
    change(q);
    absl::StatusOr<InitialShard> none = initial_shard(layout, q);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_LT(none->end, 0);
  }
  TrainPlacement bad = p;
  bad.rank = 3;
  EXPECT_EQ(initial_shard(layout, bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(initial_shard(layout, bad).status().message().find("rank: must be in [0, 3), got 3"),
            std::string::npos);
  bad = p;
  bad.trainers = 0;
  EXPECT_NE(initial_shard(layout, bad).status().message().find("trainers: must be >= 1"),
            std::string::npos);
  // The memory plan of a placement counts the rank's shard: less than alone.
  TrainPlacement alone;
  alone.max_step_tokens = 256;
  TrainPlacement sharded = alone;
  sharded.trainers = 4;
  sharded.shard = ShardMode::kGradsOptimizer;
  PrecisionConfig precision;
  precision.training = Precision::kFP8;
  absl::StatusOr<MemoryPlan> one = plan_for(odd_config(), precision, alone);
  absl::StatusOr<MemoryPlan> four = plan_for(odd_config(), precision, sharded);
  ASSERT_TRUE(one.ok() && four.ok()) << one.status() << " / " << four.status();
  EXPECT_LT(four->total(), one->total());
}

INSTANTIATE_TEST_SUITE_P(Precisions, ShardedLearner,
                         ::testing::Values(Precision::kFP8, Precision::kBF16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(ShardedLearner, BadModesAndUnsupportedUsesFailClearly) {
  // Text that is not a mode names the field.
  absl::StatusOr<ShardMode> bad = parse_shard_mode("zero2", "trainer.shard");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("trainer.shard"), std::string::npos) << bad.status();

  auto groups = make_group(2, "zbad");
  auto outcomes = on_ranks(2, [&](int r) {
    absl::StatusOr<std::unique_ptr<Learner>> l = Learner::create(init_request(Precision::kFP8));
    if (!l.ok()) return l.status();
    (*l)->set_group(groups[r].get());
    EXPECT_TRUE((*l)->set_shard_mode(ShardMode::kGradsOptimizer).ok());
    EXPECT_NE((*l)->shard_layout(), nullptr);
    // Sharded once, the mode stays: another one is refused, naming both.
    absl::Status params = (*l)->set_shard_mode(ShardMode::kParams);
    EXPECT_EQ(params.code(), absl::StatusCode::kFailedPrecondition) << params;
    EXPECT_NE(params.message().find("sharded as grads_optimizer; it cannot change to params"),
              std::string::npos)
        << params;
    // No way back to none, and the sharded optimizer state is not one file (it is saved per
    // rank by save_checkpoint, ShardedCheckpoint below).
    EXPECT_EQ((*l)->set_shard_mode(ShardMode::kNone).code(), absl::StatusCode::kFailedPrecondition);
    absl::Status save = (*l)->backend().save_optimizer_state("/tmp/zero_unused_state.safetensors");
    EXPECT_EQ(save.code(), absl::StatusCode::kFailedPrecondition) << save;
    EXPECT_NE(save.message().find("its state is saved per rank"), std::string::npos) << save;
    // Out of its group the sharded learner refuses updates instead of stepping a part.
    (*l)->set_group(nullptr);
    SftRequest sft;
    sft.batch = random_batch(99, 7);
    sft.learning_rate = kLr;
    absl::StatusOr<SftResult> alone_update = (*l)->sft_update(sft);
    EXPECT_EQ(alone_update.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(alone_update.status().message().find(
                  "its optimizer is re-cut only when loaded from a checkpoint"),
              std::string::npos)
        << alone_update.status();
    return absl::OkStatus();
  });
  for (const absl::Status& s : outcomes) EXPECT_TRUE(s.ok()) << s;

  // ZeRO-3: one rank cannot run the policy's forward alone (its units are spread over the
  // group), so logprobs of the policy and the gradient call are refused; out of its group (or in
  // another one) every update refuses before it gathers anything.
  auto zero3 = make_group(2, "zbad3");
  auto zero3_outcomes = on_ranks(2, [&](int r) {
    absl::StatusOr<std::unique_ptr<Learner>> l = Learner::create(init_request(Precision::kFP8));
    if (!l.ok()) return l.status();
    (*l)->set_group(zero3[r].get());
    if (absl::Status s = (*l)->set_shard_mode(ShardMode::kParams); !s.ok()) return s;
    EXPECT_EQ((*l)->shard_mode(), ShardMode::kParams);
    Sequence seq;
    seq.tokens = {1, 2, 3, 4};
    seq.prompt_length = 2;
    absl::StatusOr<std::vector<std::vector<float>>> lp =
        (*l)->logprobs(std::span<const Sequence>(&seq, 1), 1.0, false);
    EXPECT_EQ(lp.status().code(), absl::StatusCode::kFailedPrecondition) << lp.status();
    EXPECT_NE(lp.status().message().find("logprobs: under trainer.shard params"), std::string::npos)
        << lp.status();
    absl::StatusOr<PolicyGradient> g = (*l)->gradient(grpo(1001));
    EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
    EXPECT_EQ((*l)->set_shard_mode(ShardMode::kGradsOptimizer).code(),
              absl::StatusCode::kFailedPrecondition);
    (*l)->set_group(nullptr);
    absl::StatusOr<GrpoResult> alone_update = (*l)->grpo_update(grpo(1001));
    EXPECT_EQ(alone_update.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(alone_update.status().message().find("trainer.shard params: the optimizer holds"),
              std::string::npos)
        << alone_update.status();
    return absl::OkStatus();
  });
  for (const absl::Status& s : zero3_outcomes) EXPECT_TRUE(s.ok()) << s;

  // Alone, grads_optimizer shards nothing (one trainer's plan is the same in every mode).
  absl::StatusOr<std::unique_ptr<Learner>> alone = Learner::create(init_request(Precision::kFP8));
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_TRUE((*alone)->set_shard_mode(ShardMode::kGradsOptimizer).ok());
  EXPECT_EQ((*alone)->shard_layout(), nullptr);
  EXPECT_EQ((*alone)->shard_mode(), ShardMode::kGradsOptimizer);
}

// ZeRO-2's gradient buckets (train/gradient_buckets.h) are cut at tensor boundaries from the end
// of the flat array: they cover it without gaps, each holds whole tensors, at most the limit
// unless one tensor alone is larger, and a bucket closes only when the next tensor would not fit.
TEST(GradientBuckets, CutAtTensorBoundariesFromTheEnd) {
  for (const model::ModelConfig& config : {tiny_config(), odd_config()}) {
    const model::ParamLayout layout(config);
    std::vector<int64_t> starts;
    for (const model::ParamInfo& p : layout.params()) starts.push_back(p.offset);
    std::sort(starts.begin(), starts.end());
    auto is_start = [&](int64_t x) {
      return x == layout.total() || std::find(starts.begin(), starts.end(), x) != starts.end();
    };
    auto largest_tensor_in = [&](int64_t first, int64_t end) {
      int64_t n = 0;
      for (const model::ParamInfo& p : layout.params()) {
        if (p.offset >= first && p.offset < end) n = std::max(n, p.numel);
      }
      return n;
    };
    for (int64_t limit : {int64_t{1}, int64_t{100}, int64_t{1000}, int64_t{3000}, layout.total()}) {
      SCOPED_TRACE(testing::Message() << "limit " << limit);
      const std::vector<GradientBuckets::Bucket> b = GradientBuckets::cut(layout, limit);
      ASSERT_FALSE(b.empty());
      EXPECT_EQ(b.front().end, layout.total());
      EXPECT_EQ(b.back().first, 0);
      for (size_t k = 0; k < b.size(); ++k) {
        EXPECT_LT(b[k].first, b[k].end) << "bucket " << k;
        if (k + 1 < b.size()) {
          EXPECT_EQ(b[k + 1].end, b[k].first) << "bucket " << k;
        }
        EXPECT_TRUE(is_start(b[k].first) && is_start(b[k].end)) << "bucket " << k;
        const int64_t size = b[k].end - b[k].first;
        EXPECT_TRUE(size <= limit || size == largest_tensor_in(b[k].first, b[k].end))
            << "bucket " << k << " of " << size;
        if (k + 1 < b.size()) {
          // The tensor just below did not fit: the bucket would have grown past the limit.
          const auto at = std::find(starts.begin(), starts.end(), b[k].first);
          ASSERT_TRUE(at != starts.begin() && at != starts.end()) << "bucket " << k;
          EXPECT_GT(b[k].end - *std::prev(at), limit) << "bucket " << k;
        }
      }
      if (limit == 1) {
        EXPECT_EQ(b.size(), layout.params().size());
      }
      if (limit == layout.total()) {
        EXPECT_EQ(b.size(), 1u);
      }
    }
  }
}

// The sink on random per-rank gradients written tensor by tensor from the end, as a backward
// does (one tensor, the final norm, never written: its bucket part goes out as zeros): each
// rank's shard equals the whole array's reduce-scatter bit for bit (Gloo sums in rank order
// whatever the cut), one tensor is written at a time, so at most two buffers exist (the one
// written and one in flight or being zero-filled) and the largest bucket's was one of them. A
// tensor asked for after its bucket went out is INTERNAL, on every rank, after the same buckets.
TEST(GradientBuckets, ShardEqualsTheWholeArrayReduceScatter) {
  const model::ParamLayout layout(odd_config());
  const int64_t total = layout.total();
  for (int size : {2, 3}) {
    SCOPED_TRACE(testing::Message() << "group of " << size);
    absl::StatusOr<ShardLayout> cut = shard_parameters(layout, size);
    ASSERT_TRUE(cut.ok()) << cut.status();
    auto groups = make_group(size, absl::StrCat("zsink", size));
    auto statuses = on_ranks(size, [&](int r) -> absl::Status {
      std::mt19937 rng(static_cast<uint32_t>(17 + r));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> whole(static_cast<size_t>(total));
      for (float& x : whole) x = u(rng);
      const int64_t skip = layout.final_norm(), skip_n = odd_config().hidden_size;
      std::fill(whole.begin() + skip, whole.begin() + skip + skip_n, 0.0f);
      std::vector<float> want(static_cast<size_t>(cut->size(r)));
      if (auto s = groups[r]->reduce_scatter(whole, want, cut->counts(), "want"); !s.ok()) return s;
      for (int64_t limit : {int64_t{300}, int64_t{5000}}) {
        GradientBuckets sink(groups[r].get(), *cut, layout, limit);
        int64_t largest = 0;
        for (const GradientBuckets::Bucket& b : sink.buckets()) {
          largest = std::max(largest, b.end - b.first);
        }
        std::vector<float> got(want.size(), -1.0f);
        sink.begin(got, "test");
        const std::vector<model::ParamInfo>& params = layout.params();
        for (auto p = params.rbegin(); p != params.rend(); ++p) {
          if (p->offset != skip) {
            float* g = sink.grad(p->offset);
            for (int64_t i = 0; i < p->numel; ++i) g[i] += whole[p->offset + i];
          }
          sink.final_from(p->offset);
        }
        if (auto s = sink.finish(); !s.ok()) return s;
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
            << "rank " << r << " limit " << limit;
        const int64_t f = sizeof(float);
        EXPECT_GE(sink.last_peak_bytes(), largest * f) << "rank " << r << " limit " << limit;
        EXPECT_LE(sink.last_peak_bytes(), 2 * largest * f) << "rank " << r << " limit " << limit;
        // A tensor asked for after its bucket went out.
        sink.begin(got, "late");
        sink.final_from(0);
        sink.grad(params.back().offset)[0] = 1.0f;
        const absl::Status late = sink.finish();
        EXPECT_EQ(late.code(), absl::StatusCode::kInternal) << late;
        EXPECT_NE(late.message().find("after its bucket was final"), std::string::npos) << late;
      }
      return absl::OkStatus();
    });
    for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  }
}

// A tiny Llama deep enough that one decoder layer is a small part of the whole gradient (12
// layers of ~9.4k parameters, tied 48 x 32 embedding: 114k parameters).
model::ModelConfig deep_config() {
  model::ModelConfig c = tiny_config();
  c.num_hidden_layers = 12;
  c.tie_word_embeddings = true;
  return c;
}

// With buckets a sharded rank never holds the whole gradient array: its gradient storage is its
// shard of the sum plus the bucket buffers, which at most hold the tied embedding's bucket (live
// from the lm_head at the start of the backward to the token lookup at its end), the buckets of
// the decoder layer being differentiated and those of the layer before it still being
// reduce-scattered. Groups of 2 and 4 (SFT + 3 GRPO steps), against the unsharded group (the
// whole array) and the sharded group without buckets (the whole array and the shard); the
// bucketed updates stay bit for bit the unbucketed ones.
TEST_P(ShardedLearner, BucketsHoldTheShardAndTheBucketsInFlightNotTheWholeArray) {
  const Precision training = GetParam();
  const std::string name(precision_name(training));
  const model::ModelConfig config = deep_config();
  const model::ParamLayout layout(config);
  const int64_t f = sizeof(float), whole = layout.total() * f;
  const int64_t bucket_bytes = 4096;
  int64_t layer_bytes = 0;  // the largest decoder layer's parameters
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    int64_t n = 0;
    for (const model::ParamInfo& p : layout.params()) n += p.layer == l ? p.numel : 0;
    layer_bytes = std::max(layer_bytes, n * f);
  }
  const int64_t embed_bytes = config.vocab_size * config.hidden_size * f;
  for (int size : {2, 4}) {
    SCOPED_TRACE(testing::Message() << "group of " << size);
    auto plain_groups = make_group(size, absl::StrCat("zgplain", size, name));
    auto plain = on_ranks(size, [&](int r) {
      return run(training, plain_groups[r].get(), 7, 0, ShardMode::kNone, config);
    });
    auto whole_groups = make_group(size, absl::StrCat("zgwhole", size, name));
    auto unbucketed = on_ranks(size, [&](int r) {
      return run(training, whole_groups[r].get(), 7, 0, ShardMode::kGradsOptimizer, config);
    });
    auto groups = make_group(size, absl::StrCat("zgbuckets", size, name));
    auto bucketed = on_ranks(size, [&](int r) {
      return run(training, groups[r].get(), 7, bucket_bytes, ShardMode::kGradsOptimizer, config);
    });
    for (int r = 0; r < size; ++r) {
      SCOPED_TRACE(testing::Message() << "rank " << r);
      ASSERT_TRUE(plain[r].status.ok()) << plain[r].status;
      ASSERT_TRUE(unbucketed[r].status.ok()) << unbucketed[r].status;
      ASSERT_TRUE(bucketed[r].status.ok()) << bucketed[r].status;
      expect_same_run(bucketed[r], unbucketed[0], "bucketed vs unbucketed");
      if (size == 2) expect_same_run(bucketed[r], plain[0], "bucketed vs unsharded");
      const std::vector<int64_t>& cut = bucketed[r].shard_bounds;
      const int64_t shard = (cut[r + 1] - cut[r]) * f;
      const int64_t buffers = bucketed[r].gradient_peak_bytes - shard;
      std::printf(
          "group of %d rank %d: gradient bytes unsharded %lld, sharded without buckets %lld, "
          "with %lld-byte buckets %lld (shard %lld + buckets %lld; embedding %lld, layer %lld)\n",
          size, r, static_cast<long long>(plain[r].gradient_peak_bytes),
          static_cast<long long>(unbucketed[r].gradient_peak_bytes),
          static_cast<long long>(bucket_bytes),
          static_cast<long long>(bucketed[r].gradient_peak_bytes), static_cast<long long>(shard),
          static_cast<long long>(buffers), static_cast<long long>(embed_bytes),
          static_cast<long long>(layer_bytes));
      EXPECT_EQ(plain[r].gradient_peak_bytes, whole);
      EXPECT_EQ(unbucketed[r].gradient_peak_bytes, whole + shard);
      // The tied embedding's bucket is held through every backward ...
      EXPECT_GE(buffers, embed_bytes);
      // ... beside the buckets of at most two decoder layers (each bucket whole tensors of at
      // most bucket_bytes, so a layer's buckets reach at most one bucket past either end).
      EXPECT_LE(buffers, embed_bytes + 2 * (layer_bytes + 2 * bucket_bytes));
      // The memory plan's grads row is the shard plus the pool it models (the buckets held while
      // one backward unit runs): every buffer the pool holds then has at least its bucket's size,
      // so the learner's count is never below it; a buffer reused for a smaller bucket keeps its
      // capacity, so it may be above it, by less than one layer here.
      MemoryPlanInput in;
      in.config = config;
      in.policy = PrecisionConfig{.training = training}.training_policy();
      in.trainers = size;
      in.shard = ShardMode::kGradsOptimizer;
      in.grad_bucket_bytes = bucket_bytes;
      const MemoryPlan plan = *plan_training_memory(in);
      const int64_t planned_pool = plan.grads - 4 * plan.shard_parameters;
      std::printf("  planned pool %lld, measured %lld\n", static_cast<long long>(planned_pool),
                  static_cast<long long>(buffers));
      EXPECT_GE(planned_pool, embed_bytes + layer_bytes);
      EXPECT_GE(buffers, planned_pool);
      EXPECT_LT(buffers, planned_pool + layer_bytes);
      EXPECT_LT(bucketed[r].gradient_peak_bytes, whole * 3 / 4);
      if (size == 4) {
        EXPECT_LT(bucketed[r].gradient_peak_bytes, whole / 2);
      }
    }
  }
}

// Mixture of experts (qwen3_moe; qwen2_moe with a shared expert and its gate): a sharded SFT
// group of 2 (with and without buckets) equals the unsharded group of 2 bit for bit over two
// requests of two minibatches each. GRPO is refused in any group of a mixture-of-experts model
// (sharded or not): the routing records are not split across ranks yet.
TEST_P(ShardedLearner, MixtureOfExpertsGroupOfTwoIsBitIdenticalToUnsharded) {
  const Precision training = GetParam();
  const std::string name(precision_name(training));
  model::ModelConfig qwen3 = odd_config();
  qwen3.model_type = "qwen3_moe";
  qwen3.num_hidden_layers = 3;
  qwen3.moe.num_experts = 4;
  qwen3.moe.num_experts_per_tok = 2;
  qwen3.moe.moe_intermediate_size = 136;
  qwen3.moe.norm_topk_prob = true;
  qwen3.moe.mlp_only_layers = {1};  // a dense layer between two sparse ones
  model::ModelConfig qwen2 = qwen3;
  qwen2.model_type = "qwen2_moe";
  qwen2.attention_bias = true;
  qwen2.moe.norm_topk_prob = false;
  qwen2.moe.shared_expert_intermediate_size = 200;
  for (const model::ModelConfig& config : {qwen3, qwen2}) {
    SCOPED_TRACE(config.model_type);
    struct Outcome {
      std::vector<std::vector<float>> weights;
      std::vector<double> loss, grad_norm;
      int64_t gradient_peak_bytes = 0;
      absl::Status status, grpo;
    };
    auto sft_run = [&](Collectives* group, int64_t bucket_bytes, ShardMode mode) {
      Outcome out;
      absl::StatusOr<std::unique_ptr<Learner>> l =
          Learner::create(init_request(training, 7, config));
      if (!l.ok()) {
        out.status = l.status();
        return out;
      }
      (*l)->set_group(group, bucket_bytes);
      if (absl::Status s = (*l)->set_shard_mode(mode); !s.ok()) {
        out.status = s;
        return out;
      }
      for (uint64_t seed : {99, 100}) {
        SftRequest sft;
        sft.batch = random_batch(seed, 7);
        sft.learning_rate = kLr;
        sft.minibatches = 2;
        absl::StatusOr<SftResult> s = (*l)->sft_update(sft);
        if (!s.ok()) {
          out.status = s.status();
          return out;
        }
        out.loss.push_back(s->loss);
        out.grad_norm.push_back(s->grad_norm);
        out.gradient_peak_bytes = (*l)->gradient_peak_bytes();
        out.weights.push_back(master_of(**l));
      }
      out.grpo = (*l)->grpo_update(grpo(1001)).status();
      return out;
    };
    auto plain_groups = make_group(2, absl::StrCat("zmoeplain", name, config.model_type));
    auto plain =
        on_ranks(2, [&](int r) { return sft_run(plain_groups[r].get(), 0, ShardMode::kNone); });
    ASSERT_TRUE(plain[0].status.ok()) << plain[0].status;
    int64_t unbucketed_peak[2] = {0, 0};
    for (int64_t bytes : {int64_t{0}, int64_t{256}, int64_t{40000}}) {
      SCOPED_TRACE(testing::Message() << "bucket " << bytes << " bytes");
      auto groups = make_group(2, absl::StrCat("zmoe", name, config.model_type, bytes));
      auto sharded = on_ranks(
          2, [&](int r) { return sft_run(groups[r].get(), bytes, ShardMode::kGradsOptimizer); });
      // ZeRO-3 (routers and experts gathered with their layer): the same weights bit for bit.
      auto params_groups = make_group(2, absl::StrCat("zmoe3", name, config.model_type, bytes));
      auto params = on_ranks(
          2, [&](int r) { return sft_run(params_groups[r].get(), bytes, ShardMode::kParams); });
      // Each rank's weights after every request, losses and grad norms equal the plain run's.
      auto expect_plain = [&](const auto& runs, const std::string& mode) {
        for (int r = 0; r < 2; ++r) {
          SCOPED_TRACE(absl::StrCat(mode, " rank ", r));
          ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
          ASSERT_EQ(runs[r].weights.size(), plain[0].weights.size());
          for (size_t k = 0; k < plain[0].weights.size(); ++k) {
            EXPECT_EQ(0, std::memcmp(runs[r].weights[k].data(), plain[0].weights[k].data(),
                                     plain[0].weights[k].size() * sizeof(float)))
                << "weights after request " << k << " differ";
          }
          EXPECT_EQ(runs[r].loss, plain[0].loss);
          EXPECT_EQ(runs[r].grad_norm, plain[0].grad_norm);
        }
      };
      expect_plain(params, "params");
      expect_plain(sharded, "grads_optimizer");
      for (int r = 0; r < 2; ++r) {
        // Buckets hold less than the whole array and the shard (a layer of this 3-layer model is
        // a third of the array, so not less than the whole array alone).
        if (bytes == 0) {
          unbucketed_peak[r] = sharded[r].gradient_peak_bytes;
          EXPECT_GT(unbucketed_peak[r], plain[0].gradient_peak_bytes) << "rank " << r;
        } else {
          EXPECT_LT(sharded[r].gradient_peak_bytes, unbucketed_peak[r]) << "rank " << r;
        }
        EXPECT_EQ(sharded[r].grpo.code(), absl::StatusCode::kFailedPrecondition) << sharded[r].grpo;
        EXPECT_NE(sharded[r].grpo.message().find("mixture-of-experts"), std::string::npos)
            << sharded[r].grpo;
      }
    }
    // The requests changed the weights.
    EXPECT_NE(plain[0].weights[0], plain[0].weights[1]);
  }
}

// Sharded optimizer checkpoints (train/optimizer_shards.h, docs/design/sharding.md "Sharded
// checkpoints"): a sharded group of 2 saves after the SFT request and one GRPO request, then
// continues for two more GRPO requests. The same checkpoint is resumed as a sharded group of 2, an
// unsharded group of 2, a sharded group of 3 and one trainer, and under ZeRO-3 (params) as groups
// of 2 and 3 (the checkpoint does not depend on the mode). Exact: the restored moments of every
// rank equal the saved ranks' moments re-cut to its range, bit for bit, and a group of 2 (sharded
// or not) continues bit for bit as the group that never stopped (2-rank sums do not depend on
// the order). A group of 3 and one trainer sum the gradients in another order: within the
// group-vs-one-trainer tolerances (kBf16 / kFp8) of the continued run's weight change.
struct Resumed {
  model::AdamW::RangeState state;           // the optimizer's range right after the restore
  std::vector<int64_t> bounds;              // its shard layout (empty unless sharded)
  std::vector<std::vector<float>> weights;  // after each further GRPO request
  absl::Status status;
};

constexpr int kStepsBeforeSave = 1, kStepsAfterSave = 2;

// Rank `rank` of a group loads `dir`, takes `shard`, and runs the GRPO requests after the save.
Resumed resume(const std::string& dir, Collectives* group, ShardMode shard) {
  Resumed out;
  absl::StatusOr<LoadedCheckpoint> loaded = load_checkpoint(dir);
  if (!loaded.ok()) {
    out.status = loaded.status();
    return out;
  }
  Learner& l = *loaded->learner;
  l.set_group(group);
  if (absl::Status s = l.set_shard_mode(shard); !s.ok()) {
    out.status = s;
    return out;
  }
  if (l.shard_layout() != nullptr) out.bounds = l.shard_layout()->bounds;
  absl::StatusOr<model::AdamW::RangeState> state = l.backend().optimizer_range_state();
  if (!state.ok()) {
    out.status = state.status();
    return out;
  }
  out.state = *std::move(state);
  for (int step = kStepsBeforeSave + 1; step <= kStepsBeforeSave + kStepsAfterSave; ++step) {
    absl::StatusOr<GrpoResult> r = l.grpo_update(grpo(1000 + step));
    if (!r.ok()) {
      out.status = r.status();
      return out;
    }
    auto p = master_of(l);
    out.weights.emplace_back(p.begin(), p.end());
  }
  return out;
}

struct SavedRun {
  std::vector<float> initial;
  std::vector<int64_t> bounds;
  std::vector<model::AdamW::RangeState> states;  // per rank, at the save
  std::vector<std::vector<float>> weights;       // after each GRPO request following the save
};

// A sharded group of 2: SFT, kStepsBeforeSave GRPO requests, save to `dir`, kStepsAfterSave more.
SavedRun save_and_continue(Precision training, const std::string& dir,
                           const model::ModelConfig& config) {
  auto groups = make_group(2, "zsave" + dir);
  auto ranks = on_ranks(2, [&](int r) -> std::pair<SavedRun, absl::Status> {
    SavedRun out;
    absl::StatusOr<std::unique_ptr<Learner>> l = Learner::create(init_request(training, 7, config));
    if (!l.ok()) return {out, l.status()};
    (*l)->set_group(groups[r].get());
    if (absl::Status s = (*l)->set_shard_mode(ShardMode::kGradsOptimizer); !s.ok()) return {out, s};
    auto init = master_of(**l);
    out.initial.assign(init.begin(), init.end());
    out.bounds = (*l)->shard_layout()->bounds;
    SftRequest sft;
    sft.batch = random_batch(99, 7);
    sft.learning_rate = kLr;
    sft.minibatches = 2;
    if (auto s = (*l)->sft_update(sft); !s.ok()) return {out, s.status()};
    for (int step = 1; step <= kStepsBeforeSave; ++step) {
      if (auto g = (*l)->grpo_update(grpo(1000 + step)); !g.ok()) return {out, g.status()};
    }
    absl::StatusOr<SavedCheckpoint> saved = save_checkpoint(**l, dir, /*include_optimizer=*/true);
    if (!saved.ok()) return {out, saved.status()};
    absl::StatusOr<model::AdamW::RangeState> state = (*l)->backend().optimizer_range_state();
    if (!state.ok()) return {out, state.status()};
    out.states.push_back(*std::move(state));
    for (int step = kStepsBeforeSave + 1; step <= kStepsBeforeSave + kStepsAfterSave; ++step) {
      absl::StatusOr<GrpoResult> g = (*l)->grpo_update(grpo(1000 + step));
      if (!g.ok()) return {out, g.status()};
      auto p = master_of(**l);
      out.weights.emplace_back(p.begin(), p.end());
    }
    return {out, absl::OkStatus()};
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(ranks[r].second.ok()) << "rank " << r << ": " << ranks[r].second;
  SavedRun run = ranks[0].first;
  if (ranks[1].first.states.size() == 1) run.states.push_back(ranks[1].first.states[0]);
  return run;
}

// The saved ranks' moments re-cut to [begin, end).
model::AdamW::RangeState expected_range(const SavedRun& saved, int64_t begin, int64_t end) {
  model::AdamW::RangeState out;
  out.step = saved.states[0].step;
  for (size_t r = 0; r < saved.states.size(); ++r) {
    const int64_t b = saved.bounds[r], e = saved.bounds[r + 1];
    const int64_t from = std::max(b, begin), to = std::min(e, end);
    if (from >= to) continue;
    const auto& s = saved.states[r];
    out.m.insert(out.m.end(), s.m.begin() + (from - b), s.m.begin() + (to - b));
    out.v.insert(out.v.end(), s.v.begin() + (from - b), s.v.begin() + (to - b));
  }
  return out;
}

void expect_same_state(const model::AdamW::RangeState& got, const model::AdamW::RangeState& want,
                       const std::string& what) {
  EXPECT_EQ(got.step, want.step) << what;
  ASSERT_EQ(got.m.size(), want.m.size()) << what;
  ASSERT_EQ(got.v.size(), want.v.size()) << what;
  EXPECT_EQ(0, std::memcmp(got.m.data(), want.m.data(), want.m.size() * sizeof(float))) << what;
  EXPECT_EQ(0, std::memcmp(got.v.data(), want.v.data(), want.v.size() * sizeof(float))) << what;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/fp8rl-zckpt-", getpid(), "-", name);
  std::filesystem::remove_all(dir);
  return dir;
}

class ShardedCheckpoint : public ::testing::TestWithParam<Precision> {};

TEST_P(ShardedCheckpoint, ResumesOnTwoThreeAndOneRanksAsContinuing) {
  const Precision training = GetParam();
  const Tolerance tol = training == Precision::kBF16 ? kBf16 : kFp8;
  const model::ModelConfig config = odd_config();
  const std::string dir = fresh_dir(std::string(precision_name(training)));
  const SavedRun saved = save_and_continue(training, dir, config);
  ASSERT_EQ(saved.states.size(), 2u);
  ASSERT_EQ(saved.weights.size(), static_cast<size_t>(kStepsAfterSave));
  for (const model::AdamW::RangeState& st : saved.states) {
    // The saved moments are the steps' real ones (not the zeros a fresh optimizer holds).
    EXPECT_TRUE(std::any_of(st.m.begin(), st.m.end(), [](float x) { return x != 0.0f; }));
    EXPECT_TRUE(std::any_of(st.v.begin(), st.v.end(), [](float x) { return x != 0.0f; }));
  }
  // Each rank wrote its own file; the manifest holds the cut and the step count.
  const int64_t P = static_cast<int64_t>(saved.initial.size());
  absl::StatusOr<OptimizerShardManifest> manifest = read_optimizer_shard_manifest(dir, P);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->bounds, saved.bounds);
  EXPECT_EQ(manifest->step, kSftUpdates + kGrpoUpdates * kStepsBeforeSave);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir) / kOptimizerShardsDir /
                                        optimizer_shard_file_name(r, 2)));
  }
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / kOptimizerStateFile));
  // No staged file is left beside the folder.
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(dir).parent_path())) {
    EXPECT_EQ(e.path().string().find(dir + "."), std::string::npos) << e.path();
  }

  for (const auto& [group_size, group_shard] :
       {std::pair{2, ShardMode::kGradsOptimizer}, std::pair{2, ShardMode::kNone},
        std::pair{3, ShardMode::kGradsOptimizer}, std::pair{1, ShardMode::kNone},
        std::pair{2, ShardMode::kParams}, std::pair{3, ShardMode::kParams}}) {
    // Plain copies for the lambda below: clang before 16 (clang-tidy here) cannot capture a
    // structured binding.
    const int size = group_size;
    const ShardMode shard = group_shard;
    const std::string what = absl::StrCat(size, " rank(s), ", std::string(shard_mode_name(shard)));
    SCOPED_TRACE(what);
    auto groups =
        make_group(size, absl::StrCat("zresume", size, std::string(shard_mode_name(shard)), dir));
    auto resumed = on_ranks(
        size, [&](int r) { return resume(dir, size > 1 ? groups[r].get() : nullptr, shard); });
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(resumed[r].status.ok()) << "rank " << r << ": " << resumed[r].status;
      const int64_t begin = resumed[r].bounds.empty() ? 0 : resumed[r].bounds[r];
      const int64_t end = resumed[r].bounds.empty() ? P : resumed[r].bounds[r + 1];
      expect_same_state(resumed[r].state, expected_range(saved, begin, end),
                        absl::StrCat("rank ", r, " restored moments"));
      for (size_t k = 0; k < resumed[r].weights.size(); ++k) {
        EXPECT_EQ(resumed[r].weights[k], resumed[0].weights[k]) << "rank " << r << " step " << k;
      }
    }
    if (size == 3) {
      ASSERT_EQ(resumed[0].bounds.size(), 4u);  // re-cut for 3 ranks
    }
    const Resumed& got = resumed[0];
    for (size_t k = 0; k < saved.weights.size(); ++k) {
      if (size == 2) {
        EXPECT_EQ(0, std::memcmp(got.weights[k].data(), saved.weights[k].data(), P * sizeof(float)))
            << "weights after further step " << k << " differ from the run that continued";
        continue;
      }
      double diff2 = 0, change2 = 0;
      for (int64_t i = 0; i < P; ++i) {
        const double d = static_cast<double>(got.weights[k][i]) - saved.weights[k][i];
        const double c = static_cast<double>(saved.weights[k][i]) - saved.initial[i];
        diff2 += d * d;
        change2 += c * c;
      }
      std::printf("resumed on %s, further step %zu: ||diff|| = %.3g, change %.3g\n", what.c_str(),
                  k, std::sqrt(diff2), std::sqrt(change2));
      EXPECT_GT(change2, 0.0);
      EXPECT_LE(std::sqrt(diff2), tol.weight_change * std::sqrt(change2)) << "step " << k;
    }
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Precisions, ShardedCheckpoint,
                         ::testing::Values(Precision::kFP8, Precision::kBF16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

// Damaged or mismatched shards fail the restore (set_shard_mode, as the trainer's LoadCheckpoint
// runs it) naming the file: INVALID_ARGUMENT, NOT_FOUND for a missing one; a manifest for another
// model fails the load.
TEST(ShardedCheckpoint, TruncatedCorruptMissingAndMismatchedShardsFailClearly) {
  const std::string dir = fresh_dir("damaged");
  const SavedRun saved = save_and_continue(Precision::kBF16, dir, odd_config());
  ASSERT_EQ(saved.states.size(), 2u);
  const std::filesystem::path shards = std::filesystem::path(dir) / kOptimizerShardsDir;
  const std::string file1 = (shards / optimizer_shard_file_name(1, 2)).string();
  const std::string manifest_path = (shards / kOptimizerShardsManifest).string();
  const std::string original = read_text_file(file1).value();
  const std::string manifest_text = read_text_file(manifest_path).value();
  // Restores on one trainer (it reads every shard) and returns the status.
  auto restore = [&]() -> absl::Status {
    absl::StatusOr<LoadedCheckpoint> loaded = load_checkpoint(dir);
    if (!loaded.ok()) return loaded.status();
    return loaded->learner->set_shard_mode(ShardMode::kNone);
  };
  ASSERT_TRUE(restore().ok());
  auto expect_error = [&](const std::string& what, const std::string& needle,
                          absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    const absl::Status s = restore();
    EXPECT_EQ(s.code(), code) << what << ": " << s;
    EXPECT_NE(s.message().find(needle), std::string::npos) << what << ": " << s;
  };
  // Truncated: the last 100 bytes of rank 1's file are gone.
  ASSERT_TRUE(write_file_atomic(file1, original.substr(0, original.size() - 100)).ok());
  expect_error("truncated", file1);
  // One byte of the data changed: the hash differs.
  std::string flipped = original;
  flipped[flipped.size() - 5] = static_cast<char>(flipped[flipped.size() - 5] ^ 0x10);
  ASSERT_TRUE(write_file_atomic(file1, flipped).ok());
  expect_error("corrupt", "corrupt file");
  // Missing.
  std::filesystem::remove(file1);
  expect_error("missing", file1, absl::StatusCode::kNotFound);
  ASSERT_TRUE(write_file_atomic(file1, original).ok());
  ASSERT_TRUE(restore().ok());
  // A manifest whose cut does not match the files.
  nlohmann::json m = nlohmann::json::parse(manifest_text);
  m["bounds"][1] = m["bounds"][1].get<int64_t>() + 128;
  ASSERT_TRUE(write_file_atomic(manifest_path, m.dump()).ok());
  expect_error("moved cut", "the manifest says");
  // A manifest for another parameter count fails the load itself.
  m = nlohmann::json::parse(manifest_text);
  m["num_params"] = m["num_params"].get<int64_t>() + 1;
  ASSERT_TRUE(write_file_atomic(manifest_path, m.dump()).ok());
  expect_error("other model", "num_params");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp8rl::train
