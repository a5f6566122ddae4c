#!/usr/bin/python3
"""Independent PyTorch oracle for fp8rl's mixture-of-experts decoders (qwen3_moe, qwen2_moe).

Written from the Hugging Face Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock equations without
the `transformers` package: router logits = h . gate^T, probabilities = softmax over the E
experts, the top-k probabilities (renormalized to sum 1 when norm_topk_prob), each chosen
expert's SwiGLU down(silu(gate(h)) * up(h)) weighted by its probability and summed; qwen2_moe adds
sigmoid(h . shared_expert_gate^T) * shared_expert(h). A layer is sparse when it is not in
mlp_only_layers and (layer + 1) % decoder_sparse_step == 0, else it is the dense MLP. Attention,
norms and RoPE are those of llama_ref.py (Qwen3: q/k norm). Runs in float64 on the CPU.

  moe_ref.py CHECKPOINT_DIR REQUEST.json OUT.safetensors

REQUEST.json: {"sequences": [[tok, ...], ...], "dlogp": [[w, ...], ...], "temperature": T,
               "aux_coef": c (optional, 0), "replay": [[id, ...], ...] (optional)}
"replay"[s] holds [tokens, sparse layers, k] expert ids for the first tokens of sequence s (may
be shorter than the sequence); those tokens use these experts with weights from the current
router probabilities at them.
OUT.safetensors (F32): logits.<s>, logprobs.<s>, routing.<s> [T_s, sparse layers, k] (the
experts used, in descending probability), aux_loss [] (HF load_balancing_loss_func over every
sparse layer and token of the batch), grad.<param> of
L = sum_s sum_i dlogp[s][i] * logprobs[s][i] + aux_coef * aux_loss.
"""
import json
import sys

import torch

from llama_ref import Llama, read_safetensors, write_safetensors


class Qwen3Moe(Llama):
    def __init__(self, config, params):
        super().__init__(config, params)
        self.E = config["num_experts"]
        self.k = config["num_experts_per_tok"]
        self.norm_topk = config.get("norm_topk_prob", False)
        step = config.get("decoder_sparse_step", 1)
        only = set(config.get("mlp_only_layers") or [])
        self.sparse = [i for i in range(self.layers) if i not in only and (i + 1) % step == 0]
        self.replay = None  # [T, sparse layers, k] for the sequence being run, or None
        self.routing = []  # per sparse layer: [T, k] experts used
        self.probs = []  # per sparse layer: [T, E] router probabilities

    def swiglu(self, h, pre):
        g = self.linear(h, pre + "gate_proj")
        u = self.linear(h, pre + "up_proj")
        return self.linear(torch.nn.functional.silu(g) * u, pre + "down_proj")

    def mlp(self, layer, h):
        if layer not in self.sparse:
            return super().mlp(layer, h)
        pre = f"model.layers.{layer}.mlp."
        li = self.sparse.index(layer)
        logits = h @ self.p[pre + "gate.weight"].t()
        probs = torch.softmax(logits, dim=-1)
        weights, sel = torch.topk(probs, self.k, dim=-1)
        if self.replay is not None:
            n = self.replay.shape[0]
            sel = torch.cat([self.replay[:, li, :], sel[n:]], dim=0)
            weights = probs.gather(1, sel)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        self.routing.append(sel)
        self.probs.append(probs)
        out = torch.zeros_like(h)
        for e in range(self.E):
            rows, slot = torch.nonzero(sel == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            y = self.swiglu(h[rows], pre + f"experts.{e}.")
            out = out.index_add(0, rows, y * weights[rows, slot, None])
        if pre + "shared_expert_gate.weight" in self.p:
            gate = torch.sigmoid(h @ self.p[pre + "shared_expert_gate.weight"].t())
            out = out + gate * self.swiglu(h, pre + "shared_expert.")
        return out


def aux_loss(model):
    """HF load_balancing_loss_func without an attention mask: every sparse layer's rows."""
    if not model.probs:
        return torch.zeros((), dtype=torch.float64)
    probs = torch.cat(model.probs, dim=0)  # [N, E]
    sel = torch.cat(model.routing, dim=0)  # [N, k]
    mask = torch.nn.functional.one_hot(sel, model.E).to(probs.dtype)  # [N, k, E]
    tokens_per_expert = mask.mean(dim=0)  # [k, E]
    prob_per_expert = probs.mean(dim=0)  # [E]
    return (tokens_per_expert * prob_per_expert[None, :]).sum() * model.E


def run(ckpt, request_path, out_path):
    with open(ckpt + "/config.json") as f:
        config = json.load(f)
    with open(request_path) as f:
        req = json.load(f)
    raw = read_safetensors(ckpt + "/model.safetensors")
    params = {n: t.requires_grad_(True) for n, t in raw.items() if not n.endswith("_scale")}
    model = Qwen3Moe(config, params)
    temp = float(req.get("temperature", 1.0))
    replay = req.get("replay")
    out = {}
    loss = torch.zeros((), dtype=torch.float64)
    n_sparse = len(model.sparse)
    for s, (tokens, dlogp) in enumerate(zip(req["sequences"], req["dlogp"])):
        first = len(model.routing)
        model.replay = None
        if replay is not None and replay[s]:
            model.replay = torch.tensor(replay[s], dtype=torch.int64).view(-1, n_sparse, model.k)
        z = model.logits(tokens)
        lp = torch.log_softmax(z / temp, dim=-1)
        lp = lp[:-1].gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
        loss = loss + (lp * torch.tensor(dlogp, dtype=torch.float64)).sum()
        out[f"logits.{s}"] = z
        out[f"logprobs.{s}"] = lp
        if n_sparse:
            out[f"routing.{s}"] = torch.stack(model.routing[first:], dim=1).to(torch.float64)
    aux = aux_loss(model)
    loss = loss + float(req.get("aux_coef", 0.0)) * aux
    out["aux_loss"] = aux
    loss.backward()
    for n, t in params.items():
        out["grad." + n] = t.grad if t.grad is not None else torch.zeros_like(t)
    write_safetensors(out_path, out)


def main():
    args = sys.argv[1:]
    if len(args) != 3:
        sys.exit("usage: moe_ref.py CKPT REQUEST.json OUT.safetensors")
    run(*args)


if __name__ == "__main__":
    main()
