// The typed flag table (common/flags.h): every type with its range, required flags, unknown flags,
// deprecated aliases and their warning, YAML config files and the generated --help.
#include "common/flags.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/unit/common/temp_dir.h"

namespace fp8rl::flags {
namespace {

enum class Color { kRed, kGreen, kBlue };

// A program's options with non-trivial defaults, bound to a table.
struct Options {
  int workers = 3;
  int64_t offset = -7;
  uint64_t bytes = 4096;
  double fraction = 0.25;
  bool relay = false;
  std::string host = "localhost";
  std::string note;
  std::chrono::milliseconds wait{250};
  std::chrono::seconds grace{30};
  Color color = Color::kGreen;
  std::string name = "first";
};

void add_flags(FlagTable& t, Options* o) {
  t.add_int("workers", &o->workers, 1, 64, "worker count")
      .add_int("offset", &o->offset, -100, 100, "port offset")
      .add_uint("bytes", &o->bytes, 1, 1 << 20, "chunk bytes")
      .add_double("fraction", &o->fraction, 0, 1, "share", /*lo_open=*/true)
      .add_bool("relay", &o->relay, "relay on or off")
      .add_string("host", &o->host, "a host")
      .add_string("note", &o->note, "free text", /*allow_empty=*/true)
      .add_duration("wait-ms", &o->wait, DurationUnit::kMilliseconds, 0, 10000, "a wait")
      .add_duration("grace-seconds", &o->grace, DurationUnit::kSeconds, 0, 3600, "a grace")
      .add_enum("color", &o->color,
                {{"red", Color::kRed}, {"green", Color::kGreen}, {"blue", Color::kBlue}}, "a color",
                {{"crimson", Color::kRed}})
      .add_string("worker-id", &o->name, "registered name")
      .deprecated_alias("name", "worker-id")
      .enable_config_file();
}

absl::StatusOr<ParseResult> parse(Options* o, const std::vector<std::string>& args) {
  FlagTable t("fp8rl-test");
  add_flags(t, o);
  return t.parse(args);
}

TEST(FlagTableTest, NoArgumentsKeepTheDefaults) {
  Options o;
  absl::StatusOr<ParseResult> r = parse(&o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->warnings.empty());
  EXPECT_TRUE(r->given.empty());
  EXPECT_EQ(o.workers, 3);
  EXPECT_EQ(o.offset, -7);
  EXPECT_EQ(o.wait, std::chrono::milliseconds(250));
  EXPECT_EQ(o.color, Color::kGreen);
}

TEST(FlagTableTest, EveryTypeParsesBothSpellings) {
  Options o;
  absl::StatusOr<ParseResult> r =
      parse(&o, {"--workers", "17", "--offset=-42", "--bytes", "65536", "--fraction=0.75",
                 "--relay", "on", "--host=h.example", "--note=", "--wait-ms", "1500",
                 "--grace-seconds=9", "--color", "blue", "--worker-id=w-3"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(o.workers, 17);
  EXPECT_EQ(o.offset, -42);
  EXPECT_EQ(o.bytes, 65536u);
  EXPECT_DOUBLE_EQ(o.fraction, 0.75);
  EXPECT_TRUE(o.relay);
  EXPECT_EQ(o.host, "h.example");
  EXPECT_EQ(o.note, "");
  EXPECT_EQ(o.wait, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.grace, std::chrono::seconds(9));
  EXPECT_EQ(o.color, Color::kBlue);
  EXPECT_EQ(o.name, "w-3");
  EXPECT_TRUE(r->was_given("wait-ms"));
  EXPECT_TRUE(r->was_given("wait_ms"));
  EXPECT_FALSE(r->was_given("config"));
  // The last value given wins; a synonym sets its value.
  r = parse(&o, {"--workers", "2", "--workers=5", "--color", "crimson", "--relay=off"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(o.workers, 5);
  EXPECT_EQ(o.color, Color::kRed);
  EXPECT_FALSE(o.relay);
}

TEST(FlagTableTest, BadValuesNameTheFlagAndChangeNothing) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--workers", "0"}, "--workers: must be in [1, 64], got 0"},
      {{"--workers", "65"}, "--workers: must be in [1, 64], got 65"},
      {{"--workers", "many"}, "--workers: expected an integer, got 'many'"},
      {{"--workers", "2.5"}, "--workers: expected an integer, got '2.5'"},
      {{"--offset", "-101"}, "--offset: must be in [-100, 100], got -101"},
      {{"--bytes", "-1"}, "--bytes: expected a non-negative integer, got '-1'"},
      {{"--bytes", "2000000"}, "--bytes: must be in [1, 1048576], got 2000000"},
      {{"--fraction", "0"}, "--fraction: must be in (0, 1], got 0"},
      {{"--fraction", "1.01"}, "--fraction: must be in (0, 1], got 1.01"},
      {{"--fraction", "nan"}, "--fraction: expected a number, got 'nan'"},
      {{"--fraction", "inf"}, "--fraction: expected a number, got 'inf'"},
      {{"--relay", "yes"}, "--relay: must be on or off, got 'yes'"},
      {{"--host", ""}, "--host: must not be empty, got ''"},
      {{"--wait-ms", "10001"}, "--wait-ms: must be in [0, 10000], got 10001"},
      {{"--grace-seconds", "1s"}, "--grace-seconds: expected an integer, got '1s'"},
      {{"--color", "purple"}, "--color: must be red, green or blue, got 'purple'"},
      {{"--name", ""}, "--name: must not be empty, got ''"},
  };
  for (const auto& [args, expect] : cases) {
    SCOPED_TRACE(expect);
    Options o;
    absl::StatusOr<ParseResult> r = parse(&o, args);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), expect);
    EXPECT_EQ(o.workers, 3);
    EXPECT_EQ(o.host, "localhost");
  }
}

TEST(FlagTableTest, UnknownFlagsMissingValuesAndStrayWords) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--bogus", "1"}, "--bogus: unknown flag"},
      {{"--wait_ms", "1"}, "--wait_ms: unknown flag"},  // flags are kebab-case only
      {{"--workers"}, "--workers: missing value"},
      {{"workers", "3"}, "unexpected argument 'workers'"},
      {{"--"}, "unexpected argument '--'"},
      {{"-h"}, "unexpected argument '-h'"},  // help is asked for before parsing: wants_help
  };
  for (const auto& [args, expect] : cases) {
    Options o;
    absl::StatusOr<ParseResult> r = parse(&o, args);
    ASSERT_FALSE(r.ok()) << expect;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), expect);
  }
  EXPECT_TRUE(wants_help({"--workers", "3", "--help"}));
  EXPECT_TRUE(wants_help({"-h"}));
  EXPECT_FALSE(wants_help({"--workers", "3"}));
}

