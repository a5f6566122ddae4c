#!/usr/bin/python3
"""End-to-end check of `fp8rl plan` on the shipped model configs.

Llama 3.1 8B on 8 x 80 GiB (budget 0.9 x 80 GiB): fits with grads_optimizer + recompute (exit 0),
does not fit with none (exit 3, naming changes that fit); the printed parts are checked against
the parameter and byte counts worked out here from the config (independently of
train/memory_plan.cc): fp32 master 4 B, AdamW moments 8 B, grads 4 B per parameter of the rank's
shard (grads: plus the bucket pool, one backward unit's tensors), bf16 embedding and lm_head 2 B
per value, FP8 linears their codes twice plus 4-byte scales per 128x128 block twice. Bad flags and unreadable or unsupported configs must fail with exactly
one stderr line and a non-zero exit.
"""
import json
import os
import re
import subprocess
import sys

FAILURES = []
GIB = 1024.0**3


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def fp8rl():
    return os.path.join(os.environ.get("FP8RL_BIN_DIR", "build/bin"), "fp8rl")


def source(*parts):
    return os.path.join(os.environ.get("FP8RL_SOURCE_DIR", "."), *parts)


def run(args):
    return subprocess.run([fp8rl(), "plan"] + args, capture_output=True, text=True, timeout=120)


def part(out, label):
    """The GiB value of the row starting with `label`."""
    m = re.search(r"^  " + re.escape(label) + r".*?([0-9.]+) GiB$", out, re.M)
    return float(m.group(1)) if m else None


def llama_counts(path):
    c = json.load(open(path))
    h, f, v, n = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)]
    linear = sum(a * b for a, b in shapes)
    blocks = sum(-(-a // 128) * -(-b // 128) for a, b in shapes)
    params = n * (linear + 2 * h) + 2 * v * h + h
    fp8 = n * 2 * (linear + 4 * blocks)
    bf16 = 2 * 2 * v * h
    # The sharded gradients' bucket pool with 4 MiB buckets (1048576 floats): every linear here
    # (the smallest, k and v, kv x h) is larger than a bucket and every norm lies between two of
    # them, so each tensor is a bucket of its own and the pool holds the tensors of one backward
    # unit: the head (lm_head + final norm), a decoder layer, or the embedding.
    assert min(a * b for a, b in shapes) > 1048576
    pool = 4 * max(v * h + h, linear + 2 * h, v * h)
    return params, fp8, bf16, pool


def main():
    llama = source("configs", "models", "llama-3.1-8b.json")
    params, fp8, bf16, pool = llama_counts(llama)
    check(params == 8030261248, f"llama 3.1 8B parameters {params}")

    base = ["--model", llama, "--trainers", "8", "--gpu-memory", "80"]
    fits = run(base + ["--shard", "grads_optimizer", "--recompute"])
    check(fits.returncode == 0, f"grads_optimizer + recompute exit {fits.returncode}: {fits.stderr}")
    out = fits.stdout
    print(out)
    check(f"{params} parameters" in out, "parameter count printed")
    m = re.search(r"rank (\d+), (\d+) of (\d+) parameters in its shard", out)
    if check(m is not None, "shard line"):
        shard = int(m.group(2))
        # A shard is within one block row of the largest tensor (128 x 14336) of N / 8.
        check(abs(shard - params / 8) <= 128 * 14336, f"shard {shard} vs N/8 {params / 8}")
        for label, want in (("fp32 master", 4 * shard), ("AdamW moments", 8 * shard),
                            ("fp32 grads", 4 * shard + pool),
                            ("FP8 working weights", fp8), ("bf16 embedding", bf16)):
            got = part(out, label)
            check(got is not None and abs(got - want / GIB) < 1e-3, f"{label}: {got} vs {want / GIB}")
    check(re.search(r"^fits: [0-9.]+ GiB of 72\.000 GiB$", out, re.M) is not None, "fits line")

    none = run(base + ["--recompute"])
    check(none.returncode == 3, f"none exit {none.returncode}")
    check(part(none.stdout, "fp32 master") is not None and
          abs(part(none.stdout, "fp32 master") - 4 * params / GIB) < 1e-3, "none: whole master")
    check(re.search(r"^does not fit: .*would fit with: .*shard grads_optimizer \(", none.stdout,
                    re.M) is not None, f"none verdict: {none.stdout}")

    # The other shipped configs plan (qwen3 dense and MoE); Moonlight's deepseek_v3 is refused.
    for name in ("qwen3-8b", "qwen3-30b-a3b"):
        r = run(["--model", source("configs", "models", name + ".json"), "--trainers", "8",
                 "--shard", "grads_optimizer", "--recompute", "--gpu-memory", "141"])
        check(r.returncode in (0, 3) and "total" in r.stdout, f"{name}: {r.returncode} {r.stderr}")
        print(r.stdout)

    bad = [
        ([], "--model"),
        (["--model", llama], "--gpu-memory"),
        (base + ["--shard", "zero2"], "--shard: must be none, grads_optimizer or params, got 'zero2'"),
        (["--model", llama, "--trainers", "0", "--gpu-memory", "80"], "--trainers: must be in [1, 64]"),
        (["--model", llama, "--trainers", "x", "--gpu-memory", "80"], "--trainers"),
        (["--model", llama, "--gpu-memory", "-1"], "--gpu-memory: must be a size in GiB"),
        (["--model", llama, "--gpu-memory", "80", "--step-tokens", "0"], "--step-tokens"),
        (["--model", llama, "--gpu-memory", "80", "--gpu-memory-fraction", "2"], "fraction"),
        (["--model", llama, "--gpu-memory", "80", "--training", "fp32"], "--training"),
        (["--model", "/nonexistent/config.json", "--gpu-memory", "80"], "/nonexistent/config.json"),
        (["--model", source("configs", "models", "moonlight-16b-a3b.json"), "--gpu-memory", "80"],
         "model_type"),
    ]
    for args, want in bad:
        r = run(args)
        lines = r.stderr.strip().splitlines()
        check(r.returncode not in (0, 3), f"{args}: exit {r.returncode}")
        check(len(lines) == 1 and lines[0].startswith("fp8rl plan: ") and want in lines[0],
              f"{args}: stderr {r.stderr!r}")
        check(r.stdout == "", f"{args}: stdout {r.stdout!r}")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
