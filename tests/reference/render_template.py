#!/usr/bin/python3
"""Reference renderer for rl/chat_template: renders a chat template with jinja2 exactly as Hugging Face
transformers' apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, HF's tojson override, raise_exception and strftime_now globals).

Usage: render_template.py IN.json OUT.json
IN:  {"template": str, "cases": [{"messages": [...], "tools": [...]|null,
      "add_generation_prompt": bool, "bos_token"?: str, "eos_token"?: str, "kwargs"?: {...},
      "now"?: unix seconds for strftime_now}]}
OUT: [{"text": rendered} | {"error": message}, ...] in case order.
Runs under Debian's /usr/bin/python3 with python3-jinja2.
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateRaised(Exception):
    pass


def make_env(now):
    def raise_exception(message):
        raise TemplateRaised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # HF's override: no HTML escaping, insertion order, optional indent/separators.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        t = datetime.fromtimestamp(now) if now is not None else datetime.now()
        return t.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    results = []
    for case in spec["cases"]:
        env = make_env(case.get("now"))
        variables = {
            "messages": case["messages"],
            "tools": case.get("tools"),
            "documents": None,
            "add_generation_prompt": case.get("add_generation_prompt", False),
        }
        for key in ("bos_token", "eos_token"):
            if case.get(key) is not None:
                variables[key] = case[key]
        variables.update(case.get("kwargs") or {})
        try:
            results.append({"text": env.from_string(spec["template"]).render(**variables)})
        except (jinja2.TemplateError, TemplateRaised, TypeError, ValueError) as e:
            results.append({"error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
