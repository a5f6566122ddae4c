#!/usr/bin/python3
"""PyTorch CPU eager baseline for fp8rl-bench-model: the same decoder (tests/reference/llama_ref.py
equations, float32) timed for prefill, KV-cache decode and forward+backward training.

  torch_bench.py CONFIG.json BATCH PROMPT_LEN DECODE_STEPS  -> one JSON line of tokens/s
"""
import json
import math
import sys
import time

import torch


def main():
    config = json.load(open(sys.argv[1]))
    batch, plen, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(0)
    h, nh = config["hidden_size"], config["num_attention_heads"]
    nkv, hd = config["num_key_value_heads"], config.get("head_dim", h // nh)
    f, V, L = config["intermediate_size"], config["vocab_size"], config["num_hidden_layers"]
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    lin = lambda o, i: torch.nn.Parameter(torch.randn(o, i) * 0.02)
    layers = [dict(n1=torch.nn.Parameter(torch.ones(h)), q=lin(nh * hd, h), k=lin(nkv * hd, h),
                   v=lin(nkv * hd, h), o=lin(h, nh * hd), n2=torch.nn.Parameter(torch.ones(h)),
                   g=lin(f, h), u=lin(f, h), d=lin(h, f)) for _ in range(L)]
    emb, norm = lin(V, h), torch.nn.Parameter(torch.ones(h))
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def rope(x, pos):
        a = pos[:, None].float() * inv[None]
        e = torch.cat([a, a], -1)
        half = hd // 2
        return x * e.cos() + torch.cat([-x[..., half:], x[..., :half]], -1) * e.sin()

    def forward(tokens, start, cache):  # tokens [B, T]; cache: list of (k, v) [B, nkv, S, hd]
        b, t = tokens.shape
        x = emb[tokens]
        pos = torch.arange(start, start + t)
        for i, p in enumerate(layers):
            y = rms(x, p["n1"])
            q = (y @ p["q"].t()).view(b, t, nh, hd).transpose(1, 2)
            k = (y @ p["k"].t()).view(b, t, nkv, hd).transpose(1, 2)
            v = (y @ p["v"].t()).view(b, t, nkv, hd).transpose(1, 2)
            q, k = rope(q, pos), rope(k, pos)
            if cache is not None:
                if len(cache) > i:
                    k = torch.cat([cache[i][0], k], 2)
                    v = torch.cat([cache[i][1], v], 2)
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
            rep = nh // nkv
            kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = q @ kk.transpose(-1, -2) / math.sqrt(hd)
            n = kk.shape[2]
            mask = torch.full((t, n), float("-inf")).triu(n - t + 1)
            o = (torch.softmax(s + mask, -1) @ vv).transpose(1, 2).reshape(b, t, nh * hd)
            x = x + o @ p["o"].t()
            y = rms(x, p["n2"])
            x = x + (torch.nn.functional.silu(y @ p["g"].t()) * (y @ p["u"].t())) @ p["d"].t()
        return rms(x, norm) @ emb.t()

    tokens = torch.randint(0, V, (batch, plen))
    out = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        cache = []
        z = forward(tokens, 0, cache)
        out["prefill"] = batch * plen / (time.perf_counter() - t0)
        nxt = z[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for s in range(steps):
            z = forward(nxt, plen + s, cache)
            nxt = z[:, -1].argmax(-1, keepdim=True)
        out["decode"] = batch * steps / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    z = forward(tokens, 0, None)
    lp = torch.log_softmax(z[:, :-1], -1).gather(-1, tokens[:, 1:, None])
    (-lp.mean()).backward()
    out["train"] = batch * plen / (time.perf_counter() - t0)
    print(json.dumps(out))


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
