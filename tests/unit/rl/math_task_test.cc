// Tests of the `math` task (rl/math_task.h): GSM8K, MATH-style and plain datasets, errors naming
// file:line and the config field, prompts, the reward with restricted extraction, the job-config
// schema, and scripts/make_math_dataset.py (deterministic, held out, loadable).
#include "rl/math_task.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rl/job_config.h"
#include "rl/tasks.h"

namespace fp8rl::rl {
namespace {

namespace stdfs = std::filesystem;

std::string source_dir() {
  if (const char* env = std::getenv("FP8RL_SOURCE_DIR")) return env;
  return FP8RL_TEST_SOURCE_DIR;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (stdfs::temp_directory_path() / "fp8rl_math_test.XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { stdfs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = (stdfs::path(path_) / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }

 private:
  std::string path_;
};

TaskConfig math_config(const std::string& train_path, const std::string& val_path = "") {
  TaskConfig c;
  c.name = "math";
  c.seed = 5;
  c.train_size = 1000;
  c.val_size = 2;
  c.train_path = train_path;
  c.val_path = val_path;
  return c;
}

TEST(MathTask, ReadsGsm8kLinesWithCanonicalAnswersAndPrompts) {
  TempDir dir;
  const std::string train =
      dir.write("train.jsonl",
                "{\"question\": \"Ann has 3 pens and buys 4. How many?\", \"answer\": "
                "\"3+4=<<3+4=7>>7\\n#### "
                "7\"}\n"
                "\n"
                "{\"question\": \"Big?\", \"answer\": \"Sum is 1,234.\\n#### 1,234\", \"id\": 17}\n"
                "{\"question\": \"Owe?\", \"answer\": \"#### -5\"}\r\n");
  TaskConfig c = math_config(train);
  c.system_prompt = "You are a careful solver.";
  c.instruction = "Put the final answer after ####.";
  absl::StatusOr<std::vector<Example>> ex = read_math_jsonl(train, c);
  ASSERT_TRUE(ex.ok()) << ex.status();
  ASSERT_EQ(ex->size(), 3u);
  EXPECT_EQ((*ex)[0].answer, "7");
  EXPECT_EQ((*ex)[1].answer, "1234");
  EXPECT_EQ((*ex)[2].answer, "-5");
  EXPECT_EQ((*ex)[1].user, "Big?\nPut the final answer after ####.");
  EXPECT_EQ((*ex)[1].system, "You are a careful solver.");
  EXPECT_EQ((*ex)[1].prompt, "You are a careful solver.\n\nBig?\nPut the final answer after ####.");
  // Without system prompt and instruction the plain prompt is the question itself.
  absl::StatusOr<std::vector<Example>> bare = read_math_jsonl(train, math_config(train));
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ((*bare)[1].prompt, "Big?");
  EXPECT_EQ((*bare)[1].system, "");
}

TEST(MathTask, ReadsMathStyleBoxedAndPlainNumericAnswers) {
  TempDir dir;
  const std::string math = dir.write(
      "math.jsonl",
      "{\"problem\": \"p1\", \"solution\": \"So $x=\\\\boxed{\\\\frac{3}{4}}$.\"}\n"
      "{\"problem\": \"p2\", \"solution\": \"First \\\\boxed{1}, then \\\\boxed{\\\\sqrt{2}}\"}\n");
  TaskConfig c = math_config(math);
  c.question_field = "problem";
  c.answer_field = "solution";
  for (const char* format : {"boxed", "auto"}) {
    c.answer_format = format;
    absl::StatusOr<std::vector<Example>> ex = read_math_jsonl(math, c);
    ASSERT_TRUE(ex.ok()) << ex.status();
    EXPECT_EQ((*ex)[0].answer, "0.75") << format;
    EXPECT_EQ((*ex)[1].answer, "\\sqrt{2}") << format;
    EXPECT_EQ((*ex)[0].prompt, "p1");
  }
  const std::string plain =
      dir.write("plain.jsonl",
                "{\"question\": \"a\", \"answer\": 72}\n{\"question\": \"b\", \"answer\": 0.5}\n"
                "{\"question\": \"c\", \"answer\": \"3/4\"}\n{\"question\": \"d\", \"answer\": "
                "\"+1,000.0\"}\n");
  for (const char* format : {"plain", "auto"}) {
    c = math_config(plain);
    c.answer_format = format;
    absl::StatusOr<std::vector<Example>> ex = read_math_jsonl(plain, c);
    ASSERT_TRUE(ex.ok()) << ex.status();
    std::vector<std::string> answers;
    for (const Example& e : *ex) answers.push_back(e.answer);
    EXPECT_EQ(answers, (std::vector<std::string>{"72", "0.5", "0.75", "1000"})) << format;
  }
}

TEST(MathTask, BadLinesAreErrorsNamingFileLineAndField) {
  TempDir dir;
  const std::string good = "{\"question\": \"q\", \"answer\": \"#### 1\"}\n";
  struct Case {
    std::string content;
    std::string format;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {good + "{\"question\": \"q\", \"answer\": \"#### 1\"\n", "auto",
       "bad.jsonl:2: not valid JSON"},
      {good + "[1, 2]\n", "auto", "bad.jsonl:2: must be a JSON object"},
      {good + good + "{\"answer\": \"#### 1\"}\n", "auto",
       "bad.jsonl:3: \"question\" must be a non-empty string"},
      {"{\"question\": \"  \", \"answer\": \"#### 1\"}\n", "auto",
       "bad.jsonl:1: \"question\" must be a non-empty string"},
      {"{\"question\": 5, \"answer\": \"#### 1\"}\n", "auto", "bad.jsonl:1: \"question\""},
      {"{\"question\": \"q\"}\n", "auto", "bad.jsonl:1: \"answer\" missing"},
      {"{\"question\": \"q\", \"answer\": [1]}\n", "auto",
       "bad.jsonl:1: \"answer\" (auto): must be a string or a number, got array"},
      {"{\"question\": \"q\", \"answer\": \"42\"}\n", "gsm8k",
       "bad.jsonl:1: \"answer\" (gsm8k): no \"#### <answer>\" line"},
      {"{\"question\": \"q\", \"answer\": \"steps\\n####   \"}\n", "auto",
       "bad.jsonl:1: \"answer\" (auto): no \"#### <answer>\" line"},
      {"{\"question\": \"q\", \"answer\": \"\\\\boxed{1\"}\n", "boxed",
       "bad.jsonl:1: \"answer\" (boxed): no complete \\boxed{...}"},
      {"{\"question\": \"q\", \"answer\": \"  \"}\n", "plain",
       "bad.jsonl:1: \"answer\" (plain): the answer is empty"},
      {good + "{\"question\": \"caf\xC3\", \"answer\": \"#### 1\"}\n", "auto",
       "bad.jsonl:2: not valid JSON"},
      {"\n\n", "auto", "bad.jsonl: no examples"},
  };
  for (const Case& k : cases) {
    const std::string path = dir.write("bad.jsonl", k.content);
    TaskConfig c = math_config(path);
    c.answer_format = k.format;
    absl::StatusOr<std::vector<Example>> ex = read_math_jsonl(path, c);
    ASSERT_FALSE(ex.ok()) << k.content;
    EXPECT_NE(ex.status().message().find(k.expected), std::string::npos)
        << "got: " << ex.status().message() << "\nwanted: " << k.expected;
  }
  absl::StatusOr<std::vector<Example>> missing =
      read_math_jsonl(dir.path() + "/nope.jsonl", math_config(dir.path() + "/nope.jsonl"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.jsonl"), std::string::npos);
  // make_task reports the validation file's errors too.
  const std::string train = dir.write("t.jsonl", good + good + good);
  const std::string val = dir.write("v.jsonl", good + "{\"question\": \"q\"}\n");
  absl::StatusOr<Task> task = make_task(math_config(train, val));
  ASSERT_FALSE(task.ok());
  EXPECT_NE(task.status().message().find("v.jsonl:2: \"answer\" missing"), std::string::npos)
      << task.status();
}

TEST(MathTask, ParamsAreValidatedNamingTheField) {
  struct Case {
    std::function<void(TaskConfig&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](TaskConfig& c) { c.train_path.clear(); }, "task.params.train_path: required"},
      {[](TaskConfig& c) { c.question_field.clear(); }, "task.params.question_field"},
      {[](TaskConfig& c) { c.answer_field = "question"; }, "task.params.answer_field"},
      {[](TaskConfig& c) { c.answer_format = "latex"; },
       "task.params.answer_format: must be one of auto, gsm8k, boxed, plain"},
      {[](TaskConfig& c) { c.extraction = {}; }, "task.params.extraction: must list"},
      {[](TaskConfig& c) {
         c.extraction = {"boxed", "regex"};
       },
       "task.params.extraction[1]: must be one of boxed, hash, last_number, got \"regex\""},
      {[](TaskConfig& c) {
         c.extraction = {"hash", "hash"};
       },
       "task.params.extraction[1]: \"hash\" is listed twice"},
      {[](TaskConfig& c) { c.format_reward = 1.0; }, "task.format_reward"},
  };
  for (const Case& k : cases) {
    TaskConfig c = math_config("/data/train.jsonl");
    k.edit(c);
    absl::Status s = validate_task_config(c);
    ASSERT_FALSE(s.ok()) << k.expected;
    EXPECT_NE(s.message().find(k.expected), std::string::npos) << s.message();
  }
  EXPECT_TRUE(validate_task_config(math_config("/data/train.jsonl")).ok());
}

TEST(MathTask, RewardUsesConfiguredExtractionAndCanonicalMatch) {
  TempDir dir;
  const std::string train = dir.write("t.jsonl",
                                      "{\"question\": \"q1\", \"answer\": \"#### 1234.5\"}\n"
                                      "{\"question\": \"q2\", \"answer\": \"#### 72\"}\n"
                                      "{\"question\": \"q3\", \"answer\": \"#### 3\"}\n");
  TaskConfig c = math_config(train);
  c.val_size = 1;
  c.format_reward = 0.25;
  absl::StatusOr<Task> task = make_task(c);
  ASSERT_TRUE(task.ok()) << task.status();
  Example ex;
  ex.answer = "1234.5";
  // Default order boxed, hash, last_number.
  EXPECT_EQ(task->reward(ex, "It is $1,234.50."), 1.0);
  EXPECT_EQ(task->reward(ex, "#### 2469/2\nand then 7"), 1.0);  // hash before last_number
  EXPECT_EQ(task->reward(ex, "\\boxed{1234.50} but 99"), 1.0);
  EXPECT_EQ(task->reward(ex, "It is 1,234"), 0.25);
  EXPECT_EQ(task->reward(ex, "no idea"), 0.0);
  EXPECT_TRUE(task->correct(ex, "so \\boxed{\\frac{2469}{2}}"));
  EXPECT_EQ(task->extract("so \\boxed{\\frac{2469}{2}}"), std::optional<std::string>("1234.5"));

  // Only \boxed counts: the format reward rewards boxing a wrong answer, a bare right number
  // gets nothing.
  c.extraction = {"boxed"};
  absl::StatusOr<Task> boxed = make_task(c);
  ASSERT_TRUE(boxed.ok());
  EXPECT_EQ(boxed->reward(ex, "\\boxed{1,234.5}"), 1.0);
  EXPECT_EQ(boxed->reward(ex, "\\boxed{7}"), 0.25);
  EXPECT_EQ(boxed->reward(ex, "1234.5"), 0.0);
  EXPECT_FALSE(boxed->correct(ex, "#### 1234.5"));
}

TEST(MathTask, SplitsAreDeterministicAndHeldOut) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 50; ++i) {
    lines += "{\"question\": \"What is " + std::to_string(i) + " + 1?\", \"answer\": \"#### " +
             std::to_string(i + 1) + "\"}\n";
  }
  const std::string train = dir.write("t.jsonl", lines);
  TaskConfig c = math_config(train);
  c.val_size = 10;
  c.train_size = 30;
  absl::StatusOr<Task> a = make_task(c);
  absl::StatusOr<Task> b = make_task(c);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->train(), b->train());
  EXPECT_EQ(a->validation(), b->validation());
  EXPECT_EQ(a->validation().size(), 10u);
  EXPECT_EQ(a->train().size(), 30u);
  std::set<std::string> val;
  for (const Example& e : a->validation()) val.insert(e.prompt);
  for (const Example& e : a->train()) EXPECT_FALSE(val.contains(e.prompt)) << e.prompt;
  c.seed = 6;
  absl::StatusOr<Task> other = make_task(c);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->validation(), a->validation());
  c.val_size = 50;
  absl::StatusOr<Task> too_many = make_task(c);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("task.val_size"), std::string::npos);
}

