// Tests the coordinator's RL loop against in-process fake generation workers and trainer: sample
// dispatch over several workers, re-dispatch when a worker dies mid-call, duplicates never
// counted twice, rewards/advantages/metrics rows per step, validation and checkpoint cadence,
// cancellation, failure when no worker exists, the phases reported while a job runs, a job on a
// checkpoint with its own tokenizer and chat template (prompts, stop ids, SFT, decoding), and the
// JobManager resuming a job from its last checkpoint after losing the trainer; asynchronous RL
// (max_staleness K >= 1): generation at most K steps ahead, the same batches as the synchronous
// loop, stale samples regenerated, a lost worker or trainer, no hang when the queue runs dry.
#include "services/coordinator/rl_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "rl/sample_seeds.h"
#include "rl/tokenizer.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/job_manager.h"

namespace fp8rl::coordinator {
namespace {

// Answers "a+b=" prompts: correctly when the sample seed is even, with "0" otherwise, so
// rewards vary inside groups in a way the test can recompute.
class FakeWorker : public GenerationClient {
 public:
  explicit FakeWorker(std::string id) : id_(std::move(id)) {}

  absl::Status generate(const std::string&, const std::vector<GenSample>& samples,
                        const GenParams& params, const std::function<void(GenResult)>& on_result,
                        std::chrono::milliseconds) override {
    ++calls;
    const rl::ByteTokenizer tok;
    for (const GenSample& s : samples) {
      if (die_after >= 0 && emitted >= die_after) {
        dead = true;
        return absl::UnavailableError(absl::StrCat(id_, " died"));
      }
      if (version < params.min_weight_version) {
        return absl::FailedPreconditionError("stale weights");
      }
      // The numbers around the prompt's '+' (its byte ids: a chat template's markers are not
      // bytes, and the byte tokenizer's BOS decodes to nothing).
      std::string prompt;
      for (int32_t id : s.prompt_tokens) {
        if (id >= 0 && id < 256) prompt.push_back(static_cast<char>(id));
      }
      size_t plus = prompt.find('+'), begin = plus;
      while (begin > 0 && std::isdigit(static_cast<unsigned char>(prompt[begin - 1]))) --begin;
      const size_t equals = prompt.find('=', plus);
      int64_t a = 0, b = 0;
      EXPECT_TRUE(absl::SimpleAtoi(prompt.substr(begin, plus - begin), &a)) << prompt;
      EXPECT_TRUE(absl::SimpleAtoi(prompt.substr(plus + 1, equals - plus - 1), &b)) << prompt;
      const bool right = params.temperature == 0.0 ? (a % 2 == 0) : (s.seed % 2 == 0);
      GenResult r;
      r.sample_id = s.sample_id;
      r.tokens = tok.encode(right ? absl::StrCat(a + b) : "0");
      r.tokens.push_back(right ? right_end : wrong_end);
      r.tokens.insert(r.tokens.end(), after_end.begin(), after_end.end());
      for (size_t i = 0; i < r.tokens.size(); ++i) r.logprobs.push_back(-0.1f * (i + 1));
      r.weight_version = version;
      {
        std::lock_guard<std::mutex> lock(mu);
        prompts.push_back(s.prompt_tokens);
        stop_ids.push_back(params.stop_token_ids);
        generated.emplace_back(s.sample_id, r.weight_version);
      }
      on_result(r);
      if (duplicate) on_result(r);
      ++emitted;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> weight_version() override { return version.load(); }

  std::string id_;
  std::atomic<int64_t> version{0};
  std::atomic<int> calls{0};
  std::atomic<int> emitted{0};
  std::atomic<bool> dead{false};
  int die_after = -1;
  bool duplicate = false;
  // The id that ends a right (wrong) answer: the byte tokenizer's EOS unless a test sets another.
  int32_t right_end = rl::kEosId;
  int32_t wrong_end = rl::kEosId;
  std::vector<int32_t> after_end;  // ids after the end id (decoding must ignore them)
  std::mutex mu;
  std::vector<std::vector<int32_t>> prompts;   // guarded by mu: every sample's prompt tokens
  std::vector<std::vector<int32_t>> stop_ids;  // guarded by mu: every sample's stop ids
  // guarded by mu: every generated sample's id and the version it was generated with
  std::vector<std::pair<std::string, int64_t>> generated;
  bool has_generated(std::string_view id_prefix) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [id, v] : generated) {
      if (id.starts_with(id_prefix)) return true;
    }
    return false;
  }
};

class FakeCluster;

class FakeTrainer : public TrainerClient {
 public:
  explicit FakeTrainer(FakeCluster* cluster) : cluster_(cluster) {}
  absl::StatusOr<int64_t> init_policy(const std::string&, const rl::JobConfig&) override {
    ++inits;
    return 0;
  }
  absl::StatusOr<TrainStepStats> sft_step(const std::string&, const std::vector<TrainSequence>& b,
                                          double) override {
    sft_batches.push_back(b);
    return TrainStepStats{{{"loss", 2.0 / static_cast<double>(sft_batches.size())}}};
  }
  absl::StatusOr<TrainStepStats> train_step(const std::string& job, int64_t step,
                                            const std::vector<TrainSequence>& batch,
                                            const rl::JobConfig&) override {
    job_id = job;
    if (fail_step) {
      if (absl::Status s = fail_step(step); !s.ok()) return s;
    }
    steps_trained.push_back(step);
    batches.push_back(batch);
    return TrainStepStats{{{"loss", 0.5}, {"token_mult_prob_error", 1.01}}};
  }
  absl::StatusOr<int64_t> publish(bool, int64_t above_version) override;
  absl::Status save_checkpoint(const std::string& path) override {
    checkpoints.push_back(path);
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> load_checkpoint(const std::string& path) override {
    loaded.push_back(path);
    for (const std::string& bad : unreadable) {
      if (path.ends_with(bad)) {
        return absl::DataLossError(absl::StrCat(path, "/model.safetensors: truncated"));
      }
    }
    return version;
  }

  FakeCluster* cluster_;
  std::function<absl::Status(int64_t)> fail_step;  // optional: an error for this step
  std::vector<int64_t> steps_trained;
  std::string job_id;              // of the last train_step
  int64_t lose_publish_at = -1;    // this version never reaches the workers in lose_for (all if
  std::set<std::string> lose_for;  // empty)
  int inits = 0;
  int64_t version = 0;
  int64_t version_stride = 1;           // a publish adds this to the version
  std::vector<int64_t> above_versions;  // of every publish
  std::vector<std::vector<TrainSequence>> batches;
  std::vector<std::vector<TrainSequence>> sft_batches;
  std::vector<std::string> checkpoints;
  std::vector<std::string> loaded;
  std::vector<std::string> unreadable;  // load_checkpoint of a path ending so fails (DATA_LOSS)
};

class FakeCluster : public Cluster {
 public:
  FakeCluster() : trainer_(std::make_shared<FakeTrainer>(this)) {}
  std::shared_ptr<FakeWorker> add(const std::string& id) {
    auto w = std::make_shared<FakeWorker>(id);
    w->version = trainer_->version;
    workers_.emplace_back(id, w);
    return w;
  }
  std::vector<WorkerRef> live_generation_workers() override {
    std::vector<WorkerRef> out;
    for (const auto& [id, w] : workers_) {
      if (!w->dead) out.push_back({id, "fake"});
    }
    return out;
  }
  bool is_live(const std::string& id) override {
    for (const auto& [wid, w] : workers_) {
      if (wid == id) return !w->dead;
    }
    return false;
  }
  std::shared_ptr<GenerationClient> generation_client(const WorkerRef& ref) override {
    for (const auto& [id, w] : workers_) {
      if (id == ref.id) return w;
    }
    return nullptr;
  }
  absl::StatusOr<std::shared_ptr<TrainerClient>> trainer() override {
    if (trainer_gone) return absl::UnavailableError("no live trainer worker");
    return trainer_;
  }

