#!/usr/bin/env python3
"""Recomputes a mixture-of-experts job's routing metrics from the trainer's logprob log.

The trainer, started with --logprob-log-dir (the local cluster of `fp8rl up` / `fp8rl run` is:
<data dir>/trainer/logprobs), writes one file per RL step, <dir>/<job id>/step-<N>.jsonl. For a
mixture-of-experts policy its first line carries "moe": {replay, sparse_layers, top_k,
num_experts} and every sequence line "gen_experts" (the generation's routing record as the trainer
received it) and "router_experts" (the trainer's router's own top-k for every token in the
prev-logprobs forward), both flattened [tokens, sparse layers, top_k]. From those this script
recomputes, with the definitions of docs/metrics.md "Mixture of experts" written here
independently of the C++ code, and compares with the job's stored metrics rows
(GET /v1/jobs/{id}/metrics):

  moe_routed_tokens          tokens with a generation record
  moe_routing_disagreement   of those, the share whose router choice differs from the record as a
                             set of experts in at least one sparse layer
  moe_routing_replay         1 when the step replayed the records
  moe_layer{l}_load_max_over_mean, moe_layer{l}_idle_experts, moe_load_max_over_mean
                             tokens per expert of the experts each token ran through (the record
                             where replayed, else the router's choice), over every token

moe_aux_loss needs the router probabilities, which the log does not carry: not recomputed.

  recompute_moe_metrics.py --log-dir DIR --job ID --coordinator http://HOST:8080 [--tolerance T]

Prints one line per step and exits 1 when a stored value differs from the recomputed one by more
than the tolerance (absolute, default 1e-9: every value is a count or a ratio of counts), 2 when
the log is missing or malformed.
"""

import argparse
import json
import os
import sys
import urllib.request


class LogError(Exception):
    pass


def token_sets(flat, width, top_k):
    """[tokens * width] ids -> per token, a tuple of per-layer frozensets."""
    if len(flat) % width:
        raise LogError(f"{len(flat)} expert ids is not a whole number of tokens of {width}")
    return [tuple(frozenset(flat[t * width + g:t * width + g + top_k]) for g in range(0, width, top_k))
            for t in range(len(flat) // width)]


def recompute(head, sequences):
    """head: the log's "moe" object; sequences: its sequence lines. Returns {metric: value}."""
    layers, top_k, experts = head["sparse_layers"], head["top_k"], head["num_experts"]
    replay = bool(head["replay"])
    width = layers * top_k
    if width <= 0 or experts <= 0:
        raise LogError(f"moe header {head}: needs sparse_layers, top_k, num_experts > 0")
    counts = [[0] * experts for _ in range(layers)]
    routed, differ = 0, 0
    for line in sequences:
        if "gen_experts" not in line or "router_experts" not in line:
            raise LogError(f"sequence {line.get('sequence')} lacks gen_experts/router_experts")
        gen, router = line["gen_experts"], line["router_experts"]
        if len(gen) > len(router):
            raise LogError(f"sequence {line['sequence']}: the record covers more tokens than exist")
        gen_sets = token_sets(gen, width, top_k)
        router_sets = token_sets(router, width, top_k)
        routed += len(gen_sets)
        differ += sum(1 for g, r in zip(gen_sets, router_sets) if g != r)
        for t in range(len(router) // width):
            source = gen if replay and t < len(gen_sets) else router
            for layer in range(layers):
                at = t * width + layer * top_k
                for e in source[at:at + top_k]:
                    if not 0 <= e < experts:
                        raise LogError(f"sequence {line['sequence']} token {t}: expert id {e}")
                    counts[layer][e] += 1
    out = {
        "moe_routed_tokens": float(routed),
        "moe_routing_disagreement": differ / routed if routed else 0.0,
        "moe_routing_replay": 1.0 if replay else 0.0,
    }
    worst = 0.0
    for layer, c in enumerate(counts):
        total = sum(c)
        ratio = max(c) / (total / experts) if total else 0.0
        out[f"moe_layer{layer}_load_max_over_mean"] = ratio
        out[f"moe_layer{layer}_idle_experts"] = sum(1 for v in c if v == 0) / experts
        worst = max(worst, ratio)
    out["moe_load_max_over_mean"] = worst
    return out


def get(url):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read().decode())


def read_step(path):
    try:
        with open(path) as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError) as e:
        raise LogError(f"{path}: {e}") from e
    if not lines or "moe" not in lines[0]:
        raise LogError(f"{path}: first line has no \"moe\" object (not a mixture-of-experts step?)")
    return lines[0]["moe"], lines[1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", required=True, help="the trainer's --logprob-log-dir")
    ap.add_argument("--job", required=True)
    ap.add_argument("--coordinator", required=True, help="REST base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--tolerance", type=float, default=1e-9)
    args = ap.parse_args()

    rows = {r["step"]: r["metrics"]
            for r in get(f"{args.coordinator}/v1/jobs/{args.job}/metrics")["steps"]}
    moe_steps = sorted(s for s, m in rows.items() if "moe_routed_tokens" in m)
    job_dir = os.path.join(args.log_dir, args.job)
    if not moe_steps:
        print(f"recompute_moe_metrics: job {args.job} has no row with moe_routed_tokens",
              file=sys.stderr)
        return 2
    worst, checked = 0.0, 0
    try:
        for step in moe_steps:
            head, sequences = read_step(os.path.join(job_dir, f"step-{step}.jsonl"))
            mine = recompute(head, sequences)
            parts = []
            for key, value in mine.items():
                stored = rows[step].get(key)
                if stored is None:
                    print(f"recompute_moe_metrics: step {step} row lacks {key}", file=sys.stderr)
                    return 1
                worst = max(worst, abs(stored - value))
                if key in ("moe_routed_tokens", "moe_routing_disagreement", "moe_load_max_over_mean"):
                    parts.append(f"{key} {stored:.9g} vs {value:.9g}")
            checked += 1
            print(f"step {step}: " + "; ".join(parts))
    except LogError as e:
        print(f"recompute_moe_metrics: {e}", file=sys.stderr)
        return 2
    print(f"recompute_moe_metrics: {checked} steps, worst absolute difference {worst:.3g}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