TEST(MathTask, JobConfigAcceptsMathParamsAndRejectsUnknownOnes) {
  const std::string yaml = R"(name: m
model:
  init:
    config: configs/models/tiny.json
task:
  name: math
  val_size: 8
  format_reward: 0.1
  params:
    train_path: data/math/train.jsonl
    val_path: data/math/val.jsonl
    question_field: problem
    answer_field: solution
    answer_format: boxed
    extraction: [boxed, last_number]
    system_prompt: "Think, then answer."
    instruction: "Put the answer in \\boxed{}."
)";
  absl::StatusOr<JobConfig> config = parse_job_config(yaml);
  ASSERT_TRUE(config.ok()) << config.status();
  const TaskConfig& t = config->task;
  EXPECT_EQ(t.question_field, "problem");
  EXPECT_EQ(t.answer_field, "solution");
  EXPECT_EQ(t.answer_format, "boxed");
  EXPECT_EQ(t.extraction, (std::vector<std::string>{"boxed", "last_number"}));
  EXPECT_EQ(t.system_prompt, "Think, then answer.");
  EXPECT_EQ(t.instruction, "Put the answer in \\boxed{}.");
  absl::StatusOr<JobConfig> back = job_config_from_json(job_config_to_json(*config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *config);
  JobConfig rel = *config;
  resolve_paths(rel, "/base");
  EXPECT_EQ(rel.task.train_path, "/base/data/math/train.jsonl");
  EXPECT_EQ(rel.task.val_path, "/base/data/math/val.jsonl");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"    digits: 3\n", "task.params.digits: unknown key (math takes train_path"},
      {"    extraction: boxed\n", "task.params.extraction: must be a list of strings"},
      {"    extraction: [boxed, 3]\n", "task.params.extraction[1]: must be a string"},
      {"    extraction: [boxed, sympy]\n", "task.params.extraction[1]: must be one of"},
      {"    answer_format: latex\n", "task.params.answer_format"},
  };
  const std::string head = R"(name: m