TEST(FlagTableTest, RequiredFlag) {
  std::string model;
  int n = 1;
  FlagTable t("fp8rl-test");
  t.add_string("model", &model, "model folder").required().add_int("n", &n, 1, 9, "count");
  absl::StatusOr<ParseResult> r = t.parse({"--n", "2"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--model: required");
  r = t.parse({"--model", "m/"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(model, "m/");
  EXPECT_NE(t.usage().find("--model TEXT (required)"), std::string::npos) << t.usage();
}

TEST(FlagTableTest, DeprecatedAliasWorksAndWarnsNamingTheNewFlag) {
  Options o;
  absl::StatusOr<ParseResult> r = parse(&o, {"--name", "old-spelling", "--name=again"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(o.name, "again");
  ASSERT_EQ(r->warnings.size(), 1u);  // one line however often it was used
  EXPECT_EQ(r->warnings[0], "--name is deprecated; use --worker-id");
  EXPECT_TRUE(r->was_given("worker-id"));

  // Both spellings: the same value is fine, different values are an error naming both.
  r = parse(&o, {"--name", "a", "--worker-id", "a"});
  ASSERT_TRUE(r.ok()) << r.status();
  r = parse(&o, {"--name", "a", "--worker-id", "b"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "--name: a disagrees with --worker-id b (they name the same flag; give one)");
  // The new name alone warns about nothing.
  r = parse(&o, {"--worker-id", "c"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->warnings.empty());
}

TEST(FlagTableTest, ConfigFileThenFlags) {
  testing_util::TempDir dir;
  const std::string path = dir.file("options.yaml");
  std::ofstream(path) << "workers: 9\nwait_ms: 40\ncolor: red\nname: from-file\nhost: file-host\n";
  Options o;
  absl::StatusOr<ParseResult> r = parse(&o, {"--host", "flag-host", "--config", path});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(o.workers, 9);
  EXPECT_EQ(o.wait, std::chrono::milliseconds(40));
  EXPECT_EQ(o.color, Color::kRed);
  EXPECT_EQ(o.name, "from-file");
  EXPECT_EQ(o.host, "flag-host");  // the command line overrides the file wherever it stands
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_EQ(r->warnings[0], "--name is deprecated; use --worker-id");

  const std::pair<std::string, std::string> bad_files[] = {
      {"workers: 0\n", ": workers: must be in [1, 64], got 0"},
      {"wait-ms: 3\n", ": wait-ms: unknown option"},  // keys are snake_case
      {"colour: red\n", ": colour: unknown option"},
      {"workers: [1, 2]\n", ": workers: expected a scalar"},
      {"- workers\n", ": expected a mapping of options"},
      {"workers: {\n", ": malformed YAML"},
  };
  for (const auto& [text, expect] : bad_files) {
    std::ofstream(path) << text;
    Options fresh;
    r = parse(&fresh, {"--config", path});
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_TRUE(absl::StrContains(r.status().message(), path + expect)) << r.status();
  }
  Options fresh;
  r = parse(&fresh, {"--config", dir.file("missing.yaml")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "--config: cannot read")) << r.status();
}

TEST(FlagTableTest, ConfigIsUnknownUnlessEnabled) {
  int n = 1;
  FlagTable t("fp8rl-test");
  t.add_int("n", &n, 1, 9, "count");
  absl::StatusOr<ParseResult> r = t.parse({"--config", "x.yaml"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--config: unknown flag");
}

TEST(FlagTableTest, UsageListsEveryFlagWithTypeDefaultAndHelp) {
  Options o;
  FlagTable t("fp8rl-test");
  add_flags(t, &o);
  const std::string usage = t.usage();
  for (const char* line : {
           "usage: fp8rl-test [--config FILE] [flags]\n",
           "  --workers INT in [1, 64] (default: 3)\n      worker count\n",
           "  --offset INT in [-100, 100] (default: -7)\n",
           "  --bytes UINT in [1, 1048576] (default: 4096)\n",
           "  --fraction NUMBER in (0, 1] (default: 0.25)\n",
           "  --relay on|off (default: off)\n",
           "  --host TEXT (default: localhost)\n",
           "  --note TEXT (default: \"\")\n",
           "  --wait-ms MILLISECONDS in [0, 10000] (default: 250)\n",
           "  --grace-seconds SECONDS in [0, 3600] (default: 30)\n",
           "  --color red|green|blue (default: green)\n",
           "  --name\n      deprecated: use --worker-id\n",
       }) {
    EXPECT_NE(usage.find(line), std::string::npos) << line << "\nin:\n" << usage;
  }
  EXPECT_EQ(usage.find("crimson"), std::string::npos);  // synonyms stay out of the help
  EXPECT_TRUE(t.has("wait_ms"));
  EXPECT_TRUE(t.has("name"));
  EXPECT_FALSE(t.has("bogus"));
}

}  // namespace
}  // namespace fp8rl::flags
