// Tests that every path field of a job config is confined to its operator root: absolute paths,
// ".." and symlinks (also a symlink reached through a folder that does not exist yet) that lead
// outside are refused naming the field, paths inside come back canonical; and the numeric upper
// bounds of rl/job_limits.h (a learning rate of 9.2e18 is a submission error).
#include "rl/job_paths.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/path_roots.h"
#include "rl/job_limits.h"

namespace fp8rl::rl {
namespace {

namespace fs = std::filesystem;

// <tmp>/{data,models,datasets} as the roots, and <tmp>/outside beside them; every folder holds a
// file, so nothing is tested on empty folders.
class JobPathsTest : public testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    base_ = fs::temp_directory_path() / absl::StrCat("fp8rl-paths-", getpid(), "-", rd() % 100000);
    for (const char* d : {"data", "models", "datasets", "outside"}) {
      fs::create_directories(base_ / d);
      std::ofstream(base_ / d / "file.jsonl") << "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n";
    }
    roots_ = {(base_ / "data").string(), (base_ / "models").string(),
              (base_ / "datasets").string()};
  }
  void TearDown() override { fs::remove_all(base_); }

  // A config with only `field` set to `path`.
  JobConfig with_path(const std::string& field, const std::string& path) {
    JobConfig c;
    for (const JobPathField& f : job_path_fields(c)) {
      if (f.field == field) *f.path = path;
    }
    return c;
  }
  fs::path root_of(const std::string& field) {
    JobConfig c;
    for (const JobPathField& f : job_path_fields(c)) {
      if (f.field != field) continue;
      switch (f.root) {
        case PathRootKind::kData:
          return base_ / "data";
        case PathRootKind::kModels:
          return base_ / "models";
        case PathRootKind::kDatasets:
          return base_ / "datasets";
      }
    }
    ADD_FAILURE() << "unknown field " << field;
    return {};
  }
  void expect_refused(const std::string& field, const std::string& path) {
    JobConfig c = with_path(field, path);
    const absl::Status s = resolve_job_paths(c, roots_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << " = " << path;
    EXPECT_TRUE(std::string(s.message()).starts_with(field + ": ")) << s;
    EXPECT_NE(s.message().find("is outside"), std::string::npos) << s;
  }

  fs::path base_;
  JobPathRoots roots_;
};

const char* const kFields[] = {"model.checkpoint", "model.init.config", "task.params.train_path",
                               "task.params.val_path", "checkpoint.dir"};

TEST_F(JobPathsTest, EveryPathFieldIsListed) {
  JobConfig c;
  std::vector<std::string> names;
  for (const JobPathField& f : job_path_fields(c)) names.push_back(f.field);
  EXPECT_EQ(names, std::vector<std::string>(std::begin(kFields), std::end(kFields)));
}

TEST_F(JobPathsTest, InsidePathsComeBackCanonical) {
  for (const char* field : kFields) {
    const fs::path root = root_of(field);
    fs::create_directories(root / "sub");
    // Relative to the root, with a harmless "..", and through a symlink that stays inside.
    fs::create_directory_symlink(root / "sub", root / "link");
    for (const std::string& given :
         {std::string("file.jsonl"), (root / "sub" / ".." / "file.jsonl").string(),
          (root / "link" / "new-output").string()}) {
      JobConfig c = with_path(field, given);
      ASSERT_TRUE(resolve_job_paths(c, roots_).ok()) << field << " = " << given;
      std::string resolved;
      for (const JobPathField& f : job_path_fields(c)) {
        if (f.field == std::string(field)) resolved = *f.path;
      }
      EXPECT_TRUE(fs::path(resolved).is_absolute()) << resolved;
      EXPECT_EQ(resolved.find(".."), std::string::npos) << resolved;
      EXPECT_TRUE(resolved.starts_with(fs::canonical(root).string() + "/")) << resolved;
    }
    fs::remove(root / "link");
    fs::remove_all(root / "sub");
  }
}

TEST_F(JobPathsTest, AbsoluteDotDotAndSymlinkEscapesAreRefusedInEveryField) {
  for (const char* field : kFields) {
    const fs::path root = root_of(field);
    const fs::path outside = base_ / "outside";
    expect_refused(field, "/etc/passwd");
    expect_refused(field, (outside / "file.jsonl").string());
    expect_refused(field, "../outside/file.jsonl");
    expect_refused(field, (root / ".." / "outside" / "file.jsonl").string());
    expect_refused(field, (root / "new" / ".." / ".." / "outside").string());
    // A sibling whose name starts with the root's name is not inside it.
    fs::create_directories(root.string() + "-evil");
    expect_refused(field, root.string() + "-evil/x");
    fs::remove_all(root.string() + "-evil");
    // Symlinks leading out: to a file, to a folder (a path below it), and a symlink reached
    // through a folder that does not exist yet ("missing/../link", which mkdir -p would follow).
    fs::create_symlink(outside / "file.jsonl", root / "file-link");
    fs::create_directory_symlink(outside, root / "dir-link");
    expect_refused(field, (root / "file-link").string());
    expect_refused(field, "dir-link/new-output");
    expect_refused(field, (root / "missing" / ".." / "dir-link" / "x").string());
    fs::remove(root / "file-link");
    fs::remove(root / "dir-link");
  }
}

TEST_F(JobPathsTest, TheEtcPasswdJobOfTheIssueNamesTheFieldAndNotTheContents) {
  JobConfig c = with_path("task.params.train_path", "/etc/passwd");
  c.task.name = "jsonl";
  const absl::Status s = resolve_job_paths(c, roots_);
  EXPECT_EQ(s.message(), absl::StrCat("task.params.train_path: '/etc/passwd' is outside "
                                      "--datasets-root (",
                                      fs::canonical(base_ / "datasets").string(), ")"));
  EXPECT_EQ(s.message().find("root:"), std::string::npos);
  // The checkpoint.dir of the issue: a new folder under /tmp, outside the data root.
  expect_refused("checkpoint.dir", "/tmp/x/etc");
}

TEST_F(JobPathsTest, MissingRootIsAnErrorNamingItsFlag) {
  JobConfig c = with_path("checkpoint.dir", "out");
  JobPathRoots roots = roots_;
  roots.data_root = (base_ / "no-such-root").string();
  const absl::Status s = resolve_job_paths(c, roots);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::string(s.message()).starts_with("--data-root: ")) << s;
}