model:
  init:
    config: configs/models/tiny.json
task:
  name: math
  params:
    train_path: data/train.jsonl
)";
  for (const auto& [extra, expected] : bad) {
    absl::StatusOr<JobConfig> r = parse_job_config(head + extra);
    ASSERT_FALSE(r.ok()) << extra;
    EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().message();
  }
  absl::StatusOr<JobConfig> no_path =
      parse_job_config("name: m\nmodel:\n  init:\n    config: c.json\ntask:\n  name: math\n");
  ASSERT_FALSE(no_path.ok());
  EXPECT_NE(no_path.status().message().find("task.params.train_path: required"), std::string::npos)
      << no_path.status().message();
}

// configs/examples/: both math examples parse and validate; the toy one names a model config in
// the tree and the generated data; the real-model one starts from a checkpoint folder.
TEST(MathTask, ExampleConfigsParse) {
  const std::string dir = source_dir() + "/configs/examples/";
  absl::StatusOr<JobConfig> toy = load_job_config_file(dir + "toy-math.yaml");
  ASSERT_TRUE(toy.ok()) << toy.status();
  EXPECT_EQ(toy->task.name, "math");
  EXPECT_TRUE(stdfs::exists(source_dir() + "/" + toy->model.init_config_path));
  EXPECT_EQ(toy->task.train_path, "runs/data/math/train.jsonl");
  absl::StatusOr<JobConfig> qwen = load_job_config_file(dir + "qwen2.5-1.5b-instruct-gsm8k.yaml");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->model.checkpoint, "checkpoints/Qwen2.5-1.5B-Instruct");
  EXPECT_EQ(qwen->task.extraction, std::vector<std::string>{"boxed"});
  EXPECT_NE(qwen->task.system_prompt.find("\\boxed{}"), std::string::npos);
}