  std::atomic<bool> trainer_gone{false};

  std::shared_ptr<FakeTrainer> trainer_;
  std::vector<std::pair<std::string, std::shared_ptr<FakeWorker>>> workers_;
};

absl::StatusOr<int64_t> FakeTrainer::publish(bool, int64_t above_version) {
  above_versions.push_back(above_version);
  version = std::max(version, above_version) + version_stride;
  for (auto& [id, w] : cluster_->workers_) {
    // Weight sync delivers, except a version lost on its way (to lose_for, or to everyone).
    const bool lost = lose_publish_at == version && (lose_for.empty() || lose_for.contains(id));
    if (!lost) w->version = version;
  }
  return version;
}

rl::JobConfig small_config(const std::string& checkpoint_dir) {
  rl::JobConfig c;
  c.task.name = "addition";
  c.task.digits = 2;
  c.task.train_size = 200;
  c.task.val_size = 10;
  c.algorithm.steps = 3;
  c.algorithm.prompts_per_step = 3;
  c.algorithm.samples_per_prompt = 4;
  c.algorithm.max_new_tokens = 4;
  c.algorithm.seed = 42;
  c.validation.every_steps = 2;
  c.checkpoint.every_steps = 2;
  c.checkpoint.dir = checkpoint_dir;
  c.sft = rl::SftConfig{2, 1e-3, 5};
  return c;
}

RlLoopOptions fast_options() {
  RlLoopOptions o;
  o.poll_interval = std::chrono::milliseconds(2);
  o.worker_wait = std::chrono::milliseconds(300);
  o.sync_wait = std::chrono::milliseconds(300);
  o.generate_deadline = std::chrono::seconds(5);
  return o;
}

std::vector<GenSample> make_samples(int n) {
  const rl::ByteTokenizer tok;
  std::vector<GenSample> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({absl::StrCat("x", i), tok.encode(absl::StrCat(10 + i, "+", 3 * i, "="), true),
                   rl::sample_seed(5, 1, i, 0)});
  }
  return out;
}

TEST(RlLoop, RunsStepsRecordsMetricsAndCheckpoints) {
  FakeCluster cluster;
  auto w0 = cluster.add("w0");
  auto w1 = cluster.add("w1");
  auto store = JobStore::open(":memory:").value();
  const rl::JobConfig config = small_config("/ckpt");
  const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
  int progress = 0;
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  RlLoop loop(&cluster, {store.get(), metrics.get(), {}, [&] { ++progress; }, {}, {}},
              fast_options());
  const auto run_start = std::chrono::steady_clock::now();
  ASSERT_TRUE(loop.run(job, config).ok());
  const double run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();

  FakeTrainer& t = *cluster.trainer_;
  EXPECT_EQ(t.inits, 1);
  ASSERT_EQ(t.sft_batches.size(), 2u);
  EXPECT_EQ(t.sft_batches[0].size(), 5u);
  ASSERT_EQ(t.batches.size(), 3u);
  EXPECT_EQ(t.version, 4);  // initial publish + one per step
  EXPECT_EQ(t.checkpoints, std::vector<std::string>{"/ckpt/" + job.id + "/step-2"});
  EXPECT_EQ(store->get_job(job.id)->checkpoint_step, 2);
  EXPECT_GT(w0->calls + w1->calls, 0);
  EXPECT_GT(w0->emitted, 0);  // work spread over both workers
  EXPECT_GT(w1->emitted, 0);

  const auto rows = store->get_metrics(job.id).value();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(progress, 4);
  EXPECT_TRUE(rows[0].values.contains("val_accuracy"));
  EXPECT_TRUE(rows[0].values.contains("sft_loss"));
  EXPECT_FALSE(rows[1].values.contains("val_accuracy"));
  EXPECT_TRUE(rows[2].values.contains("val_accuracy"));
  EXPECT_TRUE(rows[3].values.contains("val_accuracy"));  // the last step always validates
  EXPECT_EQ(store->get_job(job.id)->step, 3);

  for (int64_t step = 1; step <= 3; ++step) {
    const auto& batch = t.batches[static_cast<size_t>(step - 1)];
    ASSERT_EQ(batch.size(), 12u);
    // Expected reward mean from the fake's rule (even seed = correct).
    double expected = 0.0;
    for (int p = 0; p < 3; ++p) {
      double group = 0.0;
      for (int g = 0; g < 4; ++g) {
        const bool right = rl::sample_seed(42, step, p, g) % 2 == 0;
        expected += right ? 1.0 : 0.0;
        group += right ? 1.0 : 0.0;
        const TrainSequence& s = batch[static_cast<size_t>(p * 4 + g)];
        ASSERT_EQ(s.gen_logprobs.size(), s.tokens.size() - static_cast<size_t>(s.prompt_length));
        // Correct samples get a positive advantage unless the whole group agrees.
        if (group > 0 && group < 4 && g == 3) {
          EXPECT_NE(s.advantage, 0.0f);
        }
        EXPECT_EQ(
            s.advantage > 0, right && [&] {
              int c = 0;
              for (int k = 0; k < 4; ++k) c += rl::sample_seed(42, step, p, k) % 2 == 0;
              return c < 4;
            }());
      }
    }
    EXPECT_DOUBLE_EQ(rows[static_cast<size_t>(step)].values.at("reward_mean"), expected / 12.0);
    EXPECT_DOUBLE_EQ(rows[static_cast<size_t>(step)].values.at("loss"), 0.5);
    EXPECT_DOUBLE_EQ(rows[static_cast<size_t>(step)].values.at("weight_version"),
                     static_cast<double>(step + 1));
    // A step takes measurable time, and no step outlasts the whole run.
    EXPECT_GT(rows[static_cast<size_t>(step)].values.at("time_step_seconds"), 0.0);
    EXPECT_LE(rows[static_cast<size_t>(step)].values.at("time_step_seconds"), run_seconds);
  }

  // Exactly these keys in every row (users and dashboards read them from the REST API).
  auto keys = [](const MetricsRow& row) {
    std::set<std::string> out;
    for (const auto& [key, value] : row.values) out.insert(key);
    return out;
  };
  const std::set<std::string> row0 = {"sft_loss", "time_sft_seconds", "val_accuracy",
                                      "time_validate_seconds", "weight_version"};
  // The fake trainer reports loss and token_mult_prob_error; the rest is the loop's own.
  std::set<std::string> every_step = {
      "time_generate_seconds", "redispatched_samples", "reward_mean",        "reward_std",
      "train_accuracy",        "response_length_mean", "time_score_seconds", "loss",
      "token_mult_prob_error", "time_train_seconds",   "weight_version",     "time_publish_seconds",
      "time_sync_seconds",     "time_step_seconds"};
  std::set<std::string> validated = every_step;
  validated.insert({"val_accuracy", "time_validate_seconds"});
  std::set<std::string> checkpointed = validated;
  checkpointed.insert("time_checkpoint_seconds");
  EXPECT_EQ(keys(rows[0]), row0);
  EXPECT_EQ(keys(rows[1]), every_step);
  EXPECT_EQ(keys(rows[2]), checkpointed);
  EXPECT_EQ(keys(rows[3]), validated);
  // The step's wall time covers its phases.
  for (size_t step = 1; step <= 3; ++step) {
    double phases = 0.0;
    for (const auto& [key, value] : rows[step].values) {
      if (key.starts_with("time_") && key != "time_step_seconds") phases += value;
    }
    EXPECT_GE(rows[step].values.at("time_step_seconds"), phases) << step;
  }

  // The Prometheus view of the same run (docs/metrics.md names).
  EXPECT_EQ(metrics->step->get().value(), 3.0);
  EXPECT_EQ(metrics->steps->get().value(), 3.0);
  EXPECT_EQ(metrics->samples->get().value(), 36.0);
  EXPECT_DOUBLE_EQ(metrics->reward_mean->get().value(), rows[3].values.at("reward_mean"));
  EXPECT_DOUBLE_EQ(metrics->validation_accuracy->get().value(), rows[3].values.at("val_accuracy"));
  EXPECT_DOUBLE_EQ(metrics->step_metrics.at("token_mult_prob_error")->get().value(), 1.01);
  EXPECT_EQ(metrics->weight_version->get().value(), 4.0);
  EXPECT_EQ(metrics->redispatched_requests->get().value(), 0.0);
  // Last step (3): validates, no checkpoint; totals add up every recorded phase time.
  EXPECT_DOUBLE_EQ(metrics->step_phase_seconds->with({"validate"}).value(),
                   rows[3].values.at("time_validate_seconds"));
  EXPECT_EQ(metrics->step_phase_seconds->with({"checkpoint"}).value(), 0.0);
  EXPECT_EQ(metrics->step_phase_seconds->with({"sft"}).value(), 0.0);
  for (std::string_view phase : kRlPhases) {
    const std::string key = absl::StrCat("time_", std::string(phase), "_seconds");
    double total = 0.0;
    uint64_t count = 0;
    for (const MetricsRow& row : rows) {
      if (row.values.contains(key)) {
        total += row.values.at(key);
        ++count;
      }
    }
    EXPECT_DOUBLE_EQ(metrics->phase_seconds_total->with({std::string(phase)}).value(), total)
        << phase;
    EXPECT_EQ(metrics->phase_seconds->with({std::string(phase)}).snapshot().count, count) << phase;
  }
  EXPECT_EQ(metrics->phase_seconds->with({"sft"}).snapshot().count, 1u);
  EXPECT_EQ(metrics->phase_seconds->with({"validate"}).snapshot().count, 3u);  // steps 0, 2, 3
  EXPECT_EQ(metrics->phase_seconds->with({"checkpoint"}).snapshot().count, 1u);
}

// A tiny Hugging Face tokenizer folder: byte-level BPE whose ids 0-255 are the bytes (GPT-2's
// byte-to-character alphabet), one merge ("u s" -> 260), ChatML markers <|im_start|> = 300 and
// <|im_end|> = 301, <|endoftext|> = 302 and a ChatML chat template. Generation stops at 302 and
// 301 (generation_config.json's list, then tokenizer_config.json's eos_token).
void write_chat_tokenizer(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : 256 + extra++;
    std::string utf8;
    if (cp < 0x80) {
      utf8.push_back(static_cast<char>(cp));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[utf8] = b;
  }
  vocab["us"] = 260;
  auto special = [](int id, const char* text) {
    return nlohmann::json{{"id", id},        {"content", text}, {"single_word", false},
                          {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                          {"special", true}};
  };
  const nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {special(300, "<|im_start|>"), special(301, "<|im_end|>"), special(302, "<|endoftext|>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", vocab},
        {"merges", {"u s"}},
        {"byte_fallback", false},
        {"ignore_merges", false}}}};
  const nlohmann::json config = {
      {"eos_token", "<|im_end|>"},
      {"chat_template",
       "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}};
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [302, 301]})";
}

// The ChatML prompt of `text` in that tokenizer, written out by hand: <|im_start|> "us" e r \n,
// the text's bytes, <|im_end|> \n <|im_start|> "assistant\n".
std::vector<int32_t> chat_prompt_ids(const std::string& text) {
  std::vector<int32_t> ids = {300, 260, 'e', 'r', '\n'};
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  for (int32_t id : {301, int32_t{'\n'}, 300}) ids.push_back(id);
  for (char c : std::string("assistant\n")) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// model.chat_template_kwargs reach the template: a template that switches on a job variable.
TEST(RlLoop, ChatTemplateKwargsReachTheTemplate) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / absl::StrCat("chat_kwargs_", ::getpid());
  write_chat_tokenizer(dir);
  std::ofstream(dir / "tokenizer_config.json")
      << nlohmann::json{{"eos_token", "<|im_end|>"},
                        {"chat_template", "{% if terse %}T{% endif %}{{ messages[0].content }}"}}
             .dump();
  rl::JobConfig config = small_config("/ckpt");
  config.model.checkpoint = dir.string();
  const rl::Example ex{"1+2=", "3"};
  absl::StatusOr<rl::PromptFormat> plain = job_prompt_format(config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  config.model.chat_template_kwargs = {{"terse", true}};
  absl::StatusOr<rl::PromptFormat> terse = job_prompt_format(config);
  ASSERT_TRUE(terse.ok()) << terse.status();
  const std::vector<int32_t> a = rl::encode_prompt(ex, *plain).value();
  const std::vector<int32_t> b = rl::encode_prompt(ex, *terse).value();
  EXPECT_EQ(a, (std::vector<int32_t>{'1', '+', '2', '='}));
  EXPECT_EQ(b, (std::vector<int32_t>{'T', '1', '+', '2', '='}));
  std::filesystem::remove_all(dir);
}

// A job whose model.checkpoint folder has a tokenizer.json and a chat template: prompts (rollout,
// validation, SFT) are that tokenizer's encoding of the rendered template, generation stops at
// the checkpoint's EOS ids, and completions are decoded up to the first of them for the reward.
TEST(RlLoop, UsesTheCheckpointsTokenizerChatTemplateAndStopIds) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / absl::StrCat("chat_ckpt_", ::getpid());
  write_chat_tokenizer(dir);
  FakeCluster cluster;
  auto w0 = cluster.add("w0");
  w0->right_end = 302;
  w0->wrong_end = 301;
  w0->after_end = {'7'};  // after the stop id: a decoder that ignored it would score 0
  auto store = JobStore::open(":memory:").value();
  rl::JobConfig config = small_config("/ckpt");
  config.model.checkpoint = dir.string();
  const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
  RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
  ASSERT_TRUE(loop.run(job, config).ok());

  const rl::Task task = rl::make_task(config.task).value();
  std::map<std::vector<int32_t>, const rl::Example*> by_prompt;
  for (const auto* split : {&task.train(), &task.validation()}) {
    for (const rl::Example& ex : *split) by_prompt[chat_prompt_ids(ex.prompt)] = &ex;
  }
  ASSERT_EQ(w0->prompts.size(), 3u * 12u + 3u * 10u);  // 3 steps x P*G, 3 validations x 10
  for (size_t i = 0; i < w0->prompts.size(); ++i) {
    EXPECT_TRUE(by_prompt.contains(w0->prompts[i])) << i;
    EXPECT_EQ(w0->stop_ids[i], (std::vector<int32_t>{302, 301})) << i;
  }
  // SFT: the chat prompt, the answer's bytes and <|im_end|> (tokenizer_config's eos_token).
  FakeTrainer& t = *cluster.trainer_;
  ASSERT_EQ(t.sft_batches.size(), 2u);
  for (const std::vector<TrainSequence>& batch : t.sft_batches) {
    ASSERT_EQ(batch.size(), 5u);
    for (const TrainSequence& seq : batch) {
      const auto prompt_end = seq.tokens.begin() + seq.prompt_length;
      auto it = by_prompt.find(std::vector<int32_t>(seq.tokens.begin(), prompt_end));
      ASSERT_NE(it, by_prompt.end());
      std::vector<int32_t> answer(it->second->answer.begin(), it->second->answer.end());
      answer.push_back(301);
      EXPECT_EQ(std::vector<int32_t>(prompt_end, seq.tokens.end()), answer);
    }
  }
  // Rewards: right answers (even seeds) decode to the sum up to their stop id 302.
  const auto rows = store->get_metrics(job.id).value();
  ASSERT_EQ(rows.size(), 4u);
  for (int64_t step = 1; step <= 3; ++step) {
    double right = 0.0;
    for (int p = 0; p < 3; ++p) {
      for (int g = 0; g < 4; ++g) right += rl::sample_seed(42, step, p, g) % 2 == 0 ? 1.0 : 0.0;
    }
    EXPECT_GT(right, 0.0);
    EXPECT_DOUBLE_EQ(rows[static_cast<size_t>(step)].values.at("reward_mean"), right / 12.0);
  }
  // Validation (greedy): the fake answers right when the first operand is even.
  double even = 0.0;
  for (const rl::Example& ex : task.validation()) {
    int64_t a = 0;
    ASSERT_TRUE(absl::SimpleAtoi(ex.prompt.substr(0, ex.prompt.find('+')), &a)) << ex.prompt;
    even += a % 2 == 0 ? 1.0 : 0.0;
  }
  ASSERT_EQ(task.validation().size(), 10u);
  EXPECT_DOUBLE_EQ(rows[0].values.at("val_accuracy"), even / 10.0);
  std::filesystem::remove_all(dir);
}

TEST(RlLoop, RedispatchesAfterWorkerDeathWithoutCountingTwice) {
  FakeCluster cluster;
  auto dying = cluster.add("w0");
  dying->die_after = 3;
  auto dup = cluster.add("w1");
  dup->duplicate = true;
  auto store = JobStore::open(":memory:").value();
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  RlLoop loop(&cluster, {store.get(), metrics.get(), {}, {}, {}, {}}, fast_options());
  const auto samples = make_samples(24);
  GenParams params;
  auto results = loop.dispatch("t", samples, params);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 24u);
  for (const GenSample& s : samples) EXPECT_TRUE(results->contains(s.sample_id));
  EXPECT_TRUE(dying->dead);
  EXPECT_EQ(dying->emitted, 3);
  // Everything the dead worker did not finish came from w1. The fake counts a result after
  // delivering it, and the dispatch returns as soon as the last one is delivered, so the last
  // emission (and the duplicate that follows it) may not be counted yet when we read.
  EXPECT_GE(dup->emitted, 20);
  EXPECT_LE(dup->emitted, 21);
  const DispatchStats& stats = loop.dispatch_stats();
  EXPECT_EQ(stats.failed_calls, 1);  // whether the call failed first or its worker expired first
  EXPECT_EQ(stats.redispatched_samples, 9);  // 12-sample chunk, 3 finished
  EXPECT_GE(stats.duplicate_results, 20);
  EXPECT_EQ(metrics->redispatched_requests->get().value(), 1.0);
  EXPECT_EQ(metrics->redispatched_samples->get().value(), 9.0);
}

