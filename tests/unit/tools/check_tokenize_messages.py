#!/usr/bin/python3
"""End-to-end check of `fp8rl tokenize` on {"messages": ...} lines against independent oracles.

1. A tokenizer folder built here (byte-level vocabulary, two special ChatML markers, a chat
   template): the rendered text must equal jinja2's (tests/reference/render_template.py) and the
   ids must equal an encoder written here from the vocabulary's definition.
2. The real Qwen3, Llama 3.1 and DeepSeek-V3 folders fetched by scripts/fetch_tokenizers.sh (an
   ignored npm cache): text against jinja2 on a corpus of conversations (system/user/assistant,
   multi-turn, unicode, tool schemas and tool calls, thinking switch), ids against
   @huggingface/tokenizers (tests/reference/hf_tokenize.mjs). Skipped with a message when the
   cache, node or jinja2 is missing.
3. Bad lines (wrong types, unknown fields, a template that raises, a folder without a template)
   fail with one stderr line naming FILE:LINE, exit 1, and leave no output file.
Exits 77 (skipped) only when the fp8rl binary is missing.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE_DIR = os.environ.get("FP8RL_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.dirname(
                                os.path.dirname(os.path.abspath(__file__))))))
FP8RL = os.path.join(os.environ.get("FP8RL_BIN_DIR", ""), "fp8rl")
NPM = os.path.join(os.environ.get("FP8RL_NPM_CACHE", os.path.join(SOURCE_DIR, ".cache", "npm")),
                   "node_modules")
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def byte_chars():
    """GPT-2's byte-level alphabet: byte -> the character that stands for it in the vocabulary."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


CHATML = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
          "{{ raise_exception('system must come first') }}{% endif %}"
          "<|im_start|>{{ m.role }}\n{{ m.content }}"
          "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}\n<call>{{ c | tojson }}"
          "</call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
          "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% if think is defined and not think %}<think></think>{% endif %}{% endif %}")


def write_tiny_folder(path, template):
    os.makedirs(path, exist_ok=True)
    chars = byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256, "content": "<|im_start|>", "special": True},
                         {"id": 257, "content": "<|im_end|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                  "merges": [], "byte_fallback": False, "ignore_merges": False},
    }
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f)
    config = {"eos_token": "<|im_end|>"}
    if template is not None:
        config["chat_template"] = template
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)


def tiny_encode(text):
    """The tiny folder's encoding: the two markers are single ids, every other byte its own id."""
    ids = []
    specials = {"<|im_start|>": 256, "<|im_end|>": 257}
    i = 0
    while i < len(text):
        for s, sid in specials.items():
            if text.startswith(s, i):
                ids.append(sid)
                i += len(s)
                break
        else:
            ids.extend(text[i].encode("utf-8"))
            i += 1
    return ids


def run_cli(folder, lines, tmp, name):
    inp = os.path.join(tmp, name + ".jsonl")
    out = os.path.join(tmp, name + ".out")
    with open(inp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n")
    if os.path.exists(out):
        os.remove(out)
    p = subprocess.run([FP8RL, "tokenize", "--tokenizer", folder, "--in", inp, "--out", out],
                       capture_output=True, text=True, timeout=300)
    result = None
    if os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            result = [json.loads(x) for x in f.read().splitlines()]
    return p.returncode, p.stderr, result, out


def jinja_render(template, cases, tmp, bos=None, eos=None):
    spec = {"template": template, "cases": []}
    for c in cases:
        case = {"messages": c["messages"], "tools": c.get("tools"),
                "add_generation_prompt": c.get("add_generation_prompt", False),
                "kwargs": c.get("kwargs") or {}}
        if bos is not None:
            case["bos_token"] = bos
        if eos is not None:
            case["eos_token"] = eos
        spec["cases"].append(case)
    inp, out = os.path.join(tmp, "jinja_in.json"), os.path.join(tmp, "jinja_out.json")
    with open(inp, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    subprocess.run(["/usr/bin/python3", os.path.join(SOURCE_DIR, "tests", "reference",
                                                     "render_template.py"), inp, out],
                   check=True, timeout=120)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def hf_encode(folder, texts, tmp):
    inp = os.path.join(tmp, "hf_in.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "add_special_tokens": False}, ensure_ascii=False) + "\n")
    with open(inp, encoding="utf-8") as stdin:
        p = subprocess.run(["node", os.path.join(SOURCE_DIR, "tests", "reference", "hf_tokenize.mjs"),
                            NPM, folder], stdin=stdin, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"hf_tokenize.mjs failed: {p.stderr[-500:]}")
    return [json.loads(x)["ids"] for x in p.stdout.splitlines()]


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string",
                                                             "enum": ["c", "f"]}},
                   "required": ["city"]}}}


