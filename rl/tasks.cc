// Verifiable tasks: seeded generators for addition / multiplication / arithmetic, the JSONL
// reader, answer extraction and the exact-match reward (tasks.h).
#include "rl/tasks.h"

#include <cctype>
#include <memory>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "nlohmann/json.hpp"
#include "rl/math_task.h"

namespace fp8rl::rl {

namespace {

constexpr int64_t kMaxTrainSize = 10'000'000;
constexpr int64_t kMaxValSize = 1'000'000;

// splitmix64: tiny, fast and the same on every platform (std distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0, without modulo bias.
  uint64_t uniform(uint64_t n) {
    const uint64_t limit = ~0ull - (~0ull % n);
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }

 private:
  uint64_t state_;
};

uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  Rng rng(seed ^ (stream * 0xD1B54A32D192ED03ull));
  return rng.next();
}

uint64_t pow10(int64_t digits) {
  uint64_t v = 1;
  for (int64_t i = 0; i < digits; ++i) v *= 10;
  return v;
}

// ---- arithmetic expressions --------------------------------------------------------------------

struct Expr {
  char op = 0;  // 0 for a number, else '+', '-', '*'
  int64_t value = 0;
  std::unique_ptr<Expr> left, right;
};

int precedence(const Expr& e) { return e.op == 0 ? 3 : (e.op == '*' ? 2 : 1); }

std::unique_ptr<Expr> random_expr(Rng& rng, int64_t terms, int64_t max_operand) {
  auto e = std::make_unique<Expr>();
  if (terms == 1) {
    e->value = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(max_operand) + 1));
    return e;
  }
  static constexpr char kOps[] = {'+', '-', '*'};
  e->op = kOps[rng.uniform(3)];
  const auto left_terms = 1 + static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(terms - 1)));
  e->left = random_expr(rng, left_terms, max_operand);
  e->right = random_expr(rng, terms - left_terms, max_operand);
  return e;
}

// Minimal parentheses: a child is wrapped when it binds looser than its parent, and a right child
// of '-' is also wrapped when it binds equally (a-(b-c), a-(b+c)).
std::string print_expr(const Expr& e) {
  if (e.op == 0) return std::to_string(e.value);
  std::string left = print_expr(*e.left);
  std::string right = print_expr(*e.right);
  if (precedence(*e.left) < precedence(e)) left = absl::StrCat("(", left, ")");
  if (precedence(*e.right) < precedence(e) ||
      (e.op == '-' && precedence(*e.right) == precedence(e))) {
    right = absl::StrCat("(", right, ")");
  }
  return absl::StrCat(left, std::string(1, e.op), right);
}

int64_t eval_expr(const Expr& e) {
  if (e.op == 0) return e.value;
  const int64_t a = eval_expr(*e.left);
  const int64_t b = eval_expr(*e.right);
  return e.op == '+' ? a + b : (e.op == '-' ? a - b : a * b);
}

// ---- generators --------------------------------------------------------------------------------

Example generate_example(const TaskConfig& c, Rng& rng) {
  if (c.name == "addition" || c.name == "multiplication") {
    const uint64_t n = pow10(c.digits);
    const uint64_t a = rng.uniform(n);
    const uint64_t b = rng.uniform(n);
    if (c.name == "addition") return {absl::StrCat(a, "+", b, "="), absl::StrCat(a + b)};
    return {absl::StrCat(a, "*", b, "="), absl::StrCat(a * b)};
  }
  std::unique_ptr<Expr> e = random_expr(rng, c.terms, c.max_operand);
  return {absl::StrCat(print_expr(*e), "="), absl::StrCat(eval_expr(*e))};
}

// A lower bound on the number of distinct prompts of a generated task.
uint64_t problem_space(const TaskConfig& c) {
  if (c.name == "arithmetic") {
    uint64_t v = 1;
    for (int64_t i = 0; i < c.terms; ++i) v *= static_cast<uint64_t>(c.max_operand) + 1;
    return v;
  }
  const uint64_t n = pow10(c.digits);
  return n * n;
}