TEST(RlLoop, StaleResultsAreRejectedAndRetried) {
  FakeCluster cluster;
  auto w = cluster.add("w0");
  auto store = JobStore::open(":memory:").value();
  RlLoopOptions options = fast_options();
  RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, options);
  GenParams params;
  params.min_weight_version = 1;  // the worker holds 0 and refuses
  auto results = loop.dispatch("t", make_samples(4), params);
  EXPECT_EQ(results.status().code(), absl::StatusCode::kUnavailable);
  w->version = 1;
  EXPECT_TRUE(loop.dispatch("t2", make_samples(4), params).ok());
}

TEST(RlLoop, FailsWithoutWorkersAndHonoursCancel) {
  FakeCluster cluster;
  auto store = JobStore::open(":memory:").value();
  rl::JobConfig config = small_config("/ckpt");
  config.sft.reset();
  const JobRecord job = store->create_job("{}", 3).value();
  RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
  const absl::Status none = loop.run(job, config);
  EXPECT_EQ(none.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.message().find("no live generation worker"), std::string::npos) << none;

  cluster.add("w0");
  int rows_seen = 0;
  RlLoopHooks hooks{store.get(),          nullptr, [&] { return rows_seen >= 2; },
                    [&] { ++rows_seen; }, {},      {}};
  RlLoop cancelling(&cluster, hooks, fast_options());
  const absl::Status cancelled = cancelling.run(job, config);
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(store->get_job(job.id)->step, 1);  // stopped between phases of step 2
}

