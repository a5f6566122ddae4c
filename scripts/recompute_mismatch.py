#!/usr/bin/env python3
"""Recomputes a job's mismatch metrics from the trainer's per-token logprob log.

The trainer writes, when started with --logprob-log-dir (the local cluster of `fp8rl up` / `fp8rl
run` does: <data dir>/trainer/logprobs), one file per RL step: <dir>/<job id>/step-<N>.jsonl with
the generation and the trainer's (prev) logprobs of every loss token. This script recomputes the
step's mismatch metrics from that file, with the definitions of docs/design/mismatch.md "Mismatch
metrics" written here independently of the C++ code, and compares them with the job's stored
metrics rows (GET /v1/jobs/{id}/metrics).

  recompute_mismatch.py --log-dir DIR --job ID --coordinator http://HOST:8080 [--tolerance T]

Prints one line per step and exits 1 when a stored value differs from the recomputed one by
more than the tolerance (relative, default 1e-6: the stored values are float64 means over
float32 logprobs, recomputed here in float64 from the same float32 values).
"""

import argparse
import json
import math
import os
import sys
import urllib.request


def is_config(job_config):
    algorithm = job_config.get("algorithm", {})
    spec = algorithm.get("is", {})
    rule = spec.get("rule", "tis")
    defaults = {"tis": (0.5, 2.0, 2.0), "icepop": (0.5, 2.0, 2.0), "none": (0.5, 2.0, 2.0),
                "seq_mask_tis": (0.999, 1.002, 2.0)}[rule]
    return (rule, spec.get("lo", defaults[0]), spec.get("hi", defaults[1]),
            spec.get("cap", defaults[2]))


def recompute(sequences, rule, lo, hi, cap):
    """sequences: list of (gen, prev) lists over loss tokens. Returns the metrics dict."""
    mult, kl, weights, oob_tokens, n = 0.0, 0.0, [], 0, 0
    masked_sequences, counted_sequences = 0, 0
    for gen, prev in sequences:
        d = [p - g for g, p in zip(gen, prev)]
        if not d:
            continue
        counted_sequences += 1
        finite = [x for x in d if math.isfinite(x)]
        for x in finite:
            mult += math.exp(abs(x))
            kl += math.exp(x) - x - 1.0
        raw = []
        for x in d:
            w = math.exp(x) if math.isfinite(x) else 0.0
            raw.append(w if math.isfinite(w) else 0.0)
        if rule == "seq_mask_tis":
            geo = math.exp(sum(x if math.isfinite(x) else 0.0 for x in d) / len(d))
            out = not (lo <= geo <= hi)
            masked_sequences += 1 if out else 0
            weights += [0.0] * len(raw) if out else raw
        else:
            for w, x in zip(raw, d):
                if rule == "none":
                    weights.append(w)  # reported raw (the applied weight is 1)
                elif rule == "tis":
                    weights.append(min(w, cap))
                    oob_tokens += 1 if (w > cap or not math.isfinite(x)) else 0
                elif rule == "icepop":
                    inside = lo <= w <= hi and math.isfinite(x)
                    weights.append(w if inside else 0.0)
                    oob_tokens += 0 if inside else 1
        n += len(d)
        # Tokens with a non-finite log-ratio are left out of the two means.
        n -= len(d) - len(finite)
    finite_tokens = max(n, 1)
    metrics = {
        "token_mult_prob_error": mult / finite_tokens,
        "gen_kl_error": kl / finite_tokens,
        "sampling_importance_ratio": sum(weights) / max(len(weights), 1),
    }
    if rule == "seq_mask_tis":
        metrics["is_oob_ratio"] = masked_sequences / max(counted_sequences, 1)
    elif rule == "none":
        metrics["is_oob_ratio"] = 0.0
    else:
        metrics["is_oob_ratio"] = oob_tokens / max(len(weights), 1)
    return metrics


def get(url):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read().decode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", required=True, help="the trainer's --logprob-log-dir")
    ap.add_argument("--job", required=True)
    ap.add_argument("--coordinator", required=True, help="REST base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--tolerance", type=float, default=1e-6)
    args = ap.parse_args()

    job = get(f"{args.coordinator}/v1/jobs/{args.job}")
    config = job.get("config") or json.loads(job.get("config_json", "{}"))
    rule, lo, hi, cap = is_config(config)
    rows = {r["step"]: r["metrics"] for r in get(f"{args.coordinator}/v1/jobs/{args.job}/metrics")["steps"]}
    job_dir = os.path.join(args.log_dir, args.job)
    if not os.path.isdir(job_dir):
        print(f"recompute_mismatch: no log folder {job_dir}", file=sys.stderr)
        return 2
    worst, checked = 0.0, 0
    for step in sorted(s for s in rows if s > 0):
        path = os.path.join(job_dir, f"step-{step}.jsonl")
        if not os.path.exists(path):
            print(f"recompute_mismatch: {path} missing", file=sys.stderr)
            return 2
        with open(path) as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
        sequences = [(l["gen"], l["prev"]) for l in lines[1:]]
        mine = recompute(sequences, rule, lo, hi, cap)
        parts = []
        for key, value in mine.items():
            stored = rows[step].get(key)
            if stored is None:
                print(f"recompute_mismatch: step {step} row lacks {key}", file=sys.stderr)
                return 1
            rel = abs(stored - value) / max(abs(value), 1e-12)
            worst = max(worst, rel)
            parts.append(f"{key} {stored:.9g} vs {value:.9g}")
        checked += 1
        print(f"step {step}: " + "; ".join(parts))
    print(f"recompute_mismatch: {checked} steps, rule {rule}, worst relative difference {worst:.3g}")
    return 0 if worst <= args.tolerance and checked > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
