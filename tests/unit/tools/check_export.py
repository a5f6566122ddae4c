#!/usr/bin/python3
"""End-to-end check of `fp8rl export` with an independent reader (tests/reference/safetensors_reader).

Builds random Llama-shaped checkpoints with numpy (F16 sharded with an index, F32 single file;
outliers; shapes that are not multiples of 128), runs the CLI, and reads the result back tensor by
tensor: hf must hold every parameter as the round-to-nearest-even BF16 of the source value, fp8
every linear weight as the 128x128-block E4M3 codes and float32(amax)/448 scales of the recipe
(oracle from check_quantize.py), the rest BF16, with a consistent index, config.json,
generation_config.json and copied tokenizer files; and the sharded hf export, read as a model by
the float64 PyTorch decoder of tests/reference/llama_ref.py (when torch is installed), gives the
logprobs `fp8rl score` computes from it. Bad input must fail with one stderr line and a
non-zero exit, and leave nothing behind (no output, no temporary folder).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))
import check_quantize as cq  # noqa: E402  (random checkpoints, E4M3 block-quantization oracle)
import safetensors_reader as st  # noqa: E402

FAILURES = []
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def run(args):
    return subprocess.run([cq.fp8rl(), "export"] + args, capture_output=True, text=True,
                          timeout=120)


def source_values(tensors):
    """Parameter name -> float32 values of the source checkpoint (the engine's fp32 master)."""
    return {n: st.decode(d, s, raw).astype(np.float32) for n, (d, s, raw) in tensors.items()
            if d in ("F32", "F16", "BF16")}


def is_linear(name):
    return name.endswith(".weight") and any(f".{m}." in name for m in LINEARS)


def check_common(label, src_dir, out, fmt):
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    check(config.get("torch_dtype") == "bfloat16", f"{label}: torch_dtype {config.get('torch_dtype')}")
    qc = config.get("quantization_config")
    if fmt == "fp8":
        check(qc == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                     "weight_block_size": [128, 128]}, f"{label}: quantization_config {qc}")
    else:
        check(qc is None, f"{label}: hf export has a quantization_config")
    for name in ("tokenizer.json", "generation_config.json"):
        with open(os.path.join(src_dir, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            check(a.read() == b.read(), f"{label}: {name} not copied byte for byte")
    leftovers = [n for n in os.listdir(os.path.dirname(out)) if ".tmp." in n]
    check(not leftovers, f"{label}: temporary folders left: {leftovers}")


def check_index(label, out, tensors, where, index, shards_expected):
    shards = sorted(set(where.values()))
    if shards_expected == 1:
        check(index is None and shards == ["model.safetensors"], f"{label}: expected one file")
        return
    check(len(shards) >= shards_expected, f"{label}: {len(shards)} shards, want >= {shards_expected}")
    check(index["weight_map"] == where, f"{label}: index weight_map does not match the shards")
    total = sum(len(raw) for _, _, raw in tensors.values())
    check(index["metadata"]["total_size"] == total,
          f"{label}: total_size {index['metadata']['total_size']} != {total}")
    n = len(shards)
    check(shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)],
          f"{label}: shard names {shards}")


def check_hf(label, src_dir, src, out, shards_expected):
    tensors, where, index = st.read_checkpoint(out)
    check_index(label, out, tensors, where, index, shards_expected)
    check(set(tensors) == set(src), f"{label}: names differ: {set(tensors) ^ set(src)}")
    for name, w in src.items():
        if name not in tensors:
            continue
        dtype, shape, raw = tensors[name]
        check(dtype == "BF16" and shape == list(w.shape), f"{label}: {name}: {dtype} {shape}")
        got = st.decode(dtype, shape, raw)
        want = st.round_bf16(w)
        check(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
              f"{label}: {name}: {np.count_nonzero(got != want)} values are not the BF16 rounding")
    check_common(label, src_dir, out, "hf")
    print(f"ok {label}: {len(tensors)} BF16 tensors in {len(set(where.values()))} file(s)")