TEST(RlLoop, ReportsEveryPhase) {
  FakeCluster cluster;
  cluster.add("w0");
  auto store = JobStore::open(":memory:").value();
  const rl::JobConfig config = small_config("/ckpt");
  const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
  std::vector<JobProgress> seen;
  RlLoopHooks hooks{store.get(), nullptr, {}, {}, [&](const JobProgress& p) { seen.push_back(p); },
                    {}};
  RlLoop loop(&cluster, hooks, fast_options());
  ASSERT_TRUE(loop.run(job, config).ok());
  EXPECT_EQ(loop.progress(), 2 + 1 + 3);  // SFT steps, row 0, RL steps
  std::vector<std::string> lines;
  for (const JobProgress& p : seen) {
    lines.push_back(absl::StrCat(p.phase, " ", p.done, "/", p.total, " ", p.detail));
  }
  const std::vector<std::string> expected = {
      "waiting_for_trainer 0/0 ", "initializing 0/0 ", "sft 0/2 ", "sft 1/2 loss 2.0000",
      "sft 2/2 loss 1.0000", "syncing_weights 0/0 ", "validating 0/0 step 0",
      // step 1: no validation, no checkpoint
      "rl 0/3 rollout", "rl 0/3 train", "rl 0/3 publish",
      // step 2: validation and checkpoint
      "rl 1/3 rollout", "rl 1/3 train", "rl 1/3 publish", "rl 1/3 validate", "rl 1/3 checkpoint",
      // step 3: the last step validates
      "rl 2/3 rollout", "rl 2/3 train", "rl 2/3 publish", "rl 2/3 validate"};
  EXPECT_EQ(lines, expected);
}