TEST(JobLimits, LearningRateOfTheIssueAndOtherOutOfRangeValues) {
  JobConfig c;
  c.model.checkpoint = "/ckpt";
  c.task.name = "addition";
  ASSERT_TRUE(validate_job_config(c).ok()) << validate_job_config(c);
  struct Case {
    const char* field;
    std::function<void(JobConfig&)> set;
  };
  const Case cases[] = {
      {"algorithm.learning_rate", [](JobConfig& j) { j.algorithm.learning_rate = 9.2e18; }},
      {"algorithm.learning_rate", [](JobConfig& j) { j.algorithm.learning_rate = 1e18; }},
      {"algorithm.learning_rate", [](JobConfig& j) { j.algorithm.learning_rate = 1.5; }},
      {"algorithm.steps", [](JobConfig& j) { j.algorithm.steps = 2'000'000'000; }},
      {"algorithm.temperature", [](JobConfig& j) { j.algorithm.temperature = 1e9; }},
      {"algorithm.weight_decay", [](JobConfig& j) { j.algorithm.weight_decay = 11; }},
      {"algorithm.kl_beta", [](JobConfig& j) { j.algorithm.kl_beta = 1e30; }},
      {"sft.learning_rate", [](JobConfig& j) { j.sft = SftConfig{.learning_rate = 3}; }},
      {"checkpoint.every_steps",
       [](JobConfig& j) {
         j.checkpoint.every_steps = 10'000'000;
         j.checkpoint.dir = "/c";
       }},
  };
  for (const Case& k : cases) {
    JobConfig bad = c;
    k.set(bad);
    const absl::Status s = validate_job_config(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.field;
    EXPECT_TRUE(std::string(s.message()).starts_with(std::string(k.field) + ": must be in ")) << s;
  }
  JobConfig lr = c;
  lr.algorithm.learning_rate = 9.2e18;
  EXPECT_EQ(validate_job_config(lr).message(),
            "algorithm.learning_rate: must be in (0, 1], got 9.2e+18");
  // The edges are allowed.
  JobConfig edge = c;
  edge.algorithm.learning_rate = 1.0;
  edge.algorithm.weight_decay = 10;
  edge.algorithm.samples_per_prompt = 1024;
  EXPECT_TRUE(validate_job_config(edge).ok()) << validate_job_config(edge);
  // Every limit names a field validate_job_limits knows (a typo would never fire).
  for (const NumericLimit& limit : kJobNumericLimits) {
    JobConfig probe = c;
    probe.sft = SftConfig{};
    probe.checkpoint.dir = "/c";
    const std::string f = limit.field;
    double* d = nullptr;
    int64_t* i = nullptr;
    if (f == "algorithm.steps") i = &probe.algorithm.steps;
    if (f == "algorithm.prompts_per_step") i = &probe.algorithm.prompts_per_step;
    if (f == "algorithm.samples_per_prompt") i = &probe.algorithm.samples_per_prompt;
    if (f == "algorithm.temperature") d = &probe.algorithm.temperature;
    if (f == "algorithm.learning_rate") d = &probe.algorithm.learning_rate;
    if (f == "algorithm.warmup_steps") i = &probe.algorithm.warmup_steps;
    if (f == "algorithm.weight_decay") d = &probe.algorithm.weight_decay;
    if (f == "algorithm.max_grad_norm") d = &probe.algorithm.max_grad_norm;
    if (f == "algorithm.kl_beta") d = &probe.algorithm.kl_beta;
    if (f == "algorithm.adam_epsilon") d = &probe.algorithm.adam_epsilon;
    if (f == "sft.steps") i = &probe.sft->steps;
    if (f == "sft.learning_rate") d = &probe.sft->learning_rate;
    if (f == "sft.batch_size") i = &probe.sft->batch_size;
    if (f == "precision.bf16_first_layers") i = &probe.precision.bf16_first_layers;
    if (f == "precision.bf16_last_layers") i = &probe.precision.bf16_last_layers;
    if (f == "validation.every_steps") i = &probe.validation.every_steps;
    if (f == "validation.num_prompts") i = &probe.validation.num_prompts;
    if (f == "checkpoint.every_steps") i = &probe.checkpoint.every_steps;
    ASSERT_TRUE(d != nullptr || i != nullptr) << f;
    if (d != nullptr) *d = limit.hi * 2 + 1;
    if (i != nullptr) *i = static_cast<int64_t>(limit.hi * 2 + 1);
    const absl::Status s = validate_job_limits(probe);
    EXPECT_TRUE(std::string(s.message()).starts_with(f + ": must be in ")) << f << ": " << s;
  }
}

}  // namespace
}  // namespace fp8rl::rl