absl::StatusOr<Task> make_generated_task(const TaskConfig& c) {
  std::vector<Example> validation;
  std::unordered_set<std::string> held_out;
  Rng val_rng(mix_seed(c.seed, 1));
  // val_size <= space / 2 (validated), so each draw is new with probability >= 1/2 for the
  // uniform generators; the attempt budget only guards against a pathological skew.
  const int64_t max_attempts = 64 * (c.val_size + c.train_size) + 1024;
  int64_t attempts = 0;
  while (static_cast<int64_t>(validation.size()) < c.val_size) {
    if (++attempts > max_attempts) {
      return absl::InvalidArgumentError(
          "task.val_size: too many validation problems for this task's problem space");
    }
    Example ex = generate_example(c, val_rng);
    if (held_out.insert(ex.prompt).second) validation.push_back(std::move(ex));
  }
  std::vector<Example> train;
  train.reserve(static_cast<size_t>(c.train_size));
  Rng train_rng(mix_seed(c.seed, 2));
  attempts = 0;
  while (static_cast<int64_t>(train.size()) < c.train_size) {
    if (++attempts > max_attempts) {
      return absl::InvalidArgumentError(
          "task.val_size: the validation split leaves too few training problems");
    }
    Example ex = generate_example(c, train_rng);
    if (!held_out.contains(ex.prompt)) train.push_back(std::move(ex));
  }
  return Task(c.name, std::move(train), std::move(validation), AnswerMatch::kNumber,
              c.format_reward);
}

// ---- JSONL -------------------------------------------------------------------------------------

absl::StatusOr<std::vector<Example>> read_jsonl(const std::string& path) {
  return read_jsonl_examples(
      path, [](const std::string& where, const nlohmann::json& j) -> absl::StatusOr<Example> {
        Example ex;
        auto prompt = j.find("prompt");
        if (prompt == j.end() || !prompt->is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(where, "\"prompt\" must be a string"));
        }
        ex.prompt = prompt->get<std::string>();
        if (ex.prompt.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(where, "\"prompt\" must not be empty"));
        }
        auto answer = j.find("answer");
        if (answer != j.end() && answer->is_string()) {
          ex.answer = answer->get<std::string>();
        } else if (answer != j.end() && answer->is_number_integer()) {
          ex.answer = answer->dump();
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "\"answer\" must be a string or an integer"));
        }
        if (ex.answer.find_first_not_of(" \t\r\n") == std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat(where, "\"answer\" must not be empty"));
        }
        return ex;
      });
}

// The split rule of file tasks (jsonl, math; see tasks.h). `read` parses one file.
template <typename Reader>
absl::Status split_file_task(const TaskConfig& c, const Reader& read, std::vector<Example>* train,
                             std::vector<Example>* validation) {
  absl::StatusOr<std::vector<Example>> all = read(c.train_path);
  if (!all.ok()) return all.status();
  *train = *std::move(all);
  if (c.val_path.empty()) {
    // Seeded shuffle, then the first val_size examples are held out.
    if (static_cast<int64_t>(train->size()) <= c.val_size) {
      return absl::InvalidArgumentError(absl::StrCat("task.val_size: must be < the ", train->size(),
                                                     " examples in ", c.train_path,
                                                     " (no task.params.val_path given)"));
    }
    Rng rng(mix_seed(c.seed, 3));
    for (size_t i = train->size() - 1; i > 0; --i) {
      std::swap((*train)[i], (*train)[rng.uniform(i + 1)]);
    }
    validation->assign(std::make_move_iterator(train->begin()),
                       std::make_move_iterator(train->begin() + c.val_size));
    train->erase(train->begin(), train->begin() + c.val_size);
  } else {
    absl::StatusOr<std::vector<Example>> val = read(c.val_path);
    if (!val.ok()) return val.status();
    *validation = *std::move(val);
    if (static_cast<int64_t>(validation->size()) > c.val_size) validation->resize(c.val_size);
  }
  if (static_cast<int64_t>(train->size()) > c.train_size) train->resize(c.train_size);
  return absl::OkStatus();
}