TEST(RlLoop, TrainerErrorsSayWhetherTheTrainerWasLost) {
  FakeCluster cluster;
  cluster.add("w0");
  auto store = JobStore::open(":memory:").value();
  rl::JobConfig config = small_config("/ckpt");
  config.sft.reset();
  const JobRecord job = store->create_job("{}", 3).value();
  for (const auto& [status, lost] : std::vector<std::pair<absl::Status, bool>>{
           {absl::UnavailableError("connection refused"), true},
           {absl::AbortedError("no policy loaded"), true},
           {absl::DeadlineExceededError("deadline"), true},
           {absl::InvalidArgumentError("batch[0].tokens: bad"), false},
           {absl::InternalError("bug"), false}}) {
    // Captured by copy under a name: clang before 16 cannot capture a structured binding.
    cluster.trainer_->fail_step = [failure = status](int64_t step) {
      return step == 2 ? failure : absl::OkStatus();
    };
    RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
    const absl::Status s = loop.run(job, config);
    EXPECT_EQ(s.code(), status.code());
    EXPECT_EQ(is_trainer_lost(s), lost) << s;
    EXPECT_TRUE(std::string(s.message()).starts_with("train step 2: ")) << s;
  }
}

TEST(RlLoop, AVersionThatReachesNoWorkerIsResumable) {
  FakeCluster cluster;
  auto w0 = cluster.add("w0");
  auto w1 = cluster.add("w1");
  auto store = JobStore::open(":memory:").value();
  rl::JobConfig config = small_config("/ckpt");
  config.sft.reset();
  const JobRecord job = store->create_job("{}", 3).value();
  cluster.trainer_->lose_publish_at = 3;  // published after step 2
  RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
  const absl::Status s = loop.run(job, config);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(is_trainer_lost(s)) << s;
  EXPECT_NE(s.message().find("weight version 3 reached none of the 2 live generation workers"),
            std::string::npos)
      << s;
  EXPECT_EQ(store->get_job(job.id)->step, 1);  // step 2 did not complete

  // One worker holding it is enough: the lagging one refuses work (min_weight_version).
  FakeCluster lagging;
  auto a = lagging.add("a");
  auto b = lagging.add("b");
  const JobRecord job2 = store->create_job("{}", 3).value();
  lagging.trainer_->lose_publish_at = 3;
  lagging.trainer_->lose_for = {"b"};
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  RlLoopOptions options = fast_options();
  options.sync_lag_warn = std::chrono::milliseconds(50);
  RlLoop loop2(&lagging, {store.get(), metrics.get(), {}, {}, {}, {}}, options);
  const absl::Status ok = loop2.run(job2, config);
  EXPECT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(store->get_job(job2.id)->step, 3);
  EXPECT_GT(a->emitted, 0);
  // The lag is said once, for the one version worker b never received.
  EXPECT_EQ(metrics->sync_lagging_workers->get().value(), 1.0);
}

// Weight sync restarts empty and a resumed job's trainer starts a fresh policy: if both lose count,
// the next version must still be numbered above what the workers hold, or a worker with older
// weights would pass min_weight_version and serve them (found by system.chaos).
TEST(RlLoop, PublishesAboveTheVersionsWorkersHold) {
  FakeCluster cluster;
  auto w0 = cluster.add("w0");
  auto w1 = cluster.add("w1");
  w0->version = 50;  // weights numbered by an earlier weight-sync and trainer
  w1->version = 7;
  auto store = JobStore::open(":memory:").value();
  const rl::JobConfig config = small_config("/ckpt");
  const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
  RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
  ASSERT_TRUE(loop.run(job, config).ok());
  const FakeTrainer& t = *cluster.trainer_;
  // The first publish is floored by the highest held version, each later one by its predecessor.
  EXPECT_EQ(t.above_versions, (std::vector<int64_t>{50, 51, 52, 53}));
  EXPECT_EQ(t.version, 54);
  EXPECT_EQ(w0->version, 54);
  EXPECT_EQ(w1->version, 54);
}

// Runs `config` through a JobManager to its end; returns the final record.
JobRecord run_job_manager(FakeCluster* cluster, JobStore* store, const rl::JobConfig& config,
                          RlLoopOptions options,
                          const std::function<void(const JobRecord&)>& poll = {}) {
  JobManager manager(store, cluster, nullptr, nullptr, options);
  manager.start();
  const JobRecord submitted = manager.submit(config).value();
  JobRecord job = submitted;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!is_terminal(job.state) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    job = manager.get(submitted.id).value();
    if (poll) poll(job);
  }
  manager.stop();
  return job;
}

rl::JobConfig manager_config() {
  rl::JobConfig config = small_config(::testing::TempDir());
  config.model.init_config_path = "tiny.json";  // the fake trainer does not read it
  config.algorithm.steps = 5;
  config.checkpoint.every_steps = 2;
  return config;
}

TEST(JobManager, ResumesFromTheLastCheckpointWhenTheTrainerComesBack) {
  FakeCluster cluster;
  cluster.add("w0");
  cluster.add("w1");
  auto store = JobStore::open(":memory:").value();
  RlLoopOptions options = fast_options();
  options.trainer_resume_wait = std::chrono::seconds(10);
  // The trainer dies during step 4 (after the step-2 checkpoint and step 3's row) and is back a
  // moment later.
  int failures = 0;
  std::set<std::string> phases;
  int64_t row3_recorded_ms = 0;
  cluster.trainer_->fail_step = [&](int64_t step) {
    if (step != 4 || failures > 0) return absl::OkStatus();
    row3_recorded_ms = store->get_metrics(cluster.trainer_->job_id).value().back().recorded_ms;
    ++failures;
    cluster.trainer_gone = true;
    std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      cluster.trainer_gone = false;
    }).detach();
    return absl::UnavailableError("Socket closed");
  };
  const JobRecord job =
      run_job_manager(&cluster, store.get(), manager_config(), options,
                      [&](const JobRecord& j) { phases.insert(j.progress.phase); });
  ASSERT_EQ(job.state, JobState::kSucceeded) << job.error;
  EXPECT_EQ(job.step, 5);
  EXPECT_TRUE(job.progress.phase.empty());  // no progress once ended
  FakeTrainer& t = *cluster.trainer_;
  EXPECT_EQ(t.inits, 1);
  ASSERT_EQ(t.loaded.size(), 1u);
  EXPECT_TRUE(t.loaded[0].ends_with(job.id + "/step-2")) << t.loaded[0];
  // Steps 1-3, then 3-5 again from the checkpoint (step 4's failed try did not count): nothing
  // after the checkpoint lost, nothing before it repeated, step 3's row recorded anew.
  EXPECT_EQ(t.steps_trained, (std::vector<int64_t>{1, 2, 3, 3, 4, 5}));
  const auto rows = store->get_metrics(job.id).value();
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].step, static_cast<int64_t>(i));
  EXPECT_GT(row3_recorded_ms, 0);
  EXPECT_GE(rows[3].recorded_ms, row3_recorded_ms + 1000);  // after the 1.5 s outage
  EXPECT_TRUE(phases.contains("trainer_lost"));
}

