#!/usr/bin/python3
"""End-to-end check of `fp8rl quantize` with an independent reader and rounding oracle.

Builds random Llama/Qwen2-shaped checkpoints (F32, BF16, F16; outliers; shapes that are not
multiples of 128; GQA; single-file and sharded), runs the CLI, and decodes its output with code
written here from the file-format and FP8 definitions alone (struct/json + numpy): every scale
must be float32(amax)/float32(448) of its 128x128 block (a power of two with --pow2-scales), every
code the round-to-nearest-even saturating E4M3 of float32(w / scale), kept layers and all other
tensors byte-identical. Bad input must fail with one stderr line and leave no output behind.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

BLOCK = 128
DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F64": 8, "I64": 8, "I32": 4,
              "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
# Linear weights `fp8rl quantize` converts: attention and MLP projections, and the experts of
# mixture-of-experts layers (mlp.experts.{e}.* and the shared expert). Routers stay as they are.
LINEAR_RE = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|"
                       r"mlp\.(experts\.\d+\.|shared_expert\.)?(gate|up|down)_proj)\.weight$")
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


# ---- independent safetensors reader / writer ---------------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    check((8 + n) % 8 == 0, f"{path}: header not padded to 8 bytes")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        assert end - b == count * DTYPE_SIZE[e["dtype"]], name
        tensors[name] = (e["dtype"], list(e["shape"]), data[b:end])
    return tensors


def write_safetensors(path, tensors, header_override=None):
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    text = (header_override or json.dumps(header)).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


# ---- number formats, from their definitions ----------------------------------------------------

def e4m3_decode(codes):
    """OCP E4M3: bias 7, subnormals m/8*2^-6, S.1111.111 is NaN."""
    c = codes.astype(np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 0x7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return s * mag


# The 127 non-negative finite values, indexed by code (strictly increasing).
E4M3_POS = e4m3_decode(np.arange(127, dtype=np.uint8))
assert np.all(np.diff(E4M3_POS) > 0) and E4M3_POS[-1] == 448.0


def e4m3_encode_rne(x):
    """float32 array -> E4M3 codes: nearest value, ties to the even code, saturate at 448."""
    x = x.astype(np.float64)  # exact
    ax = np.abs(x)
    hi = np.clip(np.searchsorted(E4M3_POS, ax, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    d_lo = ax - E4M3_POS[lo]
    d_hi = E4M3_POS[hi] - ax
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(ax >= E4M3_POS[hi], hi, code)  # exact hit (and the 0 case)
    code = np.where(ax > 448.0, 126, code)          # saturating
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def decode_weight(dtype, raw, shape):
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    raise ValueError(dtype)


def encode(dtype, x):
    if dtype == "F32":
        return x.astype("<f4").tobytes()
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    if dtype == "BF16":
        return bf16_bits(x).astype("<u2").tobytes()
    raise ValueError(dtype)


def expected_block_quant(w, pow2):
    n, k = w.shape
    sr, sc = -(-n // BLOCK), -(-k // BLOCK)
    scales = np.zeros((sr, sc), dtype=np.float32)
    codes = np.zeros((n, k), dtype=np.uint8)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = np.float32(np.max(np.abs(blk)))
            if amax == 0:
                s = np.float32(1.0)
            else:
                s = np.float32(amax / np.float32(448.0))
                if pow2:
                    m, e = np.frexp(np.float64(s))
                    s = np.float32(2.0 ** (e - 1 if m == 0.5 else e))
            scales[i, j] = s
            q = (blk / s).astype(np.float32)  # fp32 division, as the recipe says
            codes[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = e4m3_encode_rne(q)
    return codes, scales


# ---- random checkpoints ------------------------------------------------------------------------

def make_model(root, rng, *, dtype, layers, hidden, inter, heads, kv_heads, vocab, shards=1,
               biases=False, zero_block=False, ties=False, experts=0):
    os.makedirs(root)
    head_dim = hidden // heads
    tensors = {}

    def add(name, shape, scale=0.05, outliers=True, tdtype=None):
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
        x[x == 0] = np.float32(1e-3)
        if outliers and x.size > 10:
            idx = rng.choice(x.size, size=max(1, x.size // 500), replace=False)
            x.flat[idx] *= np.float32(rng.uniform(50, 400))
        tensors[name] = (tdtype or dtype, list(shape), encode(tdtype or dtype, x))

    add("model.embed_tokens.weight", (vocab, hidden))
    add("lm_head.weight", (vocab, hidden))
    add("model.norm.weight", (hidden,), 1.0, False)
    for i in range(layers):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", (hidden,), 1.0, False)
        add(p + "post_attention_layernorm.weight", (hidden,), 1.0, False)
        add(p + "self_attn.q_proj.weight", (heads * head_dim, hidden))
        add(p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden))
        add(p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden))
        add(p + "self_attn.o_proj.weight", (hidden, heads * head_dim))
        add(p + "mlp.gate_proj.weight", (inter, hidden))
        add(p + "mlp.up_proj.weight", (inter, hidden), 1e-3)  # small: many subnormal codes
        add(p + "mlp.down_proj.weight", (hidden, inter), 20.0)  # large: outliers beyond 448
        if experts:  # Qwen2-MoE naming: router, experts, shared expert and its gate
            add(p + "mlp.gate.weight", (experts, hidden))
            add(p + "mlp.shared_expert_gate.weight", (1, hidden))
            for e in ["shared_expert."] + [f"experts.{j}." for j in range(experts)]:
                add(p + "mlp." + e + "gate_proj.weight", (inter // 2, hidden))
                add(p + "mlp." + e + "up_proj.weight", (inter // 2, hidden))
                add(p + "mlp." + e + "down_proj.weight", (hidden, inter // 2))
        if biases:
            add(p + "self_attn.q_proj.bias", (heads * head_dim,), 0.1, False)
            add(p + "self_attn.k_proj.bias", (kv_heads * head_dim,), 0.1, False)
            add(p + "self_attn.v_proj.bias", (kv_heads * head_dim,), 0.1, False)
    if zero_block:  # one all-zero 128x128 block: its scale must be 1 and its codes 0
        d, shape, raw = tensors["model.layers.0.mlp.gate_proj.weight"]
        w = decode_weight(d, raw, shape).copy()
        w[:BLOCK, :BLOCK] = 0
        tensors["model.layers.0.mlp.gate_proj.weight"] = (d, shape, encode(d, w))
    if ties:  # a block with scale exactly 1 holding every E4M3 midpoint: ties go to even codes
        d, shape, raw = tensors["model.layers.1.self_attn.o_proj.weight"]
        w = decode_weight(d, raw, shape).copy()
        mids = ((E4M3_POS[:-1] + E4M3_POS[1:]) / 2).astype(np.float32)
        w[0, 0] = 448.0
        w[1, :len(mids)] = mids
        w[2, :len(mids)] = -mids
        tensors["model.layers.1.self_attn.o_proj.weight"] = (d, shape, encode(d, w))
    tensors["model.rotary_extra.position_ids"] = ("I64", [7], np.arange(7, dtype="<i8").tobytes())

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "num_hidden_layers": layers, "vocab_size": vocab,
              "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16" if dtype == "BF16" else "float32"}
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(root, "tokenizer.json"), "w") as f:
        json.dump({"model": {"vocab": {"a": 0, "b": 1}}, "seed": int(rng.integers(1 << 30))}, f)
    with open(os.path.join(root, "generation_config.json"), "w") as f:
        json.dump({"temperature": 0.6, "top_p": 0.9}, f)

    names = sorted(tensors)
    if shards == 1:
        write_safetensors(os.path.join(root, "model.safetensors"), tensors)
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[s::shards]}
            write_safetensors(os.path.join(root, fname), part)
            weight_map.update({n: fname for n in part})
        with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    return tensors, config


# ---- running and checking ----------------------------------------------------------------------

def fp8rl():
    return os.path.join(os.environ.get("FP8RL_BIN_DIR", "build/bin"), "fp8rl")


def run(args):
    return subprocess.run([fp8rl(), "quantize"] + args, capture_output=True, text=True,
                          timeout=120)


def check_output(label, model_dir, out_dir, tensors, config, *, pow2, first, last):
    layers = config["num_hidden_layers"]
    kept_layers = {i for i in range(layers) if i < first or i >= layers - last}
    out = read_safetensors(os.path.join(out_dir, "model.safetensors"))
    expected_names = set(tensors)
    n_codes = n_quant = 0
    kept_modules = []
    for name, (dtype, shape, raw) in sorted(tensors.items()):
        parts = name.split(".")
        is_linear = LINEAR_RE.match(name) is not None
        if not is_linear or int(parts[2]) in kept_layers:
            if is_linear:
                kept_modules.append(name[:-len(".weight")])
                check(name + "_scale_inv" not in out, f"{label}: kept {name} has scales")
            check(out.get(name) == (dtype, shape, raw), f"{label}: {name} not byte-identical")
            continue
        expected_names.add(name + "_scale_inv")
        got_dtype, got_shape, got_raw = out[name]
        check(got_dtype == "F8_E4M3" and got_shape == shape, f"{label}: {name} dtype/shape")
        s_dtype, s_shape, s_raw = out[name + "_scale_inv"]
        want_sshape = [-(-shape[0] // BLOCK), -(-shape[1] // BLOCK)]
        check(s_dtype == "F32" and s_shape == want_sshape,
              f"{label}: {name}_scale_inv is {s_dtype} {s_shape}, want F32 {want_sshape}")
        w = decode_weight(dtype, raw, shape)
        want_codes, want_scales = expected_block_quant(w, pow2)
        scales = np.frombuffer(s_raw, dtype="<f4").reshape(s_shape)
        codes = np.frombuffer(got_raw, dtype=np.uint8).reshape(shape)
        if check(np.array_equal(scales.view(np.uint32), want_scales.view(np.uint32)),
                 f"{label}: {name} scales differ"):
            bad = np.argwhere(codes != want_codes)
            if not check(len(bad) == 0, f"{label}: {name}: {len(bad)} codes differ"):
                r, c = bad[0]
                s = want_scales[r // BLOCK, c // BLOCK]
                print(f"  first at [{r},{c}]: w={w[r, c]!r} w/s={np.float32(w[r, c] / s)!r} "
                      f"got 0x{codes[r, c]:02x} want 0x{want_codes[r, c]:02x}", file=sys.stderr)
        if pow2:
            m, _ = np.frexp(scales.astype(np.float64))
            check(np.all(m == 0.5), f"{label}: {name} scales not powers of two")
        # Dequantized values stay close to the weights (a scale-free sanity bound).
        deq = e4m3_decode(codes) * np.repeat(np.repeat(scales, BLOCK, 0), BLOCK, 1)[
            :shape[0], :shape[1]]
        x, y = w.astype(np.float64), deq
        diff = 1 - 2 * np.sum(x * y) / (np.sum(x * x) + np.sum(y * y))
        check(diff < 1e-3, f"{label}: {name} calc_diff {diff}")
        n_codes += codes.size
        n_quant += 1
    check(set(out) == expected_names,
          f"{label}: tensor names differ: {sorted(set(out) ^ expected_names)[:6]}")

    with open(os.path.join(out_dir, "config.json")) as f:
        got_config = json.load(f)
    qc = got_config.pop("quantization_config", None)
    check(got_config == config, f"{label}: config.json fields changed")
    want_qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
               "weight_block_size": [128, 128]}
    if kept_modules:
        check(qc and sorted(qc.get("modules_to_not_convert", [])) == sorted(kept_modules),
              f"{label}: modules_to_not_convert {qc and qc.get('modules_to_not_convert')}")
    check(qc is not None and {k: qc[k] for k in want_qc if k in qc} == want_qc,
          f"{label}: quantization_config {qc}")
    for side in ("tokenizer.json", "generation_config.json"):
        with open(os.path.join(model_dir, side), "rb") as a, \
                open(os.path.join(out_dir, side), "rb") as b:
            check(a.read() == b.read(), f"{label}: {side} not copied unchanged")
    want_files = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"}
    check(set(os.listdir(out_dir)) == want_files, f"{label}: files {sorted(os.listdir(out_dir))}")
    parent = os.path.dirname(out_dir)
    leftovers = [e for e in os.listdir(parent) if ".tmp." in e or ".old." in e]
    check(not leftovers, f"{label}: temporary entries left: {leftovers}")
    return n_quant, n_codes


def good_cases(tmp, rng):
    cases = [
        # label, model kwargs, flags
        ("f32_single", dict(dtype="F32", layers=3, hidden=200, inter=300, heads=4, kv_heads=2,
                            vocab=64, zero_block=True, ties=True), [], False, 0, 0),
        ("bf16_sharded_pow2_kept", dict(dtype="BF16", layers=4, hidden=256, inter=416, heads=8,
                                        kv_heads=2, vocab=96, shards=3, biases=True),
         ["--pow2-scales", "--bf16-first-layers", "1", "--bf16-last-layers", "1"], True, 1, 1),
        ("f16_qwen2", dict(dtype="F16", layers=2, hidden=136, inter=260, heads=2, kv_heads=1,
                           vocab=32, biases=True), ["--bf16-last-layers=1"], False, 0, 1),
        ("bf16_moe_experts", dict(dtype="BF16", layers=2, hidden=160, inter=288, heads=4,
                                  kv_heads=2, vocab=40, experts=3), [], False, 0, 0),
    ]
    total_q = total_codes = 0
    for label, kw, flags, pow2, first, last in cases:
        model_dir = os.path.join(tmp, label)
        out_dir = os.path.join(tmp, label + "_fp8")
        tensors, config = make_model(model_dir, rng, **kw)
        # (one run names the output with a trailing slash, as shells complete folders)
        r = run(["--model", model_dir, "--out", out_dir + ("/" if "f16" in label else "")] + flags)
        if not check(r.returncode == 0, f"{label}: exit {r.returncode}: {r.stderr.strip()[-500:]}"):
            continue
        check("[1/" in r.stdout, f"{label}: no progress lines")
        check(r.stderr == "", f"{label}: unexpected stderr {r.stderr!r}")
        summary = r.stdout.strip().splitlines()[-1]
        check("linear weights -> F8_E4M3" in summary, f"{label}: no summary: {summary!r}")
        q, n = check_output(label, model_dir, out_dir, tensors, config, pow2=pow2, first=first,
                            last=last)
        total_q += q
        total_codes += n
        print(f"ok {label}: {q} weights, {n} codes checked; {summary}")
    # Re-running onto an existing output replaces it (a stale file disappears).
    label = "f32_single"
    out_dir = os.path.join(tmp, label + "_fp8")
    with open(os.path.join(out_dir, "stale.txt"), "w") as f:
        f.write("old")
    r = run(["--model", os.path.join(tmp, label), "--out", out_dir, "--pow2-scales"])
    check(r.returncode == 0 and not os.path.exists(os.path.join(out_dir, "stale.txt")),
          "rerun did not replace the existing output")
    with open(os.path.join(tmp, label, "config.json")) as f:
        config = json.load(f)
    tensors = read_safetensors(os.path.join(tmp, label, "model.safetensors"))
    check_output(label + "_rerun_pow2", os.path.join(tmp, label), out_dir, tensors, config,
                 pow2=True, first=0, last=0)
    return total_q, total_codes


def bad_cases(tmp, rng):
    """Returns the number of bad-input cases run."""
    base = os.path.join(tmp, "bad_base")
    make_model(base, rng, dtype="BF16", layers=2, hidden=64, inter=96, heads=2, kv_heads=1,
               vocab=16)

    def variant(name, mutate):
        d = os.path.join(tmp, name)
        shutil.copytree(base, d)
        mutate(d)
        return d

    def truncate(d):
        p = os.path.join(d, "model.safetensors")
        os.truncate(p, os.path.getsize(p) - 3)

    def malformed(d):
        p = os.path.join(d, "model.safetensors")
        with open(p, "r+b") as f:
            f.seek(8)
            f.write(b"{]")

    def retensor(d, name, dtype=None, shape=None):
        p = os.path.join(d, "model.safetensors")
        t = read_safetensors(p)
        old_dtype, old_shape, raw = t[name]
        t[name] = (dtype or old_dtype, shape or old_shape, raw)
        write_safetensors(p, t)

    def unknown_dtype(d):
        p = os.path.join(d, "model.safetensors")
        t = read_safetensors(p)
        header, off = {}, 0
        for n in sorted(t):
            header[n] = {"dtype": "F8_E5M2" if n == "model.norm.weight" else t[n][0],
                         "shape": t[n][1], "data_offsets": [off, off + len(t[n][2])]}
            off += len(t[n][2])
        write_safetensors(p, t, header_override=json.dumps(header))

    def shard_missing(d):
        os.remove(os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}, f)

    q = "model.layers.0.self_attn.q_proj.weight"
    cases = [
        ("missing_model", os.path.join(tmp, "nope"), [], "does not exist"),
        ("no_config", variant("no_config", lambda d: os.remove(os.path.join(d, "config.json"))),
         [], "config.json"),
        ("truncated", variant("truncated", truncate), [], "out of range"),
        ("malformed", variant("malformed", malformed), [], "malformed JSON"),
        ("not_2d", variant("not_2d", lambda d: retensor(d, q, shape=[2, 32, 64])), [], "2-D"),
        ("int_weight", variant("int_weight", lambda d: retensor(d, q, dtype="I16")), [], "I16"),
        ("unknown_dtype", variant("unknown_dtype", unknown_dtype), [], "F8_E5M2"),
        ("missing_shard", variant("missing_shard", shard_missing), [], "missing"),
        ("neg_first", base, ["--bf16-first-layers", "-1"], "--bf16-first-layers"),
        ("bad_last", base, ["--bf16-last-layers", "x"], "--bf16-last-layers"),
        ("too_many_layers", base, ["--bf16-first-layers", "3"], "num_hidden_layers"),
        ("unknown_flag", base, ["--fast"], "--fast"),
    ]
    for label, model_dir, flags, needle in cases:
        out_dir = os.path.join(tmp, "out_" + label)
        before = set(os.listdir(tmp))
        r = run(["--model", model_dir, "--out", out_dir] + flags)
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0, f"bad {label}: exit 0")
        check(len(lines) == 1 and lines[0].startswith("fp8rl quantize: ") and needle in lines[0],
              f"bad {label}: stderr {r.stderr!r} (want one line with {needle!r})")
        check(set(os.listdir(tmp)) == before, f"bad {label}: left {set(os.listdir(tmp)) - before}")
        print(f"ok bad {label}: {lines[0] if lines else ''}")

    # --out equal to --model, or containing it, or missing; an existing output survives a failure.
    for label, args, needle in [
        ("same_dir", ["--model", base, "--out", base + "/"], "must differ"),
        ("out_parent", ["--model", base, "--out", tmp], "contains the --model"),
        ("no_out", ["--model", base], "--out"),
    ]:
        before = {e: sorted(os.listdir(os.path.join(tmp, e))) for e in os.listdir(tmp)
                  if os.path.isdir(os.path.join(tmp, e))}
        r = run(args)
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0 and len(lines) == 1 and needle in lines[0],
              f"bad {label}: exit {r.returncode}, stderr {r.stderr!r}")
        after = {e: sorted(os.listdir(os.path.join(tmp, e))) for e in os.listdir(tmp)
                 if os.path.isdir(os.path.join(tmp, e))}
        check(before == after, f"bad {label}: folders changed")
        print(f"ok bad {label}: {lines[0] if lines else ''}")
    keep = os.path.join(tmp, "existing_out")
    os.makedirs(keep)
    with open(os.path.join(keep, "marker"), "w") as f:
        f.write("keep me")
    r = run(["--model", os.path.join(tmp, "truncated"), "--out", keep])
    check(r.returncode != 0 and os.listdir(keep) == ["marker"],
          "a failed run touched the existing output folder")
    return len(cases) + 4


def main():
    if not os.path.exists(fp8rl()):
        print(f"missing {fp8rl()} (set FP8RL_BIN_DIR)", file=sys.stderr)
        return 1
    rng = np.random.default_rng(20240601)
    with tempfile.TemporaryDirectory(prefix="fp8rl_quantize_") as tmp:
        q, n = good_cases(tmp, rng)
        n_bad = bad_cases(tmp, rng)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print(f"all checks passed: {q} quantized weights, {n} E4M3 codes, {n_bad} bad-input cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