def check_fp8(label, src_dir, src, out, layers, shards_expected):
    tensors, where, index = st.read_checkpoint(out)
    check_index(label, out, tensors, where, index, shards_expected)
    scales = {f"model.layers.{i}.self_attn.{kv}_scale" for i in range(layers) for kv in "kv"}
    want_names = set(src) | {n + "_scale_inv" for n in src if is_linear(n)} | scales
    check(set(tensors) == want_names, f"{label}: names differ: {set(tensors) ^ want_names}")
    codes_checked = 0
    for name, w in src.items():
        if name not in tensors:
            continue
        dtype, shape, raw = tensors[name]
        if is_linear(name):
            codes, sc = cq.expected_block_quant(w, pow2=False)
            s_dtype, s_shape, s_raw = tensors[name + "_scale_inv"]
            check(dtype == "F8_E4M3" and s_dtype == "F32" and s_shape == list(sc.shape),
                  f"{label}: {name}: {dtype}, scale {s_dtype} {s_shape}")
            check(np.array_equal(np.frombuffer(s_raw, dtype="<f4").reshape(sc.shape), sc),
                  f"{label}: {name}_scale_inv differs from float32(amax)/448")
            got = np.frombuffer(raw, dtype=np.uint8).reshape(w.shape)
            check(np.array_equal(got, codes),
                  f"{label}: {name}: {np.count_nonzero(got != codes)} E4M3 codes differ")
            codes_checked += got.size
        else:
            got = st.decode(dtype, shape, raw)
            check(dtype == "BF16" and np.array_equal(got, st.round_bf16(w)),
                  f"{label}: {name}: not the BF16 rounding")
    for name in scales:
        if name in tensors:
            d, s, raw = tensors[name]
            check(d == "F32" and s == [] and np.frombuffer(raw, "<f4")[0] == 1.0,
                  f"{label}: {name}: {d} {s}")
    check_common(label, src_dir, out, "fp8")
    print(f"ok {label}: {codes_checked} E4M3 codes and their scales")
    return codes_checked


def check_oracle(label, out, rng, tmp):
    """The exported folder as a model: the float64 PyTorch decoder of tests/reference/llama_ref.py
    (Hugging Face equations, its own config.json reading) on the tensors read back by the
    reference reader gives the logprobs `fp8rl score` computes from the same folder."""
    try:
        import torch
        import llama_ref
    except ImportError as e:
        print(f"skip {label}: the PyTorch oracle needs torch ({e})")
        return
    tensors, _, _ = st.read_checkpoint(out)
    params = {n: torch.from_numpy(st.decode(d, s, raw).astype(np.float64))
              for n, (d, s, raw) in tensors.items()}
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    tokens = [int(t) for t in rng.integers(0, config["vocab_size"], 10)]
    z = llama_ref.Llama(config, params).logits(tokens)
    want = torch.log_softmax(z, dim=-1)[:-1].gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
    req, res = os.path.join(tmp, f"{label}.in.jsonl"), os.path.join(tmp, f"{label}.out.jsonl")
    with open(req, "w") as f:
        f.write(json.dumps({"tokens": tokens}) + "\n")
    r = subprocess.run([cq.fp8rl(), "score", "--model", out, "--precision", "fp32", "--in", req,
                        "--out", res], capture_output=True, text=True, timeout=120)
    if not check(r.returncode == 0, f"{label}: fp8rl score: {r.stderr.strip()}"):
        return
    with open(res) as f:
        got = np.array(json.loads(f.readline())["logprobs"], dtype=np.float64)
    # fp32 engine vs float64 oracle: relative to the largest |logprob| (as the golden test).
    err = float(np.max(np.abs(got - want.numpy())))
    scale = max(1.0, float(np.max(np.abs(want.numpy()))))
    check(err <= 1e-5 * scale, f"{label}: logprobs differ from the oracle by {err} (scale {scale})")
    print(f"ok {label}: fp8rl score matches the PyTorch oracle on the export (max |d| {err:.2e}, max |logprob| {scale:.1f})")


def good_cases(tmp, rng):
    layers = 2
    shape = dict(layers=layers, hidden=160, inter=272, heads=4, kv_heads=2, vocab=96)
    f16 = os.path.join(tmp, "src_f16")
    tensors, _ = cq.make_model(f16, rng, dtype="F16", shards=3, **shape)
    src = source_values(tensors)
    n = 0
    for fmt in ("hf", "fp8"):
        out = os.path.join(tmp, f"f16_{fmt}")
        r = run(["--checkpoint", f16, "--out", out, "--format", fmt, "--max-shard-bytes", "60000"])
        if not check(r.returncode == 0, f"f16 {fmt}: exit {r.returncode}: {r.stderr.strip()}"):
            continue
        if fmt == "hf":
            check_hf("sharded F16 -> hf", f16, src, out, 3)
            check_oracle("oracle_f16_hf", out, rng, tmp)
        else:
            n = check_fp8("sharded F16 -> fp8", f16, src, out, layers, 3)
    f32 = os.path.join(tmp, "src_f32")
    tensors, _ = cq.make_model(f32, rng, dtype="F32", **shape)
    out = os.path.join(tmp, "f32_hf")
    r = run(["--checkpoint", f32, "--out", out + "/", "--format", "hf"])  # "out/" names "out"
    if check(r.returncode == 0, f"f32 hf: exit {r.returncode}: {r.stderr.strip()}"):
        check_hf("F32 -> hf (one file)", f32, source_values(tensors), out, 1)
    # The hf export is itself a checkpoint fp8rl reads: exporting it again changes nothing.
    again = os.path.join(tmp, "f32_hf_again")
    r = run(["--checkpoint", out, "--out", again, "--format", "hf"])
    if check(r.returncode == 0, f"re-export: exit {r.returncode}: {r.stderr.strip()}"):
        a, _, _ = st.read_checkpoint(out)
        b, _, _ = st.read_checkpoint(again)
        check(a == b, "re-exporting an hf export changed its tensors")
    return n


