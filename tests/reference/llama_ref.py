#!/usr/bin/python3
"""Independent PyTorch oracle for the fp8rl model engine (Llama / Qwen2 / Qwen3 decoder).

Written from the Hugging Face LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM equations
(RMSNorm, rotate-half RoPE with rope_theta and the Llama 3.1 "llama3" frequency scaling, GQA,
SwiGLU, optional q/k/v bias, Qwen3's per-head q_norm / k_norm before RoPE, explicit head_dim,
tied or untied lm_head) without the `transformers` package. Runs in float64 (or float32 with
--dtype f32) on the CPU.

  llama_ref.py CHECKPOINT_DIR REQUEST.json OUT.safetensors [CHECKPOINT_DIR REQUEST.json OUT ...]

REQUEST.json: {"sequences": [[tok, ...], ...], "dlogp": [[w, ...], ...], "temperature": T}
OUT.safetensors (F32): logits.<s> [T_s, vocab] (before temperature), logprobs.<s> [T_s - 1],
grad.<param name> for every parameter of L = sum_s sum_i dlogp[s][i] * logprobs[s][i].
Also usable as a module (bench/model imports `Llama`).
"""
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "BF16": (torch.bfloat16, 2),
          "F16": (torch.float16, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[meta["dtype"]]
        begin, end = meta["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if end > begin else \
            torch.zeros(0, dtype=dtype)
        out[name] = t.reshape(meta["shape"]).to(torch.float64)
    return out


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset,
                                                                                 offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


class Llama:
    """The decoder as plain tensor code; params is a dict name -> leaf tensor."""

    def __init__(self, config, params):
        self.c = config
        self.p = params
        self.h = config["hidden_size"]
        self.nh = config["num_attention_heads"]
        self.nkv = config.get("num_key_value_heads", self.nh)
        qwen3 = config.get("model_type") in ("qwen3", "qwen3_moe")
        # Qwen3Config defaults head_dim to 128; Llama and Qwen2 derive it.
        self.hd = config.get("head_dim") or (128 if qwen3 else self.h // self.nh)
        self.qk_norm = qwen3
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.theta = config.get("rope_theta", 10000.0)
        self.tied = config.get("tie_word_embeddings", False)
        self.layers = config["num_hidden_layers"]

    def rmsnorm(self, x, w):
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + self.eps))

    def inv_freq(self):
        # HF computes the plain frequencies in float32; the llama3 rescaling is evaluated here in
        # float64 on those values (HF: float32), see _compute_llama3_parameters.
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        inv_freq = inv_freq.to(torch.float64)
        scaling = self.c.get("rope_scaling") or {"rope_type": "default"}
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type == "default":
            return inv_freq
        if rope_type != "llama3":
            sys.exit(f"llama_ref.py: rope_scaling.rope_type {rope_type!r} is not implemented")
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_len / low
        high_freq_wavelen = old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)

    def rope(self, x, pos):  # x [heads, T, hd]
        ang = pos.to(torch.float64)[:, None] * self.inv_freq()[None, :]
        emb = torch.cat([ang, ang], dim=-1).to(x.dtype)
        cos, sin = emb.cos(), emb.sin()
        half = self.hd // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def linear(self, x, name, bias=False):
        y = x @ self.p[name + ".weight"].t()
        if bias and (name + ".bias") in self.p:
            y = y + self.p[name + ".bias"]
        return y

    def mlp(self, layer, h):
        """The dense SwiGLU MLP of layer `layer` (moe_ref.py overrides it for sparse layers)."""
        pre = f"model.layers.{layer}.mlp."
        g = self.linear(h, pre + "gate_proj")
        u = self.linear(h, pre + "up_proj")
        return self.linear(torch.nn.functional.silu(g) * u, pre + "down_proj")

    def logits(self, tokens):
        p = self.p
        t = len(tokens)
        x = p["model.embed_tokens.weight"][torch.tensor(tokens)]
        pos = torch.arange(t)
        mask = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
        for i in range(self.layers):
            pre = f"model.layers.{i}."
            h = self.rmsnorm(x, p[pre + "input_layernorm.weight"])
            q = self.linear(h, pre + "self_attn.q_proj", True).view(t, self.nh, self.hd)
            k = self.linear(h, pre + "self_attn.k_proj", True).view(t, self.nkv, self.hd)
            v = self.linear(h, pre + "self_attn.v_proj", True).view(t, self.nkv, self.hd)
            if self.qk_norm:  # Qwen3: RMSNorm over each head's head_dim values, before RoPE
                q = self.rmsnorm(q, p[pre + "self_attn.q_norm.weight"])
                k = self.rmsnorm(k, p[pre + "self_attn.k_norm.weight"])
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
            q, k = self.rope(q, pos), self.rope(k, pos)
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=0)
            v = v.repeat_interleave(rep, dim=0)
            s = q @ k.transpose(1, 2) / math.sqrt(self.hd) + mask
            o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(t, self.nh * self.hd)
            x = x + self.linear(o, pre + "self_attn.o_proj")
            h = self.rmsnorm(x, p[pre + "post_attention_layernorm.weight"])
            x = x + self.mlp(i, h)
        x = self.rmsnorm(x, p["model.norm.weight"])
        head = p["model.embed_tokens.weight"] if self.tied else p["lm_head.weight"]
        return x @ head.t()


def run(ckpt, request_path, out_path, dtype):
    with open(ckpt + "/config.json") as f:
        config = json.load(f)
    with open(request_path) as f:
        req = json.load(f)
    raw = read_safetensors(ckpt + "/model.safetensors")
    params = {n: t.to(dtype).requires_grad_(True) for n, t in raw.items()
              if not n.endswith("_scale")}
    model = Llama(config, params)
    temp = float(req.get("temperature", 1.0))
    out = {}
    loss = torch.zeros((), dtype=dtype)
    for s, (tokens, dlogp) in enumerate(zip(req["sequences"], req["dlogp"])):
        z = model.logits(tokens)
        lp = torch.log_softmax(z / temp, dim=-1)
        lp = lp[:-1].gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
        loss = loss + (lp * torch.tensor(dlogp, dtype=dtype)).sum()
        out[f"logits.{s}"] = z
        out[f"logprobs.{s}"] = lp
    loss.backward()
    for n, t in params.items():
        out["grad." + n] = t.grad if t.grad is not None else torch.zeros_like(t)
    write_safetensors(out_path, out)


def main():
    dtype = torch.float32 if "--dtype=f32" in sys.argv else torch.float64
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args or len(args) % 3:
        sys.exit("usage: llama_ref.py CKPT REQUEST.json OUT.safetensors [...]")
    for i in range(0, len(args), 3):
        run(args[i], args[i + 1], args[i + 2], dtype)


if __name__ == "__main__":
    main()
