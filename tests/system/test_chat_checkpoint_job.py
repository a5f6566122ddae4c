#!/usr/bin/env python3
"""System test: a job whose model.checkpoint is a tiny Hugging Face folder with its own tokenizer.

The folder is built here: random F32 Llama weights (model.safetensors written with struct/numpy),
a byte-level BPE tokenizer.json whose ids are not the byte tokenizer's (bytes at 10-265, one
merge, ChatML markers and <|endoftext|> above them), a ChatML chat_template and two EOS ids in
generation_config.json. `fp8rl run` (SFT warm start, GRPO steps, validation, FP8 KV calibration)
must end SUCCEEDED, and the coordinator's "prompt format" line must show the first training
prompt encoded as the template's text in this tokenizer (ids computed here from the vocabulary's
definition) with generation stopping at both EOS ids; the trainer's logprob log must hold P*G
sequences per step.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time

import numpy as np

import system_util as su

OFFSET = 10  # byte b has id b + OFFSET: byte ids fed by mistake would decode to other text
US, IM_START, IM_END, EOT = 266, 300, 301, 302
VOCAB = 304
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


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


def expected_prompt_ids(text):
    """ChatML of one user turn, encoded by hand: specials by id, bytes + OFFSET, "us" merged."""
    ids = [IM_START]
    for piece in ["user\n", text]:
        i, data = 0, piece.encode()
        while i < len(data):
            if data[i:i + 2] == b"us":
                ids.append(US)
                i += 2
            else:
                ids.append(data[i] + OFFSET)
                i += 1
    ids += [IM_END, ord("\n") + OFFSET, IM_START] + [b + OFFSET for b in b"assistant\n"]
    return ids


def write_safetensors(path, tensors):
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def write_checkpoint(root):
    os.makedirs(root)
    hidden, inter, heads, kv_heads, head_dim, layers = 64, 128, 4, 2, 16, 2
    rng = np.random.default_rng(3)
    t = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, hidden)) * 0.05,
         "model.norm.weight": np.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(hidden)
        t[p + "post_attention_layernorm.weight"] = np.ones(hidden)
        t[p + "self_attn.q_proj.weight"] = rng.standard_normal((heads * head_dim, hidden)) * 0.05
        t[p + "self_attn.k_proj.weight"] = rng.standard_normal((kv_heads * head_dim, hidden)) * 0.05
        t[p + "self_attn.v_proj.weight"] = rng.standard_normal((kv_heads * head_dim, hidden)) * 0.05
        t[p + "self_attn.o_proj.weight"] = rng.standard_normal((hidden, heads * head_dim)) * 0.05
        t[p + "mlp.gate_proj.weight"] = rng.standard_normal((inter, hidden)) * 0.05
        t[p + "mlp.up_proj.weight"] = rng.standard_normal((inter, hidden)) * 0.05
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((hidden, inter)) * 0.05
    write_safetensors(os.path.join(root, "model.safetensors"), t)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32",
              "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim,
              "max_position_embeddings": 512, "tie_word_embeddings": True,
              "eos_token_id": [EOT, IM_END]}
    chars = byte_chars()
    vocab = {chars[b]: b + OFFSET for b in range(256)}
    vocab["us"] = US

    def special(i, text):
        return {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [special(IM_START, "<|im_start|>"), special(IM_END, "<|im_end|>"),
                         special(EOT, "<|endoftext|>")],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                  "merges": ["u s"], "byte_fallback": False, "ignore_merges": False}}
    files = {"config.json": config, "tokenizer.json": tokenizer,
             "tokenizer_config.json": {"eos_token": "<|im_end|>", "chat_template": TEMPLATE},
             "generation_config.json": {"eos_token_id": [EOT, IM_END]}}
    for name, value in files.items():
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            json.dump(value, f)


def main():
    su.require_binaries()
    tmp = tempfile.mkdtemp(prefix="fp8rl-system-chat-")
    ckpt = os.path.join(tmp, "chat-model")
    write_checkpoint(ckpt)
    config = su.smoke_config(tmp, steps=2)
    config["model"] = {"checkpoint": ckpt}
    config["sft"]["steps"] = 2
    config["validation"]["num_prompts"] = 8
    config["checkpoint"]["every_steps"] = 0
    path = su.write_yaml(os.path.join(tmp, "chat.yaml"), config)
    data_dir = os.path.join(tmp, "data")
    args = [su.FP8RL, "run", path, "--port-offset", str(su.free_port_offset(2)),
            "--data-dir", data_dir, "--models-root", tmp, "--data-root", tmp]
    su.log("running: " + " ".join(args))
    start = time.time()
    p = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=su.SOURCE_DIR)
    su.log(p.stdout[-3000:])
    su.log(p.stderr[-3000:])
    su.log(f"fp8rl run took {time.time() - start:.1f} s, exit {p.returncode}")
    su.check(p.returncode == 0, f"fp8rl run exited with {p.returncode}")
    m = re.search(r"=== job (job-\S+): SUCCEEDED after 2/2 steps ===", p.stdout)
    su.check(m, "the job on the chat checkpoint did not succeed")
    job_id = m.group(1)

    with open(os.path.join(data_dir, "logs", "coordinator.log"), errors="replace") as f:
        lines = [ln for ln in f if "prompt format" in ln and job_id in ln]
    su.check(len(lines) == 1, f"expected one 'prompt format' line for {job_id}, got {len(lines)}")
    line = lines[0]

    def field(name):
        fm = re.search(r"\b" + name + r'=("(?:[^"\\]|\\.)*"|\S*)', line)
        su.check(fm, f"no {name} in: {line}")
        value = fm.group(1)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        return value
    su.check(field("stop_ids") == f"{EOT},{IM_END}", f"stop ids: {line}")
    su.check(field("chat_template") == "yes", f"no chat template: {line}")
    prompt = field("example_prompt")
    ids = [int(x) for x in field("example_ids").split(",")]
    su.check(ids == expected_prompt_ids(prompt),
             f"prompt {prompt!r} encoded as {ids}, want {expected_prompt_ids(prompt)}")

    log_dir = os.path.join(data_dir, "trainer", "logprobs", job_id)
    for step in (1, 2):
        with open(os.path.join(log_dir, f"step-{step}.jsonl")) as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
        su.check(len(rows) == 1 + 16, f"step {step}: {len(rows) - 1} sequences in the log, want 16")
    shutil.rmtree(tmp, ignore_errors=True)  # kept on failure for the logs
    su.log("PASS")


if __name__ == "__main__":
    main()