def bad_cases(tmp, rng):
    src = os.path.join(tmp, "bad_src")
    cq.make_model(src, rng, dtype="BF16", layers=1, hidden=64, inter=96, heads=2, kv_heads=1,
                  vocab=32)
    no_config = os.path.join(tmp, "no_config")
    cq.make_model(no_config, rng, dtype="BF16", layers=1, hidden=64, inter=96, heads=2,
                  kv_heads=1, vocab=32)
    os.remove(os.path.join(no_config, "config.json"))
    truncated = os.path.join(tmp, "truncated")
    cq.make_model(truncated, rng, dtype="BF16", layers=1, hidden=64, inter=96, heads=2,
                  kv_heads=1, vocab=32)
    path = os.path.join(truncated, "model.safetensors")
    with open(path, "rb") as f:
        blob = f.read()
    with open(path, "wb") as f:
        f.write(blob[:len(blob) // 2])
    existing = os.path.join(tmp, "existing")
    os.makedirs(existing)
    with open(os.path.join(existing, "marker"), "w") as f:
        f.write("keep me")
    out = os.path.join(tmp, "bad_out")
    cases = [
        ("no --out", ["--checkpoint", src, "--format", "hf"], "--out"),
        ("no --format", ["--checkpoint", src, "--out", out], "--format"),
        ("unknown format", ["--checkpoint", src, "--out", out, "--format", "bf16"], "--format"),
        ("no source", ["--out", out, "--format", "hf"], "--checkpoint"),
        ("two sources", ["--checkpoint", src, "--job", "j", "--out", out, "--format", "hf"],
         "--checkpoint"),
        ("shard size 0", ["--checkpoint", src, "--out", out, "--format", "hf",
                          "--max-shard-bytes", "0"], "--max-shard-bytes"),
        ("shard size text", ["--checkpoint", src, "--out", out, "--format", "hf",
                             "--max-shard-bytes", "5GB"], "--max-shard-bytes"),
        ("unknown flag", ["--checkpoint", src, "--out", out, "--format", "hf", "--dtype", "x"],
         "--dtype"),
        ("missing checkpoint", ["--checkpoint", os.path.join(tmp, "nope"), "--out", out,
                                "--format", "hf"], "--checkpoint: "),
        ("no config.json", ["--checkpoint", no_config, "--out", out, "--format", "fp8"],
         "config.json"),
        ("truncated weights", ["--checkpoint", truncated, "--out", out, "--format", "hf"],
         "model.safetensors"),
        ("out exists", ["--checkpoint", src, "--out", existing, "--format", "hf"], "exists"),
        ("out parent missing", ["--checkpoint", src, "--out", os.path.join(tmp, "a", "b"),
                                "--format", "hf"], "parent"),
        ("tokenizer not a folder", ["--checkpoint", src, "--out", out, "--format", "hf",
                                    "--tokenizer", os.path.join(tmp, "nope")], "--tokenizer"),
        ("coordinator without job", ["--checkpoint", src, "--out", out, "--format", "hf",
                                     "--coordinator", "localhost:1"], "--coordinator"),
    ]
    for label, args, needle in cases:
        r = run(args)
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0, f"bad {label}: exit 0")
        check(len(lines) == 1 and lines[0].startswith("fp8rl export: ") and needle in lines[0],
              f"bad {label}: stderr {r.stderr!r} (want one line naming {needle!r})")
        check(not os.path.exists(out), f"bad {label}: left {out}")
        check(not [n for n in os.listdir(tmp) if ".tmp." in n], f"bad {label}: left a temp folder")
        print(f"ok bad {label}: {lines[0] if lines else ''}")
    check(os.listdir(existing) == ["marker"], "a failed run touched the existing output folder")
    return len(cases)


def main():
    if not os.path.exists(cq.fp8rl()):
        print(f"missing {cq.fp8rl()} (set FP8RL_BIN_DIR)", file=sys.stderr)
        return 1
    rng = np.random.default_rng(20261202)
    with tempfile.TemporaryDirectory(prefix="fp8rl_export_") as tmp:
        n = good_cases(tmp, rng)
        n_bad = bad_cases(tmp, rng)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print(f"all checks passed: {n} E4M3 codes, {n_bad} bad-input cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
