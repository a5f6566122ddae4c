#!/usr/bin/env python3
"""PyTorch BF16 baseline of fp8rl-bench-decode-gpu: a Llama-3.1-8B-shaped decoder (hidden 4096,
32 heads, 8 KV heads, head_dim 128, MLP 14336, vocab 128256; --layers of the 32, random weights)
timed for prefill and KV-cache decode with torch.nn.functional.scaled_dot_product_attention, on
the same cells and with the same table columns as the C++ benchmark (docs/perf.md "Decode on the
GPU"). Eager mode, no CUDA graphs, no compile: the plain baseline the issue asks for.

  torch_baseline.py [--layers 4] [--batches 1,32,256] [--contexts 1024,4096]
                    [--decode-steps 8] [--prefill-tokens 16384] [--device cuda]

Cells: decode = `decode-steps` steps of one new token for each of `batch` sequences whose KV cache
already holds `context` positions (random K/V written directly: no prefill is run for it);
prefill = one forward of min(batch, prefill-tokens / context) prompts of `context` tokens
(the "seqs" column), logits of the last position only. Exit 2 without a CUDA device unless
--device cpu (a smoke run on small shapes: --hidden etc. are not options; use --layers 1 and
small --contexts there).
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 128256
ROPE_THETA, EPS = 500000.0, 1e-5
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--prefill-tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    return ap.parse_args()


class Model:
    """Random BF16 weights, N(0, 0.02); norms 1."""

    def __init__(self, layers, device):
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(o, i):
            return (torch.randn(o, i, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)

        self.layers = [dict(qkv=w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
                            o=w(HIDDEN, HEADS * HEAD_DIM), gate_up=w(2 * INTER, HIDDEN),
                            down=w(HIDDEN, INTER),
                            n1=torch.ones(HIDDEN, device=device, dtype=torch.bfloat16),
                            n2=torch.ones(HIDDEN, device=device, dtype=torch.bfloat16))
                       for _ in range(layers)]
        self.embed = w(VOCAB, HIDDEN)
        self.lm_head = w(VOCAB, HIDDEN)
        self.norm = torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)
        self.inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, device=device).float()
                                              / HEAD_DIM))


def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def rope(x, pos, inv_freq):
    """x [B, heads, T, D]; pos [B, T] (int); rotate-half."""
    ang = pos.float()[:, None, :, None] * inv_freq  # [B, 1, T, D/2]
    cos, sin = torch.cos(ang).repeat(1, 1, 1, 2), torch.sin(ang).repeat(1, 1, 1, 2)
    x1, x2 = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def attention(q, k, v, causal):
    """q [B, HEADS, Tq, D]; k, v [B, KV_HEADS, Tk, D]."""
    group = HEADS // KV_HEADS
    if not causal and q.shape[2] == 1:
        # Decode: one query per head, no mask, so each KV head's group of query heads is a query
        # sequence of length `group` over that head's keys (GQA without copying K/V).
        b = q.shape[0]
        qg = q.reshape(b, KV_HEADS, group, HEAD_DIM)
        out = sdpa(qg, k, v, False)
        return out.reshape(b, HEADS, 1, HEAD_DIM)
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return sdpa(q, k, v, causal)


def sdpa(q, k, v, causal):
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # PyTorch < 2.0 (CPU smoke runs only): the same math written out.
    s = (q.float() @ k.float().transpose(-1, -2)) / HEAD_DIM ** 0.5
    if causal:
        tq, tk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=s.device)
                          .triu(tk - tq + 1), float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


def layer(x, p, pos, model, cache, write_at):
    """x [B, T, HIDDEN]. cache: (k, v) [B, KV_HEADS, Tmax, D] or None (prefill without cache)."""
    b, t, _ = x.shape
    qkv = rms(x, p["n1"]) @ p["qkv"].t()
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q = rope(q.view(b, t, HEADS, HEAD_DIM).transpose(1, 2), pos, model.inv_freq)
    k = rope(k.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2), pos, model.inv_freq)
    v = v.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
    if cache is None:
        a = attention(q, k, v, causal=True)
    else:
        kc, vc = cache
        kc[:, :, write_at:write_at + t] = k
        vc[:, :, write_at:write_at + t] = v
        a = attention(q, kc[:, :, :write_at + t], vc[:, :, :write_at + t], causal=False)
    x = x + a.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM) @ p["o"].t()
    gu = rms(x, p["n2"]) @ p["gate_up"].t()
    gate, up = gu.chunk(2, dim=-1)
    return x + (F.silu(gate.float()) * up.float()).to(x.dtype) @ p["down"].t()


def logits_last(model, x):
    return rms(x[:, -1], model.norm) @ model.lm_head.t()  # [B, VOCAB]


def timed(fn, repeats, device):
    """Median seconds of `repeats` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_decode(model, batch, context, steps, repeats, device):
    tmax = context + steps
    gen = torch.Generator(device=device).manual_seed(1)
    caches = [(torch.randn(batch, KV_HEADS, tmax, HEAD_DIM, device=device, generator=gen)
               .to(torch.bfloat16),
               torch.randn(batch, KV_HEADS, tmax, HEAD_DIM, device=device, generator=gen)
               .to(torch.bfloat16)) for _ in model.layers]
    tokens = torch.randint(0, VOCAB, (batch, 1), device=device, generator=gen)

    def run():
        nonlocal tokens
        for s in range(steps):
            pos = torch.full((batch, 1), context + s, device=device, dtype=torch.long)
            x = model.embed[tokens]
            for p, c in zip(model.layers, caches):
                x = layer(x, p, pos, model, c, context + s)
            tokens = logits_last(model, x).argmax(-1, keepdim=True)

    with torch.no_grad():
        sec = timed(run, repeats, device)
    del caches
    return batch * steps / sec


def bench_prefill(model, batch, context, prefill_tokens, repeats, device):
    seqs = max(1, min(batch, prefill_tokens // context))
    gen = torch.Generator(device=device).manual_seed(2)
    tokens = torch.randint(0, VOCAB, (seqs, context), device=device, generator=gen)
    pos = torch.arange(context, device=device).expand(seqs, context)

    def run():
        x = model.embed[tokens]
        for p in model.layers:
            x = layer(x, p, pos, model, None, 0)
        return logits_last(model, x)

    with torch.no_grad():
        sec = timed(run, repeats, device)
    return seqs, seqs * context / sec


def main():
    global VOCAB
    args = parse_args()
    VOCAB = args.vocab
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_baseline: no GPU (torch.cuda.is_available() is False)")
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch_baseline: torch {torch.__version__} on {name}; Llama-3.1-8B shapes, "
          f"{args.layers} of 32 layers + a {VOCAB}-token vocabulary; BF16; attention "
          f"{'SDPA' if HAVE_SDPA else 'math fallback (no SDPA in this PyTorch)'}; eager")
    model = Model(args.layers, args.device)
    print("| engine | precision | phase | batch | context | seqs | tokens/s | x bf16 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for context in contexts:
        for batch in batches:
            tps = bench_decode(model, batch, context, args.decode_steps, args.repeats, args.device)
            print(f"| torch | bf16 | decode | {batch} | {context} | {batch} | {tps:.0f} | 1.00 |",
                  flush=True)
            seqs, tps = bench_prefill(model, batch, context, args.prefill_tokens, args.repeats,
                                      args.device)
            print(f"| torch | bf16 | prefill | {batch} | {context} | {seqs} | {tps:.0f} | 1.00 |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