absl::StatusOr<Task> make_jsonl_task(const TaskConfig& c) {
  std::vector<Example> train, validation;
  if (absl::Status s = split_file_task(c, read_jsonl, &train, &validation); !s.ok()) return s;
  return Task(c.name, std::move(train), std::move(validation),
              c.match == "number" ? AnswerMatch::kNumber : AnswerMatch::kLine, c.format_reward);
}

absl::StatusOr<Task> make_math_task(const TaskConfig& c) {
  std::vector<Example> train, validation;
  auto read = [&c](const std::string& path) { return read_math_jsonl(path, c); };
  if (absl::Status s = split_file_task(c, read, &train, &validation); !s.ok()) return s;
  return Task(c.name, std::move(train), std::move(validation), AnswerMatch::kMath, c.format_reward,
              math_extractors(c));
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

}  // namespace

absl::StatusOr<std::vector<Example>> read_jsonl_examples(
    const std::string& path,
    const std::function<absl::StatusOr<Example>(const std::string& where,
                                                const nlohmann::json& object)>& parse) {
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  std::vector<Example> examples;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text->size()) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    const std::string_view line = std::string_view(*text).substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = absl::StrCat(path, ":", line_no, ": ");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // The position only: nlohmann's message quotes the line, and a file's contents never
      // reach an error.
      return absl::InvalidArgumentError(
          absl::StrCat(where, "not valid JSON (parse error at byte ", e.byte, ")"));
    }
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "must be a JSON object"));
    }
    absl::StatusOr<Example> ex = parse(where, j);
    if (!ex.ok()) return ex.status();
    examples.push_back(*std::move(ex));
  }
  if (examples.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return examples;
}

std::optional<std::string> extract_answer(std::string_view completion, AnswerMatch match) {
  if (match == AnswerMatch::kMath) {
    std::optional<std::string> raw = extract_math_answer(completion, default_math_extractors());
    if (!raw.has_value()) return std::nullopt;
    return normalize_math_answer(*raw);
  }
  size_t i = 0;
  while (i < completion.size() && is_space(completion[i])) ++i;
  if (match == AnswerMatch::kNumber) {
    const size_t start = i;
    if (i < completion.size() && completion[i] == '-') ++i;
    const size_t digits_start = i;
    while (i < completion.size() && std::isdigit(static_cast<unsigned char>(completion[i]))) ++i;
    if (i == digits_start) return std::nullopt;
    return std::string(completion.substr(start, i - start));
  }
  size_t end = completion.find('\n', i);
  if (end == std::string_view::npos) end = completion.size();
  while (end > i && is_space(completion[end - 1])) --end;
  if (end == i) return std::nullopt;
  return std::string(completion.substr(i, end - i));
}

Task::Task(std::string name, std::vector<Example> train, std::vector<Example> validation,
           AnswerMatch match, double format_reward, std::vector<MathExtractor> math_extractors)
    : name_(std::move(name)),
      train_(std::move(train)),
      validation_(std::move(validation)),
      match_(match),
      format_reward_(format_reward),
      math_extractors_(std::move(math_extractors)) {}

std::optional<std::string> Task::extract(std::string_view completion) const {
  if (match_ != AnswerMatch::kMath) return extract_answer(completion, match_);
  std::optional<std::string> raw = extract_math_answer(completion, math_extractors_);
  if (!raw.has_value()) return std::nullopt;
  return normalize_math_answer(*raw);
}

bool Task::correct(const Example& example, std::string_view completion) const {
  const std::optional<std::string> answer = extract(completion);
  if (!answer.has_value()) return false;
  if (match_ == AnswerMatch::kLine) {
    // The reference answer is compared trimmed, like the extracted line.
    const std::optional<std::string> expected = extract_answer(example.answer, AnswerMatch::kLine);
    return expected.has_value() && *answer == *expected;
  }
  return *answer == example.answer;
}

double Task::reward(const Example& example, std::string_view completion) const {
  if (correct(example, completion)) return 1.0;
  return extract(completion).has_value() ? format_reward_ : 0.0;
}