// The trainer dies in step 5, after the step-4 checkpoint, which then cannot be read: the resume
// falls back to step 2 (log line, metric, job event) and the job ends with every row once.
// With step 2 unreadable too, it starts over from the beginning.
TEST(JobManager, AnUnreadableCheckpointFallsBackToThePreviousOne) {
  for (const bool both_bad : {false, true}) {
    SCOPED_TRACE(both_bad ? "step-4 and step-2 unreadable" : "step-4 unreadable");
    FakeCluster cluster;
    cluster.add("w0");
    auto store = JobStore::open(":memory:").value();
    service::MetricsRegistry registry;
    auto metrics = CoordinatorMetrics::create(&registry).value();
    RlLoopOptions options = fast_options();
    options.trainer_resume_wait = std::chrono::seconds(10);
    FakeTrainer& t = *cluster.trainer_;
    t.unreadable = {"/step-4"};
    if (both_bad) t.unreadable.push_back("/step-2");
    bool failed = false;
    t.fail_step = [&](int64_t step) {
      if (step != 5 || failed) return absl::OkStatus();
      failed = true;
      return absl::UnavailableError("Socket closed");
    };
    JobManager manager(store.get(), &cluster, nullptr, metrics.get(), options);
    manager.start();
    const std::string id = manager.submit(manager_config()).value().id;
    JobRecord job;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    do {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      job = manager.get(id).value();
    } while (!is_terminal(job.state) && std::chrono::steady_clock::now() < deadline);
    manager.stop();
    ASSERT_EQ(job.state, JobState::kSucceeded) << job.error;
    const auto rows = store->get_metrics(id).value();
    ASSERT_EQ(rows.size(), 6u);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].step, static_cast<int64_t>(i));
    const std::vector<JobEvent> events = manager.events(id).value();
    std::vector<std::string> kinds;
    for (const JobEvent& e : events) kinds.push_back(e.kind);
    if (!both_bad) {
      ASSERT_EQ(t.loaded.size(), 2u);
      EXPECT_TRUE(t.loaded[0].ends_with(id + "/step-4")) << t.loaded[0];
      EXPECT_TRUE(t.loaded[1].ends_with(id + "/step-2")) << t.loaded[1];
      EXPECT_EQ(t.inits, 1);
      EXPECT_EQ(t.steps_trained, (std::vector<int64_t>{1, 2, 3, 4, 3, 4, 5}));
      EXPECT_EQ(metrics->checkpoint_fallbacks->get().value(), 1.0);
      EXPECT_EQ(kinds, (std::vector<std::string>{"trainer_lost", "checkpoint_fallback"}));
      EXPECT_NE(events[1].message.find("step-4' unreadable"), std::string::npos)
          << events[1].message;
      EXPECT_NE(events[1].message.find("truncated); resuming from '"), std::string::npos)
          << events[1].message;
      // The job's record now points at the checkpoint that loaded.
      EXPECT_TRUE(job.checkpoint.ends_with("/step-4")) << job.checkpoint;  // rewritten at 4
    } else {
      ASSERT_EQ(t.loaded.size(), 2u);
      EXPECT_EQ(t.inits, 2);  // from the start
      EXPECT_EQ(t.steps_trained, (std::vector<int64_t>{1, 2, 3, 4, 1, 2, 3, 4, 5}));
      EXPECT_EQ(metrics->checkpoint_fallbacks->get().value(), 2.0);
      EXPECT_EQ(kinds, (std::vector<std::string>{"trainer_lost", "checkpoint_fallback",
                                                 "checkpoint_fallback"}));
      EXPECT_NE(events[2].message.find("resuming from the start"), std::string::npos)
          << events[2].message;
    }
  }
}

TEST(JobManager, FailsWithTheReasonWhenNoTrainerComesBack) {
  FakeCluster cluster;
  cluster.add("w0");
  auto store = JobStore::open(":memory:").value();
  RlLoopOptions options = fast_options();
  options.trainer_resume_wait = std::chrono::milliseconds(1200);
  cluster.trainer_->fail_step = [&](int64_t step) {
    if (step != 2) return absl::OkStatus();
    cluster.trainer_gone = true;  // for good
    return absl::UnavailableError("Socket closed");
  };
  const auto start = std::chrono::steady_clock::now();
  const JobRecord job = run_job_manager(&cluster, store.get(), manager_config(), options);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_NE(job.error.find("trainer or weight sync lost and the job could not resume within 1.2 s"),
            std::string::npos)
      << job.error;
  EXPECT_NE(job.error.find("train step 2: Socket closed"), std::string::npos) << job.error;
  EXPECT_GE(waited, 1.2);
  EXPECT_LT(waited, 20.0);

  // With resuming off, the same loss fails the job at once, and a non-trainer error never waits.
  FakeCluster cluster2;
  cluster2.add("w0");
  options.trainer_resume_wait = std::chrono::milliseconds(0);
  cluster2.trainer_->fail_step = [&](int64_t step) {
    return step == 2 ? absl::UnavailableError("Socket closed") : absl::OkStatus();
  };
  const JobRecord off = run_job_manager(&cluster2, store.get(), manager_config(), options);
  EXPECT_EQ(off.state, JobState::kFailed);
  EXPECT_TRUE(off.error.starts_with("trainer or weight sync lost: train step 2: Socket closed"))
      << off.error;
  options.trainer_resume_wait = std::chrono::seconds(30);
  cluster2.trainer_->fail_step = [&](int64_t step) {
    return step == 2 ? absl::InvalidArgumentError("batch[0].tokens: out of range")
                     : absl::OkStatus();
  };
  const auto start2 = std::chrono::steady_clock::now();
  const JobRecord bad = run_job_manager(&cluster2, store.get(), manager_config(), options);
  EXPECT_EQ(bad.state, JobState::kFailed);
  EXPECT_EQ(bad.error, "train step 2: batch[0].tokens: out of range");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start2).count(), 10.0);
}

TEST(JobManager, CancelEndsTheWaitForALostTrainer) {
  FakeCluster cluster;
  cluster.add("w0");
  auto store = JobStore::open(":memory:").value();
  RlLoopOptions options = fast_options();
  options.trainer_resume_wait = std::chrono::seconds(60);
  cluster.trainer_->fail_step = [&](int64_t step) {
    if (step != 1) return absl::OkStatus();
    cluster.trainer_gone = true;
    return absl::UnavailableError("Socket closed");
  };
  JobManager manager(store.get(), &cluster, nullptr, nullptr, options);
  manager.start();
  const JobRecord job = manager.submit(manager_config()).value();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (manager.get(job.id)->progress.phase != "trainer_lost" &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const JobRecord waiting = manager.get(job.id).value();
  ASSERT_EQ(waiting.progress.phase, "trainer_lost");
  EXPECT_NE(waiting.progress.detail.find("Socket closed"), std::string::npos)
      << waiting.progress.detail;
  const auto cancel_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(manager.cancel(job.id).ok());
  JobRecord ended = waiting;
  while (!is_terminal(ended.state) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ended = manager.get(job.id).value();
  }
  EXPECT_EQ(ended.state, JobState::kCancelled);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - cancel_at).count(),
            5.0);
  manager.stop();
}

