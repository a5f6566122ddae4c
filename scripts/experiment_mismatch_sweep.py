#!/usr/bin/env python3
"""The mechanism behind the seed's table, measured offline: how the sampler/learner mismatch grows
with the number of generated tokens and with model width and depth, for the three precision pairs
of the experiment (CPU emulation of FP8, bit-exact to the recipe; no GPU involved).

For one trained checkpoint (one unit of the sweep):
  1. `fp8rl generate` samples N held-out prompts to exactly --max-len new tokens (temperature 1,
     no stop token, so every sequence has the same length) twice: with BF16 linears and a BF16 KV
     cache, and with FP8 linears and an FP8 KV cache.
  2. `fp8rl score` (the trainer's forward) recomputes the logprobs of the sampled tokens:
       bf16          BF16 samples scored in BF16 (BF16 everywhere; the control)
       fp8           FP8 samples scored in FP8 with the FP8 KV rounding (FP8 end to end)
       fp8-gen-only  FP8 samples scored in BF16 with the FP8 KV rounding (FP8 generation, BF16
                     training: the trainer's policy in that setup, common/precision.h)
  3. d = prev - gen per token, and over the first L tokens of every sequence (L in --lengths;
     sampling and scoring are causal, so the first L tokens of a --max-len sample are a sample of
     L tokens):
       token_mult_prob_error  sum exp(|d|) / tokens   (rl/mismatch.h's definition)
       gen_kl_error           sum (exp(d) - d - 1) / tokens
       seq_abs_log_ratio      mean over sequences of |sum_t d_t|: the log of the sequence-level
                              importance weight, which is what the error does to a whole answer
     each with a 95% interval: a bootstrap over sequences for the token means, Student t over
     sequences for seq_abs_log_ratio (scripts/experiment_stats.py). The same metrics over the
     tokens before each sequence's first EOS (the part an RL job trains on) are kept beside them.

Writes <unit dir>/summary.json (small; the report and docs/results/experiment-runs/ use it) and
<unit dir>/d.json (every d, for rechecking). `report` turns the units into a Markdown table and a
plot with bands.

  experiment_mismatch_sweep.py unit --model DIR --prompts VAL.jsonl --out DIR [--label L]
  experiment_mismatch_sweep.py report --units DIR [DIR ...] --md FILE --plot FILE
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiment_stats as st  # noqa: E402

BOS, EOS = 256, 257  # the byte tokenizer's ids (rl/tokenizer.h)
# (setup, generation precision, generation KV cache, scoring precision, scoring KV cache)
PAIRS = [("bf16", "bf16", "bf16", "bf16", "bf16"),
         ("fp8", "fp8", "fp8", "fp8", "fp8"),
         ("fp8-gen-only", "fp8", "fp8", "bf16", "fp8")]
SETUP_NAMES = [p[0] for p in PAIRS]


def run(cmd, log):
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    t = time.time()
    r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit(f"experiment_mismatch_sweep: {' '.join(cmd[:2])} failed ({r.returncode});"
                         f" see {log.name}")
    return time.time() - t


def read_jsonl(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def seq_metrics(d_rows, lengths, eos_pos):
    """Per L: token-weighted metrics (bootstrap CI) and |sequence log-ratio| (t CI), over all L
    tokens and over the tokens up to the first EOS."""
    out = {}
    for L in lengths:
        entry = {}
        for scope in ("all", "to_eos"):
            mult, kl, cnt, seqabs = [], [], [], []
            for d, e in zip(d_rows, eos_pos):
                n = min(L, len(d)) if scope == "all" else min(L, len(d), e + 1)
                xs = [x for x in d[:n] if math.isfinite(x)]
                if not xs:
                    continue
                mult.append(sum(math.exp(abs(x)) for x in xs))
                kl.append(sum(math.exp(x) - x - 1.0 for x in xs))
                cnt.append(len(xs))
                seqabs.append(abs(sum(xs)))
            entry[scope] = {
                "tokens": sum(cnt),
                "sequences": len(cnt),
                "token_mult_prob_error": st.ratio_ci(mult, cnt, resamples=1000),
                "gen_kl_error": st.ratio_ci(kl, cnt, resamples=1000),
                "seq_abs_log_ratio": st.mean_ci(seqabs),
            }
        out[str(L)] = entry
    return out


# Position windows compared by position_trend: the first 64 new tokens against later windows
# (64..128 is still inside a typical answer of this task; 256..512 is after its EOS).
TREND_WINDOWS = [(0, 64), (64, 128), (256, 512)]


def position_trend(d_rows, eos_pos=None):
    """Per-token mismatch by position, paired over sequences: for each window after the first,
    the per-sequence mean of exp|d| - 1 in that window minus the same in the first window, with
    the paired t interval and sign-flip p (experiment_stats.paired_compare). With eos_pos, also
    tokens 64 up to (and with) the sequence's first EOS against the first 64: the growth inside
    the answer, apart from what the model samples after it ended."""
    def window_mean(d, a, b):
        xs = [math.exp(abs(x)) - 1.0 for x in d[a:b] if math.isfinite(x)]
        return sum(xs) / len(xs) if xs else None
    first = [window_mean(d, *TREND_WINDOWS[0]) for d in d_rows]
    out = {}
    for a, b in TREND_WINDOWS[1:]:
        later = [window_mean(d, a, b) for d in d_rows]
        if any(x is not None for x in later):
            out[f"{a}-{b} minus 0-64"] = st.paired_compare(later, first)
    if eos_pos is not None:
        a = TREND_WINDOWS[0][1]
        later = [window_mean(d, a, e + 1) for d, e in zip(d_rows, eos_pos)]
        if any(x is not None for x in later):
            out[f"{a}-EOS minus 0-{a}"] = st.paired_compare(later, first)
    return out


def unit_main(args):
    fp8rl = os.path.join(args.bin_dir, "fp8rl")
    os.makedirs(args.out, exist_ok=True)
    done = os.path.join(args.out, "summary.json")
    if os.path.exists(done) and not args.force:
        print(f"experiment_mismatch_sweep: {done} exists, skipping (--force reruns)")
        return 0
    lengths = sorted(int(x) for x in args.lengths.split(","))
    max_len = max(lengths)
    rows = read_jsonl(args.prompts)[:args.num_prompts]
    prompts = os.path.join(args.out, "prompts.jsonl")
    with open(prompts, "w") as fh:
        for r in rows:
            fh.write(json.dumps({"prompt_tokens": [BOS] + list(r["prompt"].encode())}) + "\n")
    with open(os.path.join(args.model, "config.json")) as fh:
        model_cfg = json.load(fh)
    log = open(os.path.join(args.out, "commands.log"), "a")
    seconds = {}
    gens = {}
    for gen_prec, gen_kv in sorted({(p[1], p[2]) for p in PAIRS}):
        path = os.path.join(args.out, f"gen-{gen_prec}.jsonl")
        seconds[f"generate_{gen_prec}"] = run(
            [fp8rl, "generate", "--model", args.model, "--precision", gen_prec, "--kv-cache", gen_kv,
             "--in", prompts, "--out", path, "--max-new-tokens", str(max_len), "--temperature",
             "1", "--seed", str(args.seed), "--device", "cpu"], log)
        gens[gen_prec] = read_jsonl(path)
    d_all, eos_all, metrics, trends = {}, {}, {}, {}
    for setup, gen_prec, _, score_prec, score_kv in PAIRS:
        samples = gens[gen_prec]
        seqs = os.path.join(args.out, f"seqs-{gen_prec}.jsonl")
        with open(seqs, "w") as fh:
            for s in samples:
                fh.write(json.dumps({"tokens": s["prompt_tokens"] + s["tokens"]}) + "\n")
        scored = os.path.join(args.out, f"score-{setup}.jsonl")
        seconds[f"score_{setup}"] = run(
            [fp8rl, "score", "--model", args.model, "--precision", score_prec, "--kv-cache",
             score_kv, "--in", seqs, "--out", scored, "--temperature", "1", "--device", "cpu"],
            log)
        prev_rows = read_jsonl(scored)
        d_rows, eos_pos = [], []
        for s, p in zip(samples, prev_rows):
            n = len(s["tokens"])
            prev = p["logprobs"][-n:]
            d_rows.append([pv - g for pv, g in zip(prev, s["logprobs"])])
            eos_pos.append(s["tokens"].index(EOS) if EOS in s["tokens"] else n)
        d_all[setup], eos_all[setup] = d_rows, eos_pos
        metrics[setup] = seq_metrics(d_rows, lengths, eos_pos)
        trends[setup] = position_trend(d_rows, eos_pos)
    summary = {
        "label": args.label or os.path.basename(os.path.normpath(args.model)),
        "model": os.path.abspath(args.model),
        "hidden_size": model_cfg["hidden_size"], "num_hidden_layers": model_cfg["num_hidden_layers"],
        "model_type": model_cfg.get("model_type"),
        "prompts": len(rows), "lengths": lengths, "seed": args.seed,
        "median_first_eos": {s: sorted(e)[len(e) // 2] for s, e in eos_all.items()},
        "eos_before_max_len": {s: sum(1 for x in e if x < max_len) for s, e in eos_all.items()},
        "metrics": metrics, "position_trend": trends, "seconds": seconds,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.uname().nodename} ({os.cpu_count()} cores), load {os.getloadavg()[0]:.1f}",
        "note": "FP8 is emulated bit-exactly on the CPU (fp8rl's reference path)",
    }
    with open(os.path.join(args.out, "d.json"), "w") as fh:
        json.dump({"d": d_all, "eos": eos_all}, fh)
    with open(done + ".tmp", "w") as fh:
        json.dump(summary, fh, indent=1)
    os.replace(done + ".tmp", done)
    print(f"experiment_mismatch_sweep: {summary['label']}: wrote {done}")
    return 0


# ---------------------------------------------------------------------------------------------
# report


def load_units(paths):
    """Finished units' summaries; where the unit's d.json is at hand, position_trend is
    recomputed from it (and stored), so units summarized by an older version get the current
    windows."""
    units = []
    for p in paths:
        f = p if p.endswith(".json") else os.path.join(p, "summary.json")
        if not os.path.exists(f):
            continue
        with open(f) as fh:
            u = json.load(fh)
        d_file = os.path.join(os.path.dirname(f), "d.json")
        if os.path.exists(d_file):
            with open(d_file) as fh:
                d = json.load(fh)
            trend = {s: position_trend(rows, d["eos"][s]) for s, rows in d["d"].items()}
            if trend != u.get("position_trend"):
                u["position_trend"] = trend
                with open(f + ".tmp", "w") as fh:
                    json.dump(u, fh, indent=1)
                os.replace(f + ".tmp", f)
        units.append(u)
    return units


def fmt_one(v):
    """A value near 1 without hiding a small deviation: 1 exactly, '1+3.5e-05', or '1.02637'."""
    if v == 1.0:
        return "1"
    if abs(v - 1.0) < 1e-3:
        return f"1{v - 1.0:+.1e}"
    return f"{v:.5f}"


def fmt_tmpe(ci):
    v = ci.get("value", ci.get("mean"))
    if v is None or not math.isfinite(v):
        return "n/a"
    if not math.isfinite(ci["lo"]):
        return fmt_one(v)
    return f"{fmt_one(v)} [{fmt_one(ci['lo'])}, {fmt_one(ci['hi'])}]"


def report_main(args):
    units = load_units(args.units)
    if not units:
        raise SystemExit("experiment_mismatch_sweep report: no finished unit (summary.json)")
    lines = ["### Summary: FP8 generation-only (FP8 samples, BF16 trainer) by model and length",
             "",
             "token_mult_prob_error over the first L new tokens [95% bootstrap CI over sequences];"
             " FP8 end to end and BF16 are in the per-model tables below.", "",
             "| model | hidden | layers | " + " | ".join(f"L={L}" for L in units[0]["lengths"])
             + " |", "|---|---|---|" + "---|" * len(units[0]["lengths"])]
    for u in units:
        cells = [fmt_tmpe(u["metrics"]["fp8-gen-only"][str(L)]["all"]["token_mult_prob_error"])
                 for L in u["lengths"]]
        lines.append(f"| {u['label']} | {u['hidden_size']} | {u['num_hidden_layers']} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    for u in units:
        lines += [f"### {u['label']} (qwen3 architecture, {u['hidden_size']} wide, "
                  f"{u['num_hidden_layers']} layers)", "",
                  f"{u['prompts']} held-out prompts, sampling seed {u['seed']}, measured "
                  f"{u['date']} on {u['machine']}. Median first EOS position: "
                  + ", ".join(f"{s} {v}" for s, v in u["median_first_eos"].items())
                  + f" (of {max(u['lengths'])} generated tokens).", "",
                  "| new tokens L | setup | token_mult_prob_error [95% CI] | gen_kl_error [95% CI] "
                  "| mean abs. seq. log-ratio [95% CI] | token_mult_prob_error, tokens up to EOS |",
                  "|---|---|---|---|---|---|"]
        for L in u["lengths"]:
            for s in SETUP_NAMES:
                m = u["metrics"][s][str(L)]
                a, e = m["all"], m["to_eos"]
                kl = a["gen_kl_error"]
                kl_s = ("n/a" if not math.isfinite(kl["value"]) else
                        f"{kl['value']:.2e} [{kl['lo']:.2e}, {kl['hi']:.2e}]")
                sa = a["seq_abs_log_ratio"]
                sa_s = st.fmt_ci(sa, 4)
                lines.append(f"| {L} | {s} | {fmt_tmpe(a['token_mult_prob_error'])} | {kl_s} | "
                             f"{sa_s} | {fmt_tmpe(e['token_mult_prob_error'])} |")
        lines.append("")
        trend = u.get("position_trend", {}).get("fp8-gen-only", {})
        if trend:
            lines += ["Per-token mismatch by position, FP8 generation-only (per-sequence mean of "
                      "exp|d| - 1 in a window minus the same in new tokens 0..64, paired over "
                      "sequences: mean difference [95% t CI], paired t p, sign-flip p):", ""]
            for k, c in trend.items():
                lines.append(f"- tokens {k}: {c['mean_diff']:+.5f} [{c['lo']:+.5f}, "
                             f"{c['hi']:+.5f}], p_t={c['p_t']:.3f}, p_flip={c['p_sign_flip']:.3f}"
                             f" (n={c['n']})")
            lines.append("")
    with open(args.md, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    if args.plot:
        plot(units, args.plot)
    print("\n".join(lines))
    return 0


def plot(units, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bf16": "tab:blue", "fp8": "tab:green", "fp8-gen-only": "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1))]
    for i, u in enumerate(units):
        for s in ("fp8-gen-only", "fp8", "bf16"):
            for ax, key, scope in ((axes[0], "token_mult_prob_error", "all"),
                                   (axes[1], "seq_abs_log_ratio", "all")):
                Ls = u["lengths"]
                cis = [u["metrics"][s][str(L)][scope][key] for L in Ls]
                v = [c.get("value", c.get("mean")) for c in cis]
                lo = [c["lo"] for c in cis]
                hi = [c["hi"] for c in cis]
                label = f"{u['label']} {s}" if s == "fp8-gen-only" or i == 0 else None
                ax.plot(Ls, v, linestyle=styles[i % len(styles)], color=colors[s], marker="o",
                        markersize=3, label=label)
                ax.fill_between(Ls, lo, hi, color=colors[s], alpha=0.15)
    # Third panel: every model over its answers (the new tokens up to each sample's first EOS,
    # what an RL job trains on), FP8 gen-only and FP8 end to end, with the 95% CI as error bars.
    ax = axes[2]
    for k, s in enumerate(("fp8-gen-only", "fp8")):
        xs, ys, err = [], [], [[], []]
        for i, u in enumerate(units):
            c = u["metrics"][s][str(max(u["lengths"]))]["to_eos"]["token_mult_prob_error"]
            xs.append(i + 0.1 * k)
            ys.append(c["value"] - 1.0)
            err[0].append(c["value"] - c["lo"])
            err[1].append(c["hi"] - c["value"])
        ax.errorbar(xs, ys, yerr=err, fmt="o", color=colors[s], capsize=3, label=s)
    ax.set_xticks(range(len(units)))
    ax.set_xticklabels([u["label"] for u in units], rotation=30, fontsize=8)
    ax.set_ylabel("token_mult_prob_error - 1, tokens up to the first EOS")
    ax.set_title("By model width (w) and depth (d), 95% CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    axes[0].set_ylabel("token_mult_prob_error (mean exp|prev - gen|)")
    axes[1].set_ylabel("mean |sum over the sequence of (prev - gen)|")
    eos = sorted(v for u in units for v in u["median_first_eos"].values())
    for ax in axes[:2]:
        ax.axvline(eos[len(eos) // 2], color="gray", linestyle=":", linewidth=1)
        ax.text(eos[len(eos) // 2], ax.get_ylim()[1], " median first EOS", color="gray",
                fontsize=7, va="top")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("new tokens L (first L of each sample)")
        ax.grid(alpha=0.3)
    axes[0].set_title("Per-token mismatch (band: 95% bootstrap CI)")
    axes[1].set_title("Sequence log importance weight (band: 95% t CI)")
    axes[1].legend(fontsize=7)
    fig.suptitle("Sampler/learner mismatch vs generated length, CPU FP8 emulation", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unit", help="measure one checkpoint")
    u.add_argument("--model", required=True, help="HF checkpoint folder (a job's step-N)")
    u.add_argument("--prompts", required=True, help="jsonl with a 'prompt' field per line")
    u.add_argument("--out", required=True)
    u.add_argument("--label", default=None)
    u.add_argument("--num-prompts", type=int, default=48)
    u.add_argument("--lengths", default="32,64,128,256,512")
    u.add_argument("--seed", type=int, default=1)
    u.add_argument("--bin-dir", default=os.environ.get("FP8RL_BIN_DIR", "build/bin"))
    u.add_argument("--force", action="store_true")
    r = sub.add_parser("report", help="table and plot from finished units")
    r.add_argument("--units", nargs="+", required=True, help="unit folders or summary files")
    r.add_argument("--md", required=True)
    r.add_argument("--plot", default=None)
    args = ap.parse_args()
    return unit_main(args) if args.cmd == "unit" else report_main(args)


if __name__ == "__main__":
    sys.exit(main())