def corpus(with_tools, thinking_switch):
    q = "Tom has 3 apples and buys 4 more. How many?"
    cases = [
        {"messages": [{"role": "user", "content": q}], "add_generation_prompt": True},
        {"messages": [{"role": "system", "content": "Reason step by step; put the answer in "
                       "\\boxed{}."}, {"role": "user", "content": q}],
         "add_generation_prompt": True},
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "3+4=7. "
                       "#### 7"}, {"role": "user", "content": "And if he eats 2?"}],
         "add_generation_prompt": True},
        {"messages": [{"role": "user", "content": "数学: 3×4=? — «quote» 🧮👩‍👩‍👧 \t tabs\n\n\nnewlines"},
                      {"role": "assistant", "content": "12"}], "add_generation_prompt": False},
        {"messages": [{"role": "user", "content": "  leading and trailing spaces  "}],
         "add_generation_prompt": False},
    ]
    if with_tools:
        cases.append({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                      "tools": [WEATHER_TOOL], "add_generation_prompt": True})
        cases.append({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
            {"role": "tool", "content": "{\"temp\": 21}"}],
            "tools": [WEATHER_TOOL], "add_generation_prompt": True})
    if thinking_switch:
        cases.append({"messages": [{"role": "user", "content": q}], "add_generation_prompt": True,
                      "kwargs": {"enable_thinking": False}})
    return cases


def line_of(case):
    line = {"messages": case["messages"],
            "add_generation_prompt": case.get("add_generation_prompt", False)}
    if "tools" in case:
        line["tools"] = case["tools"]
    if case.get("kwargs"):
        line["kwargs"] = case["kwargs"]
    return line


def check_tiny(tmp):
    folder = os.path.join(tmp, "tiny")
    write_tiny_folder(folder, CHATML)
    cases = corpus(with_tools=True, thinking_switch=False)
    cases.append({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
                  "kwargs": {"think": False}})
    # Text and ids lines mix with messages lines in one file.
    lines = [line_of(c) for c in cases] + [{"text": "<|im_start|>x"}, {"ids": [256, 104, 105]}]
    rc, err, out, _ = run_cli(folder, lines, tmp, "tiny")
    if not check(rc == 0 and out is not None, f"tiny folder: exit {rc}: {err}"):
        return
    expected = jinja_render(CHATML, cases, tmp, eos="<|im_end|>")
    for i, (case, exp) in enumerate(zip(cases, expected)):
        check("text" in exp, f"tiny case {i}: jinja2 failed: {exp}")
        check(out[i].get("text") == exp.get("text"),
              f"tiny case {i}: text {out[i].get('text')!r} != jinja2 {exp.get('text')!r}")
        check(out[i].get("ids") == tiny_encode(exp.get("text", "")), f"tiny case {i}: ids differ")
        check(list(out[i].keys()) == ["text", "ids"], f"tiny case {i}: keys {list(out[i])}")
    check(out[len(cases)] == {"ids": [256, 120]}, f"text line: {out[len(cases)]}")
    check(out[len(cases) + 1] == {"text": "<|im_start|>hi"}, f"ids line: {out[len(cases) + 1]}")
    print(f"[ tokenize messages ] tiny folder: {len(cases)} conversations match jinja2 and the "
          f"byte encoder")