// --- Asynchronous RL (algorithm.max_staleness = K >= 1) ---

// The fake worker's mean reward of a step (even seed = right answer), P prompts x G samples.
double fake_reward_mean(uint64_t seed, int64_t step, int p_count, int g_count) {
  double right = 0.0;
  for (int p = 0; p < p_count; ++p) {
    for (int g = 0; g < g_count; ++g) right += rl::sample_seed(seed, step, p, g) % 2 == 0;
  }
  return right / (p_count * g_count);
}

// The trained samples of a row, summed over its samples_staleness_<k> buckets.
double staleness_total(const MetricsRow& row) {
  double total = 0.0;
  for (const auto& [key, value] : row.values) {
    if (key.starts_with("samples_staleness_")) total += value;
  }
  return total;
}

rl::JobConfig async_config(int64_t max_staleness, int64_t steps) {
  rl::JobConfig config = small_config("/ckpt");
  config.algorithm.steps = steps;
  config.algorithm.max_staleness = max_staleness;
  config.checkpoint.every_steps = 0;
  return config;
}

// Waits up to 5 s for `done`.
bool eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(AsyncRl, GeneratesUpToKStepsAheadAndTrainsWithinTheBound) {
  FakeCluster cluster;
  auto w0 = cluster.add("w0");
  auto w1 = cluster.add("w1");
  auto store = JobStore::open(":memory:").value();
  const rl::JobConfig config = async_config(2, 6);
  const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  auto generated = [&](std::string_view prefix) {
    return w0->has_generated(prefix) || w1->has_generated(prefix);
  };
  // While step 2 trains (the version after step 1 is published), the producer may generate
  // steps 3 and 4 (gates: steps 0 and 1) but not step 5 (gate: step 2, not published yet).
  bool step4_ahead = false, step5_early = true;
  cluster.trainer_->fail_step = [&](int64_t step) {
    if (step == 2) {
      step4_ahead = eventually([&] { return generated("s4-"); });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      step5_early = generated("s5-");
    }
    return absl::OkStatus();
  };
  RlLoop loop(&cluster, {store.get(), metrics.get(), {}, {}, {}, {}}, fast_options());
  const absl::Status status = loop.run(job, config);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(step4_ahead);
  EXPECT_FALSE(step5_early);

  FakeTrainer& t = *cluster.trainer_;
  EXPECT_EQ(t.steps_trained, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const auto rows = store->get_metrics(job.id).value();
  ASSERT_EQ(rows.size(), 7u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].step, static_cast<int64_t>(i));
  for (int64_t step = 1; step <= 6; ++step) {
    const MetricsRow& row = rows[static_cast<size_t>(step)];
    EXPECT_EQ(t.batches[static_cast<size_t>(step - 1)].size(), 12u);
    // Each step trains its own prompts and seeds, whichever version generated them.
    EXPECT_DOUBLE_EQ(row.values.at("reward_mean"), fake_reward_mean(42, step, 3, 4));
    EXPECT_EQ(row.values.at("max_staleness"), 2.0);
    EXPECT_LE(row.values.at("staleness_max"), 2.0);
    EXPECT_FALSE(row.values.contains("samples_staleness_3"));
    EXPECT_EQ(staleness_total(row), 12.0);
    EXPECT_EQ(row.values.at("stale_regenerated_samples"), 0.0);
    EXPECT_GE(row.values.at("trainer_idle_seconds"), 0.0);
    EXPECT_DOUBLE_EQ(row.values.at("weight_version"), static_cast<double>(step + 1));
  }
  // Step 4 was generated with the version after step 1 or later: at most 2 behind.
  EXPECT_EQ(metrics->sample_staleness->get().snapshot().count, 72u);
  EXPECT_EQ(metrics->stale_regenerated_samples->get().value(), 0.0);
}

TEST(AsyncRl, TrainsTheSameBatchesAsTheSynchronousLoop) {
  // The fake's answers depend on the sample seed only, so every K must train the same batches
  // in the same order; K = 0 rows carry no asynchronous keys.
  std::vector<std::vector<std::vector<TrainSequence>>> batches;
  std::vector<std::vector<MetricsRow>> rows;
  for (int64_t k : {0, 1, 2}) {
    FakeCluster cluster;
    cluster.add("w0");
    cluster.add("w1");
    auto store = JobStore::open(":memory:").value();
    const rl::JobConfig config = async_config(k, 4);
    const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
    RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
    const absl::Status status = loop.run(job, config);
    ASSERT_TRUE(status.ok()) << "K=" << k << ": " << status;
    batches.push_back(cluster.trainer_->batches);
    rows.push_back(store->get_metrics(job.id).value());
  }
  for (const MetricsRow& row : rows[0]) EXPECT_FALSE(row.values.contains("max_staleness"));
  for (size_t k = 1; k < batches.size(); ++k) {
    ASSERT_EQ(batches[k].size(), batches[0].size());
    for (size_t step = 0; step < batches[0].size(); ++step) {
      ASSERT_EQ(batches[k][step].size(), batches[0][step].size());
      for (size_t i = 0; i < batches[0][step].size(); ++i) {
        const TrainSequence& a = batches[0][step][i];
        const TrainSequence& b = batches[k][step][i];
        EXPECT_EQ(a.tokens, b.tokens) << "K=" << k << " step " << step + 1 << " sample " << i;
        EXPECT_EQ(a.prompt_length, b.prompt_length);
        EXPECT_EQ(a.advantage, b.advantage);
        EXPECT_EQ(a.gen_logprobs, b.gen_logprobs);
      }
    }
    for (size_t step = 1; step < rows[0].size(); ++step) {
      EXPECT_EQ(rows[k][step].values.at("reward_mean"), rows[0][step].values.at("reward_mean"));
      EXPECT_EQ(rows[k][step].values.at("max_staleness"), static_cast<double>(k));
    }
  }
}