TokenizedExample tokenize_example(const Example& example, const ByteTokenizer& tokenizer,
                                  bool with_answer) {
  TokenizedExample out;
  out.tokens = tokenizer.encode(example.prompt, /*add_bos=*/true);
  out.prompt_length = static_cast<int64_t>(out.tokens.size());
  out.target_mask.assign(out.tokens.size(), 0);
  if (with_answer) {
    const std::vector<int32_t> answer = tokenizer.encode(example.answer, false, /*add_eos=*/true);
    out.tokens.insert(out.tokens.end(), answer.begin(), answer.end());
    out.target_mask.resize(out.tokens.size(), 1);
  }
  return out;
}

absl::Status validate_task_config(const TaskConfig& c) {
  auto error = [](std::string_view path, std::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(path), ": ", std::string(message)));
  };
  if (c.name != "addition" && c.name != "multiplication" && c.name != "arithmetic" &&
      c.name != "jsonl" && c.name != "math") {
    return error("task.name", "must be one of addition, multiplication, arithmetic, jsonl, math");
  }
  if (c.train_size < 1 || c.train_size > kMaxTrainSize) {
    return error("task.train_size", absl::StrCat("must be in [1, ", kMaxTrainSize, "]"));
  }
  if (c.val_size < 1 || c.val_size > kMaxValSize) {
    return error("task.val_size", absl::StrCat("must be in [1, ", kMaxValSize, "]"));
  }
  if (!(c.format_reward >= 0.0 && c.format_reward < 1.0)) {
    return error("task.format_reward", "must be in [0, 1)");
  }
  if (c.name == "math") return validate_math_params(c);
  if (c.name == "jsonl") {
    if (c.train_path.empty()) return error("task.params.train_path", "required");
    if (c.match != "line" && c.match != "number") {
      return error("task.params.match", "must be one of line, number");
    }
    return absl::OkStatus();
  }
  if (c.name == "addition" && (c.digits < 1 || c.digits > 9)) {
    return error("task.params.digits", "must be in [1, 9]");
  }
  if (c.name == "multiplication" && (c.digits < 1 || c.digits > 4)) {
    return error("task.params.digits", "must be in [1, 4]");
  }
  if (c.name == "arithmetic") {
    if (c.terms < 2 || c.terms > 8) return error("task.params.terms", "must be in [2, 8]");
    if (c.max_operand < 1 || c.max_operand > 99) {
      return error("task.params.max_operand", "must be in [1, 99]");
    }
  }
  const uint64_t half = problem_space(c) / 2;
  if (static_cast<uint64_t>(c.val_size) > half) {
    return error("task.val_size", absl::StrCat("must be <= ", half,
                                               " (half of the distinct problems for these "
                                               "params)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Task> make_task(const TaskConfig& config) {
  if (absl::Status s = validate_task_config(config); !s.ok()) return s;
  if (config.name == "jsonl") return make_jsonl_task(config);
  if (config.name == "math") return make_math_task(config);
  return make_generated_task(config);
}

std::vector<int64_t> prompt_indices(int64_t split_size, uint64_t seed, int64_t step,
                                    int64_t count) {
  std::vector<int64_t> out;
  if (split_size <= 0 || count <= 0 || step < 0) return out;
  out.reserve(static_cast<size_t>(count));
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t p = step * count + i;
    const int64_t epoch = p / split_size;
    if (epoch != perm_epoch) {
      perm.resize(static_cast<size_t>(split_size));
      for (int64_t k = 0; k < split_size; ++k) perm[static_cast<size_t>(k)] = k;
      Rng rng(mix_seed(seed, 1000 + static_cast<uint64_t>(epoch)));
      for (size_t k = perm.size() - 1; k > 0; --k) std::swap(perm[k], perm[rng.uniform(k + 1)]);
      perm_epoch = epoch;
    }
    out.push_back(perm[static_cast<size_t>(p % split_size)]);
  }
  return out;
}

}  // namespace fp8rl::rl