def check_bad_lines(tmp):
    folder = os.path.join(tmp, "tiny")
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    bad = [
        ('{"messages": "hi"}', 'bad.jsonl:2: "messages": expected an array'),
        ('{"messages": [1]}', 'bad.jsonl:2: "messages"[0]: expected an object'),
        ('{"messages": [], "add_generation_prompt": "yes"}',
         'bad.jsonl:2: "add_generation_prompt": expected true or false'),
        ('{"messages": [], "kwargs": [1]}', 'bad.jsonl:2: "kwargs": expected an object'),
        ('{"messages": [], "tools": {"a": 1}}', 'bad.jsonl:2: "tools": expected an array'),
        ('{"messages": [], "add_special_tokens": true}', 'bad.jsonl:2: unknown field'),
        ('{"messages": [], "text": "x"}', "bad.jsonl:2: expected exactly one of"),
        (json.dumps({"messages": [{"role": "user", "content": "a"},
                                  {"role": "system", "content": "b"}]}),
         ["bad.jsonl:2: chat template: ", "raise_exception: system must come first"]),
        ('{"messages": [}', "bad.jsonl:2: malformed JSON"),
    ]
    for line, expected in bad:
        rc, err, _, out_path = run_cli(folder, [good, line], tmp, "bad")
        check(rc == 1, f"{line}: exit {rc}, wanted 1")
        needles = expected if isinstance(expected, list) else [expected]
        check(all(n in err for n in needles) and err.count("\n") == 1,
              f"{line}: stderr {err!r} lacks {needles!r}")
        check(not os.path.exists(out_path), f"{line}: partial output left")
    leftovers = [n for n in os.listdir(tmp) if ".tmp." in n]
    check(not leftovers, f"temporary files left: {leftovers}")
    # A folder without a chat template: messages lines fail, text lines still work.
    plain = os.path.join(tmp, "plain")
    write_tiny_folder(plain, None)
    rc, err, _, _ = run_cli(plain, [good], tmp, "plain")
    check(rc == 1 and "plain.jsonl:1: \"messages\": " in err and "has no chat_template" in err,
          f"no template: {rc} {err!r}")
    rc, err, out, _ = run_cli(plain, ['{"text": "ok"}'], tmp, "plain_text")
    check(rc == 0 and out == [{"ids": [111, 107]}], f"no template, text line: {rc} {err} {out}")
    # A template that does not parse fails messages lines, naming the file.
    broken = os.path.join(tmp, "broken")
    write_tiny_folder(broken, "{% for m in messages %}{{ m.content }}")
    rc, err, _, _ = run_cli(broken, [good], tmp, "broken")
    check(rc == 1 and "tokenizer_config.json: chat_template:" in err, f"broken: {rc} {err!r}")
    print(f"[ tokenize messages ] {len(bad) + 2} bad inputs fail cleanly")


def reference_missing():
    try:
        import jinja2  # noqa: F401
    except ImportError:
        return "python3-jinja2 is not installed"
    if shutil.which("node") is None:
        return "node is not installed"
    if not os.path.isdir(os.path.join(NPM, "@huggingface", "tokenizers")):
        return f"{NPM}/@huggingface/tokenizers is missing (run scripts/fetch_tokenizers.sh)"
    return None


def check_real(tmp):
    missing = reference_missing()
    if missing:
        print(f"[ tokenize messages ] SKIPPED real tokenizers: {missing}")
        return
    for package, tools, thinking in [("tokenizer-qwen3", True, True),
                                     ("tokenizer-llama3_1", True, False),
                                     ("tokenizer-deepseek_v3", False, False)]:
        folder = os.path.join(NPM, "@lenml", package, "models")
        if not os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
            print(f"[ tokenize messages ] SKIPPED {package}: {folder} missing")
            continue
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        template = config["chat_template"]
        if isinstance(template, list):
            template = next(t["template"] for t in template if t["name"] == "default")

        def token(key):
            v = config.get(key)
            return v.get("content") if isinstance(v, dict) else v

        cases = corpus(tools, thinking)
        if package == "tokenizer-llama3_1":
            for c in cases:  # pin the date the template would otherwise print as today's
                c.setdefault("kwargs", {})["date_string"] = "02 Dec 2026"
        expected = jinja_render(template, cases, tmp, bos=token("bos_token"), eos=token("eos_token"))
        rc, err, out, _ = run_cli(folder, [line_of(c) for c in cases], tmp, package)
        if not check(rc == 0 and out is not None, f"{package}: exit {rc}: {err}"):
            continue
        texts = [e.get("text", "") for e in expected]
        ref_ids = hf_encode(folder, texts, tmp)
        for i, exp in enumerate(expected):
            check("text" in exp, f"{package} case {i}: jinja2 failed: {exp}")
            check(out[i]["text"] == exp.get("text"),
                  f"{package} case {i}: text differs from jinja2:\n{out[i]['text']!r}\n"
                  f"{exp.get('text')!r}")
            check(out[i]["ids"] == ref_ids[i], f"{package} case {i}: ids differ from "
                  f"@huggingface/tokenizers")
        print(f"[ tokenize messages ] {package}: {len(cases)} conversations match jinja2 (text) "
              f"and @huggingface/tokenizers (ids)")


def main():
    if not os.path.exists(FP8RL):
        print(f"SKIPPED: {FP8RL} not built")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="fp8rl-tokenize-messages-")
    try:
        check_tiny(tmp)
        check_bad_lines(tmp)
        check_real(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} failures", file=sys.stderr)
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