// scripts/make_math_dataset.py: byte-identical output for the same arguments, different for
// another seed, disjoint splits, and every line loads as the math task with the answer its own
// worked steps compute.
TEST(MathDatasetScript, DeterministicHeldOutAndLoadable) {
  if (std::system("/usr/bin/python3 --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "SKIPPED: /usr/bin/python3 not found";
  }
  TempDir dir;
  const std::string script = source_dir() + "/scripts/make_math_dataset.py";
  auto run = [&](const std::string& out, int seed) {
    const std::string cmd = "/usr/bin/python3 '" + script + "' --out '" + dir.path() + "/" + out +
                            "' --train 300 --val 40 --seed " + std::to_string(seed) +
                            " > /dev/null";
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(run("a", 3), 0);
  ASSERT_EQ(run("b", 3), 0);
  ASSERT_EQ(run("c", 4), 0);
  const std::string a_train = read_file(dir.path() + "/a/train.jsonl");
  const std::string a_val = read_file(dir.path() + "/a/val.jsonl");
  EXPECT_FALSE(a_train.empty());
  EXPECT_EQ(a_train, read_file(dir.path() + "/b/train.jsonl"));
  EXPECT_EQ(a_val, read_file(dir.path() + "/b/val.jsonl"));
  EXPECT_NE(a_train, read_file(dir.path() + "/c/train.jsonl"));

  TaskConfig c = math_config(dir.path() + "/a/train.jsonl", dir.path() + "/a/val.jsonl");
  c.val_size = 1000;
  absl::StatusOr<Task> task = make_task(c);
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->train().size(), 300u);
  EXPECT_EQ(task->validation().size(), 40u);
  std::set<std::string> prompts;
  for (const Example& e : task->validation()) prompts.insert(e.prompt);
  for (const Example& e : task->train()) prompts.insert(e.prompt);
  EXPECT_EQ(prompts.size(), 340u) << "questions repeat or leak between splits";
  // Each answer line's last step "<<expr=value>>" agrees with the "#### value" reference, and the
  // reference of a worked solution is what the task's own scoring extracts from it.
  std::istringstream lines(a_train);
  std::string line;
  int checked = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string answer = j["answer"].get<std::string>();
    const size_t calc = answer.rfind(">>");
    ASSERT_NE(calc, std::string::npos) << answer;
    const size_t eq = answer.rfind('=', calc);
    const std::string value = answer.substr(eq + 1, calc - eq - 1);
    EXPECT_EQ(normalize_math_answer(value), task->extract(answer).value_or("")) << answer;
    ++checked;
  }
  EXPECT_EQ(checked, 300);
  EXPECT_NE(std::system(("/usr/bin/python3 '" + script + "' --out '" + dir.path() +
                         "/d' --train 0 2> /dev/null")
                            .c_str()),
            0);
}

}  // namespace
}  // namespace fp8rl::rl