TEST(AsyncRl, RegeneratesSamplesOlderThanTheBound) {
  // Each publish adds 3 to the version, so a sample generated with the gate version of a step
  // (K = 1: the version after step s-2) is 3 versions behind the one trained at step s: too
  // stale, generated again with the trained version. Training sleeps, so the producer finishes
  // each rollout before the next publish and stale samples occur.
  FakeCluster cluster;
  auto w0 = cluster.add("w0");
  auto w1 = cluster.add("w1");
  cluster.trainer_->version_stride = 3;
  cluster.trainer_->fail_step = [](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return absl::OkStatus();
  };
  auto store = JobStore::open(":memory:").value();
  const rl::JobConfig config = async_config(1, 4);
  const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
  service::MetricsRegistry registry;
  auto metrics = CoordinatorMetrics::create(&registry).value();
  RlLoop loop(&cluster, {store.get(), metrics.get(), {}, {}, {}, {}}, fast_options());
  const absl::Status status = loop.run(job, config);
  ASSERT_TRUE(status.ok()) << status;

  // Regenerated = rollout samples generated twice (the fake records every generation).
  std::map<std::string, std::vector<int64_t>> versions;
  for (auto& w : {w0, w1}) {
    std::lock_guard<std::mutex> lock(w->mu);
    for (const auto& [id, v] : w->generated) {
      if (id.starts_with("s")) versions[id].push_back(v);
    }
  }
  int64_t twice = 0;
  for (auto& [id, vs] : versions) {
    ASSERT_LE(vs.size(), 2u) << id;
    if (vs.size() == 2) {
      ++twice;
      std::sort(vs.begin(), vs.end());
      EXPECT_GE(vs[1] - vs[0], 2) << id;  // again with a version more than K newer
    }
  }
  EXPECT_EQ(versions.size(), 4u * 12u);
  const auto rows = store->get_metrics(job.id).value();
  ASSERT_EQ(rows.size(), 5u);
  double regenerated = 0.0;
  for (size_t step = 1; step < rows.size(); ++step) {
    EXPECT_LE(rows[step].values.at("staleness_max"), 1.0);
    EXPECT_EQ(staleness_total(rows[step]), 12.0);
    EXPECT_DOUBLE_EQ(rows[step].values.at("reward_mean"),
                     fake_reward_mean(42, static_cast<int64_t>(step), 3, 4));
    regenerated += rows[step].values.at("stale_regenerated_samples");
  }
  EXPECT_GT(twice, 0);
  EXPECT_EQ(regenerated, static_cast<double>(twice));
  EXPECT_EQ(metrics->stale_regenerated_samples->get().value(), regenerated);
}

TEST(AsyncRl, ALostGenerationWorkersSamplesAreGeneratedOnceElsewhere) {
  FakeCluster cluster;
  auto dying = cluster.add("w0");
  dying->die_after = 20;  // during step 2 or 3 (6-sample chunks, validation at step 2)
  cluster.add("w1");
  auto store = JobStore::open(":memory:").value();
  const rl::JobConfig config = async_config(2, 5);
  const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
  RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
  const absl::Status status = loop.run(job, config);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(dying->dead);
  const auto rows = store->get_metrics(job.id).value();
  ASSERT_EQ(rows.size(), 6u);
  double redispatched = 0.0;
  for (size_t step = 1; step < rows.size(); ++step) {
    EXPECT_EQ(rows[step].step, static_cast<int64_t>(step));
    EXPECT_EQ(staleness_total(rows[step]), 12.0);
    EXPECT_DOUBLE_EQ(rows[step].values.at("reward_mean"),
                     fake_reward_mean(42, static_cast<int64_t>(step), 3, 4));
    redispatched += rows[step].values.at("redispatched_samples");
  }
  // The dead worker's unfinished rollout samples went elsewhere once (validation samples are not
  // counted in the rows), fewer than its one unfinished 6-sample chunk.
  EXPECT_LE(redispatched, 6.0);
  for (const auto& batch : cluster.trainer_->batches) EXPECT_EQ(batch.size(), 12u);
}

TEST(AsyncRl, FailsOrCancelsInsteadOfHangingWhenTheQueueRunsDry) {
  {
    // The only worker dies after 25 samples (10 validation, 12 of step 1, 3 of step 2): the
    // producer's dispatch fails after worker_wait and the loop's wait for a rollout ends with
    // that error.
    FakeCluster cluster;
    auto w = cluster.add("w0");
    w->die_after = 25;
    auto store = JobStore::open(":memory:").value();
    const rl::JobConfig config = async_config(2, 6);
    const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
    RlLoop loop(&cluster, {store.get(), nullptr, {}, {}, {}, {}}, fast_options());
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = loop.run(job, config);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              10.0);
    EXPECT_LT(cluster.trainer_->steps_trained.size(), 6u);
  }
  {
    // Cancelled while the loop waits for a rollout that cannot come: the only worker is gone
    // after step 1 trained (step 3 cannot start before that), no validation before the end.
    FakeCluster cluster;
    auto w = cluster.add("w0");
    std::atomic<bool> cancel{false};
    std::thread canceller;
    cluster.trainer_->fail_step = [&](int64_t step) {
      if (step == 1) {
        w->dead = true;
        canceller = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          cancel = true;
        });
      }
      return absl::OkStatus();
    };
    auto store = JobStore::open(":memory:").value();
    rl::JobConfig config = async_config(1, 4);
    config.validation.every_steps = 0;
    const JobRecord job = store->create_job("{}", config.algorithm.steps).value();
    RlLoopOptions options = fast_options();
    options.worker_wait = std::chrono::seconds(60);
    std::vector<JobProgress> phases;
    RlLoop loop(&cluster,
                {store.get(),
                 nullptr,
                 [&] { return cancel.load(); },
                 {},
                 [&](const JobProgress& p) { phases.push_back(p); },
                 {}},
                options);
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = loop.run(job, config);
    canceller.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              10.0);
    EXPECT_LE(cluster.trainer_->steps_trained.size(), 2u);
    ASSERT_FALSE(phases.empty());
    EXPECT_EQ(phases.back().detail, "rollout");  // it was waiting for a rollout
  }
}

TEST(JobManager, AsyncJobResumesFromTheLastCheckpointWithoutCountingTwice) {
  FakeCluster cluster;
  cluster.add("w0");
  cluster.add("w1");
  auto store = JobStore::open(":memory:").value();
  RlLoopOptions options = fast_options();
  options.trainer_resume_wait = std::chrono::seconds(10);
  int failures = 0;
  cluster.trainer_->fail_step = [&](int64_t step) {
    if (step != 4 || failures > 0) return absl::OkStatus();
    ++failures;
    cluster.trainer_gone = true;
    std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      cluster.trainer_gone = false;
    }).detach();
    return absl::UnavailableError("Socket closed");
  };
  rl::JobConfig config = manager_config();
  config.algorithm.max_staleness = 2;
  const JobRecord job = run_job_manager(&cluster, store.get(), config, options);
  ASSERT_EQ(job.state, JobState::kSucceeded) << job.error;
  FakeTrainer& t = *cluster.trainer_;
  // Steps 1-3, then 3-5 again from the step-2 checkpoint; the rollouts made ahead before the
  // loss were dropped and generated again.
  EXPECT_EQ(t.steps_trained, (std::vector<int64_t>{1, 2, 3, 3, 4, 5}));
  const auto rows = store->get_metrics(job.id).value();
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].step, static_cast<int64_t>(i));
    if (i == 0) continue;
    EXPECT_LE(rows[i].values.at("staleness_max"), 2.0);
    EXPECT_DOUBLE_EQ(rows[i].values.at("reward_mean"),
                     fake_reward_mean(42, static_cast<int64_t>(i), 3, 4));
  }
}

}  // namespace
}  // namespace fp8rl::coordinator
