#!/usr/bin/env python3
"""The seed's precision table with statistical power: resumable, in units, for hours in the background.

One config (configs/experiments/fp8-table.yaml) describes everything; `run` works through the
units below in order, and a unit whose summary.json exists is skipped, so the same command
resumes after a stop (an interrupted unit starts again from its beginning):

  data                  the task files (scripts/experiment_cot_data.py) under OUT/data
  warm-start            one BF16 SFT job from a random init (the shared starting checkpoint)
  sweep-<model>         the mismatch sweep (scripts/experiment_mismatch_sweep.py) on the warm
                        start, then on each `sweep_models` entry (its own short BF16 SFT job first)
  <setup>-s<seed>       one GRPO job from the warm start per (setup, seed), seed-major, so that
                        the finished units form complete paired seeds as early as possible

Each job runs on a local cluster (`fp8rl up`, loopback, port offset 310) that this process starts
and stops. `report` reads the finished units only and writes the table (mean and 95% t interval
over seeds, a paired comparison of each setup against BF16 over the seeds both finished), the
curves with 95% bands, the mismatch metrics and the step times; FP8 is the CPU emulation of the
recipe, so its step times say nothing about a GPU.

  experiment_fp8_table.py run --out /work/exp-runs/fp8-table [--config ...] [--only PHASE]
  experiment_fp8_table.py report --out /work/exp-runs/fp8-table --docs docs/results
"""

import argparse
import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiment as base  # noqa: E402  (SETUPS, cluster and REST helpers)
import experiment_stats as st  # noqa: E402

PORT_OFFSET = 310
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_COLORS = {"bf16": "tab:blue", "fp8": "tab:green", "fp8-gen-tis": "tab:orange",
                "fp8-gen-none": "tab:red"}
# Per-step metrics kept in a unit's summary (means over the RL steps and the per-step series).
MISMATCH_KEYS = ["token_mult_prob_error", "gen_kl_error", "sampling_importance_ratio",
                 "is_oob_ratio", "full_token_mult_prob_error"]
TIME_KEYS = ["time_step_seconds", "time_generate_seconds", "time_train_seconds",
             "time_validate_seconds"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path, obj):
    with open(path + ".tmp", "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(path + ".tmp", path)


def read_json(path):
    with open(path) as fh:
        return json.load(fh)


def machine():
    u = os.uname()
    return f"{u.nodename} ({os.cpu_count()} cores, {u.machine})"


class Cluster:
    """A local cluster started on first use and stopped by close(); a fresh state folder per
    invocation, so a job left RUNNING by a killed invocation is not resumed behind our back."""

    def __init__(self, out, bin_dir, port_offset=PORT_OFFSET):
        self.out, self.bin_dir, self.port_offset = out, bin_dir, port_offset
        self.proc = self.log = None
        self.url = f"http://127.0.0.1:{8080 + port_offset}"

    def ensure(self):
        if self.proc is not None:
            return
        fp8rl = os.path.join(self.bin_dir, "fp8rl")
        if not os.access(fp8rl, os.X_OK):
            raise SystemExit(f"experiment_fp8_table: {fp8rl} not found (bash scripts/build.sh)")
        # Model configs and checkpoints live in the repository and under OUT.
        root = os.path.commonpath([REPO, os.path.abspath(self.out)])
        state = f"cluster-{time.strftime('%Y%m%d-%H%M%S')}"
        self.proc, self.log = base.start_cluster(
            fp8rl, self.out, self.bin_dir, self.port_offset,
            extra_args=["--models-root", root, "--datasets-root", os.path.abspath(self.out)],
            cluster_dir=state)
        base.wait_healthy(self.url, self.proc, 180)
        log(f"cluster up ({state}, {self.url})")

    def job(self, cfg, label):
        self.ensure()
        t0 = time.time()
        job = base.http("POST", self.url + "/v1/jobs", cfg)
        final, rows = base.wait_job(self.url, job["id"], label, t0, poll=5.0)
        return final, rows, time.time() - t0

    def close(self):
        if self.proc is not None:
            base.stop_cluster(self.proc, self.log)
            self.proc = None


# ---------------------------------------------------------------------------------------------
# units


def data_unit(cfg, out):
    d = os.path.join(out, "data")
    if os.path.exists(os.path.join(d, "val.jsonl")):
        return d
    p = cfg["data"]
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "experiment_cot_data.py"),
                    "--out", d, "--digits", str(p["digits"]), "--train", str(p["train"]),
                    "--val", str(p["val"]), "--seed", str(p["seed"])], check=True)
    return d


def task_section(cfg, out):
    task = copy.deepcopy(cfg["job"]["task"])
    d = os.path.join(os.path.abspath(out), "data")
    task.setdefault("params", {})
    task["params"]["train_path"] = os.path.join(d, "train.jsonl")
    task["params"]["val_path"] = os.path.join(d, "val.jsonl")
    return task


def sft_job_config(cfg, out, name, model_config, sft, seed, start=None, task_seed_offset=0):
    """A BF16 SFT job that ends with one GRPO step at a negligible learning rate (a job needs
    algorithm.steps >= 1) and a checkpoint of that step, which the other units start from. With
    `start` (a checkpoint folder) it continues from those weights instead of a random init, and
    `task_seed_offset` moves the task seed, which orders the SFT examples (a part of a chained
    warm start then draws other examples than the part before it)."""
    job = copy.deepcopy(cfg["job"])
    ws = cfg["warm_start"]
    job["name"] = name
    if start is None:
        job["model"] = {"init": {"config": os.path.join(REPO, model_config), "seed": seed}}
    else:
        job["model"] = {"checkpoint": start}
    job["task"] = task_section(cfg, out)
    job["task"]["seed"] = job["task"].get("seed", 0) + task_seed_offset
    job["sft"] = {k: v for k, v in sft.items() if k != "parts"}
    job["algorithm"].update({"steps": 1, "learning_rate": 1e-9, "warmup_steps": 0,
                             "prompts_per_step": 2, "samples_per_prompt": 2, "seed": seed})
    job["precision"] = {**job.get("precision", {}), **ws["precision"]}
    job["algorithm"]["is"] = {"rule": "tis", "cap": 2.0}
    job["validation"] = {"every_steps": 0, "num_prompts": ws.get("val_prompts", 100)}
    job["checkpoint"] = {"every_steps": 1,
                         "dir": os.path.join(os.path.abspath(out), "checkpoints", name)}
    return job


def warm_start_parts(sft):
    """The SFT step counts of a warm start run as `sft.parts` chained jobs (default 1): equal
    parts, the remainder spread over the first ones."""
    parts = int(sft.get("parts", 1))
    if parts < 1 or parts > sft["steps"]:
        raise SystemExit(f"experiment_fp8_table: warm_start.sft.parts must be in [1, "
                         f"{sft['steps']}] (sft.steps), got {parts}")
    q, r = divmod(sft["steps"], parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def chained_sft_unit(cluster, cfg, out, name, model_config, sft, seed):
    """An SFT unit run as `sft.parts` jobs, each continuing from the checkpoint of the one before
    (a finished part is a unit of its own, so an interrupted warm start resumes at its first
    unfinished part instead of from the beginning). Each part starts with fresh AdamW moments and
    draws its examples with the task seed + its index. The summary is the last part's, with the
    parts' wall and SFT seconds added up."""
    steps = warm_start_parts(sft)
    if len(steps) == 1:
        return sft_unit(cluster, cfg, out, name, model_config, sft, seed)
    done = os.path.join(out, "units", name, "summary.json")
    if os.path.exists(done):
        return read_json(done)
    start, parts = None, []
    for i, n in enumerate(steps):
        part = sft_unit(cluster, cfg, out, f"{name}-part{i + 1}", model_config,
                        {**sft, "steps": n}, seed, start=start, task_seed_offset=i)
        parts.append(part)
        start = part["checkpoint"]
    summary = dict(parts[-1])
    summary.update({"unit": name, "sft": dict(sft),
                    "parts": [p["unit"] for p in parts],
                    "wall_seconds": sum(p["wall_seconds"] for p in parts),
                    "sft_seconds": sum(p.get("sft_seconds", 0) for p in parts)})
    os.makedirs(os.path.dirname(done), exist_ok=True)
    write_json(done, summary)
    log(f"{name}: all {len(parts)} parts done")
    return summary


def sft_unit(cluster, cfg, out, name, model_config, sft, seed, start=None, task_seed_offset=0):
    """Runs (or finds) an SFT unit; returns its summary (with the checkpoint folder)."""
    udir = os.path.join(out, "units", name)
    done = os.path.join(udir, "summary.json")
    if os.path.exists(done):
        return read_json(done)
    os.makedirs(udir, exist_ok=True)
    job_cfg = sft_job_config(cfg, out, name, model_config, sft, seed, start, task_seed_offset)
    log(f"{name}: SFT {sft['steps']} steps on {model_config}")
    final, rows, wall = cluster.job(job_cfg, name)
    write_json(os.path.join(udir, "rows.json"), rows)
    if final["state"] != "SUCCEEDED":
        raise SystemExit(f"experiment_fp8_table: {name}: {final['state']} {final.get('error', '')}")
    ckpt_root = os.path.join(job_cfg["checkpoint"]["dir"], final["id"])
    steps = sorted(int(s.split("-")[1]) for s in os.listdir(ckpt_root) if s.startswith("step-"))
    val = [(r["step"], r["metrics"]["val_accuracy"]) for r in rows
           if "val_accuracy" in r["metrics"]]
    summary = {"unit": name, "kind": "sft", "state": final["state"], "job": final["id"],
               "model_config": model_config, "sft": sft, "init_seed": seed,
               "start_checkpoint": start, "task_seed_offset": task_seed_offset,
               "checkpoint": os.path.join(ckpt_root, f"step-{steps[-1]}"),
               "val_accuracy": val, "wall_seconds": wall,
               "sft_loss": next((r["metrics"]["sft_loss"] for r in rows
                                 if "sft_loss" in r["metrics"]), None),
               "sft_seconds": sum(r["metrics"].get("time_sft_seconds", 0) for r in rows),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
               "load_avg_end": os.getloadavg()[0]}
    write_json(done, summary)
    log(f"{name}: done in {wall / 60:.1f} min, held-out accuracy {val}")
    return summary


def sweep_unit(cfg, out, bin_dir, name, checkpoint):
    udir = os.path.join(out, "units", name)
    if os.path.exists(os.path.join(udir, "summary.json")):
        return
    sw = cfg.get("sweep", {})
    log(f"{name}: mismatch sweep on {checkpoint}")
    cmd = [sys.executable, os.path.join(REPO, "scripts", "experiment_mismatch_sweep.py"), "unit",
           "--model", checkpoint, "--prompts", os.path.join(out, "data", "val.jsonl"),
           "--out", udir, "--label", name.removeprefix("sweep-"), "--bin-dir", bin_dir,
           "--num-prompts", str(sw.get("prompts", 48)),
           "--lengths", ",".join(str(x) for x in sw.get("lengths", [32, 64, 128, 256, 512]))]
    subprocess.run(cmd, check=True)


def rl_job_config(cfg, out, setup, seed, checkpoint):
    job = copy.deepcopy(cfg["job"])
    spec = base.SETUPS[setup]
    job["name"] = f"table-{setup}-s{seed}"
    job["model"] = {"checkpoint": checkpoint}
    job["task"] = task_section(cfg, out)
    job["precision"] = {**job.get("precision", {}), **spec["precision"]}
    job["algorithm"]["is"] = dict(spec["is"])
    # The seed drives the rollout sampling and minibatch order; every setup of a seed starts from
    # the same warm-start weights and sees the same prompts (paired seeds).
    job["algorithm"]["seed"] = seed
    job.pop("sft", None)
    return job


def summarize_rl(rows):
    """The small per-unit summary the report needs, from the job's metrics rows."""
    rl_rows = [r for r in rows if r["step"] > 0]

    def series(key):
        return [[r["step"], r["metrics"][key]] for r in rows if key in r["metrics"]]

    def avg(key):
        xs = [r["metrics"][key] for r in rl_rows if key in r["metrics"]]
        return sum(xs) / len(xs) if xs else None
    val = series("val_accuracy")
    out = {"val_accuracy": val,
           "start_accuracy": val[0][1] if val and val[0][0] == 0 else None,
           "final_accuracy": val[-1][1] if val else None,
           "best_accuracy": max(v for s, v in val if s > 0) if len(val) > 1 else None,
           "reward_mean": series("reward_mean"),
           "response_length_mean": avg("response_length_mean"),
           "steps_done": len(rl_rows)}
    for k in MISMATCH_KEYS:
        out[k] = avg(k)
        out[k + "_series"] = series(k)
    for k in TIME_KEYS:
        out[k] = avg(k)
    return out


def rl_unit(cluster, cfg, out, setup, seed, checkpoint):
    name = f"{setup}-s{seed}"
    udir = os.path.join(out, "units", name)
    done = os.path.join(udir, "summary.json")
    if os.path.exists(done) and read_json(done)["state"] == "SUCCEEDED":
        return
    os.makedirs(udir, exist_ok=True)
    job_cfg = rl_job_config(cfg, out, setup, seed, checkpoint)
    load0 = os.getloadavg()[0]
    final, rows, wall = cluster.job(job_cfg, name)
    write_json(os.path.join(udir, "rows.json"), rows)
    summary = {"unit": name, "kind": "rl", "setup": setup, "seed": seed, "state": final["state"],
               "error": final.get("error", ""), "job": final["id"],
               "config": {k: job_cfg[k] for k in ("algorithm", "precision", "validation")},
               "wall_seconds": wall, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": machine(), "load_avg_start": load0, "load_avg_end": os.getloadavg()[0],
               **summarize_rl(rows)}
    write_json(done, summary)
    log(f"{name}: {final['state']} in {wall / 60:.1f} min, held-out accuracy "
        f"{summary['start_accuracy']} -> {summary['final_accuracy']}, token_mult_prob_error "
        f"{summary['token_mult_prob_error']}")


def run_main(args):
    with open(args.config) as fh:
        cfg = yaml.safe_load(fh)
    out = args.out
    os.makedirs(os.path.join(out, "units"), exist_ok=True)
    with open(os.path.join(out, "config.yaml"), "w") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else cfg["seeds"]
    setups = args.setups.split(",") if args.setups else cfg["setups"]
    for s in setups:
        if s not in base.SETUPS:
            raise SystemExit(f"experiment_fp8_table: unknown setup '{s}' ({list(base.SETUPS)})")
    cluster = Cluster(out, args.bin_dir, args.port_offset)
    phases = args.only.split(",") if args.only else ["sweep", "sweep-models", "table"]
    for p in phases:
        if p not in ("sweep", "sweep-models", "table"):
            raise SystemExit(f"experiment_fp8_table: --only: unknown phase '{p}'")

    def stop(signum, frame):
        raise SystemExit(f"experiment_fp8_table: signal {signum}, stopping")
    signal.signal(signal.SIGTERM, stop)
    try:
        data_unit(cfg, out)
        ws = cfg["warm_start"]
        sw = cfg.get("sweep", {})
        if "sweep-models" in phases:
            # Each sweep model gets its own short BF16 SFT; no need for the warm start.
            for m in sw.get("models", []):
                s = sft_unit(cluster, cfg, out, f"sft-{m['label']}", m["model"], m["sft"],
                             ws["init_seed"])
                sweep_unit(cfg, out, args.bin_dir, f"sweep-{m['label']}", s["checkpoint"])
        if "sweep" in phases or "table" in phases:
            warm = chained_sft_unit(cluster, cfg, out, "warm-start", ws["model"], ws["sft"],
                                    ws["init_seed"])
        if "sweep" in phases:
            sweep_unit(cfg, out, args.bin_dir, "sweep-" + sw.get("warm_label", "warm-start"),
                       warm["checkpoint"])
        if "table" in phases:
            for seed in seeds:
                for setup in setups:
                    rl_unit(cluster, cfg, out, setup, seed, warm["checkpoint"])
    finally:
        cluster.close()
    log("all units done")
    return 0


# ---------------------------------------------------------------------------------------------
# report


def load_rl_units(out):
    units = []
    udir = os.path.join(out, "units")
    for name in sorted(os.listdir(udir)) if os.path.isdir(udir) else []:
        f = os.path.join(udir, name, "summary.json")
        if os.path.exists(f):
            s = read_json(f)
            if s.get("kind") == "rl":
                units.append(s)
    return units


def fnum(x, digits=3):
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def ci_cell(ci, digits=3):
    if ci["n"] == 0:
        return "n/a"
    if ci["n"] == 1:
        return f"{ci['mean']:.{digits}f} (1 seed)"
    return f"{ci['mean']:.{digits}f} ± {ci['half']:.{digits}f}"


def paired_cell(p, digits=3):
    if p["n"] < 2:
        return f"n/a ({p['n']} paired seeds)"
    return (f"{p['mean_diff']:+.{digits}f} [{p['lo']:+.{digits}f}, {p['hi']:+.{digits}f}], "
            f"p_t={p['p_t']:.2f}, p_flip={p['p_sign_flip']:.2f} (n={p['n']})")


def build_report(units, meta):
    """Returns (markdown lines, aggregate dict) from the finished RL units."""
    ok = [u for u in units if u["state"] == "SUCCEEDED"]
    setups = [s for s in meta["setups"] if any(u["setup"] == s for u in ok)]
    by = {(u["setup"], u["seed"]): u for u in ok}
    agg = {}
    for s in setups:
        us = [u for u in ok if u["setup"] == s]
        a = {"seeds": sorted(u["seed"] for u in us)}
        for k in ["start_accuracy", "final_accuracy", "best_accuracy", *MISMATCH_KEYS,
                  "time_step_seconds", "wall_seconds", "response_length_mean"]:
            a[k] = st.mean_ci([u.get(k) for u in us])
        if s != "bf16":
            common = sorted(seed for (x, seed) in by if x == s and ("bf16", seed) in by)
            for k in ("final_accuracy", "best_accuracy"):
                a[f"{k}_vs_bf16"] = st.paired_compare([by[(s, x)][k] for x in common],
                                                      [by[("bf16", x)][k] for x in common])
            # Step-time ratio per seed (CPU emulation), then its mean and t interval.
            a["step_time_ratio_vs_bf16"] = st.mean_ci(
                [by[(s, x)]["time_step_seconds"] / by[("bf16", x)]["time_step_seconds"]
                 for x in common if by[(s, x)]["time_step_seconds"]
                 and by[("bf16", x)]["time_step_seconds"]])
        agg[s] = a
    L = [f"| setup | seeds | held-out acc. at step 0 | final held-out acc. | best held-out acc. "
         f"| final vs BF16, paired: mean diff [95% CI], p | token_mult_prob_error "
         f"| gen_kl_error | sampling_importance_ratio | IS clipped | step time (s) "
         f"| step time / BF16 |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in setups:
        a = agg[s]
        L.append(
            f"| {s} | {len(a['seeds'])} | {ci_cell(a['start_accuracy'])} "
            f"| {ci_cell(a['final_accuracy'])} | {ci_cell(a['best_accuracy'])} "
            f"| {paired_cell(a['final_accuracy_vs_bf16']) if s != 'bf16' else '(reference)'} "
            f"| {ci_cell(a['token_mult_prob_error'], 5)} | {ci_cell(a['gen_kl_error'], 6)} "
            f"| {ci_cell(a['sampling_importance_ratio'], 4)} | {ci_cell(a['is_oob_ratio'], 4)} "
            f"| {ci_cell(a['time_step_seconds'], 1)} "
            f"| {ci_cell(a['step_time_ratio_vs_bf16'], 2) if s != 'bf16' else '1'} |")
    return L, agg


def report_plots(units, setups, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [u for u in units if u["state"] == "SUCCEEDED"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in ((axes[0], "val_accuracy", "held-out accuracy (greedy)"),
                           (axes[1], "reward_mean", "training reward (mean over samples)"),
                           (axes[2], "token_mult_prob_error_series", "token_mult_prob_error")):
        for s in setups:
            series = [dict((int(a), b) for a, b in u[key]) for u in ok if u["setup"] == s]
            if not series:
                continue
            steps = sorted(set.intersection(*[set(x) for x in series]))
            cis = [st.mean_ci([x[t] for x in series]) for t in steps]
            m = [c["mean"] for c in cis]
            ax.plot(steps, m, color=SETUP_COLORS[s], label=f"{s} (n={len(series)})")
            if len(series) > 1:
                ax.fill_between(steps, [c["lo"] for c in cis], [c["hi"] for c in cis],
                                color=SETUP_COLORS[s], alpha=0.15)
        ax.set_title(title + "\nmean over seeds, band = 95% t CI", fontsize=9)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "experiment-fp8-table.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_main(args):
    out = args.out
    cfg = read_json(os.path.join(out, "config.json")) if os.path.exists(
        os.path.join(out, "config.json")) else yaml.safe_load(open(os.path.join(out, "config.yaml")))
    units = load_rl_units(out)
    planned = [(s, x) for x in cfg["seeds"] for s in cfg["setups"]]
    finished = [u for u in units if u["state"] == "SUCCEEDED"]
    meta = {"setups": cfg["setups"], "seeds": cfg["seeds"]}
    lines, agg = build_report(units, meta)
    os.makedirs(args.docs, exist_ok=True)
    runs_dir = os.path.join(args.docs, "experiment-runs", "fp8-table")
    os.makedirs(runs_dir, exist_ok=True)
    # Copy every small unit summary (RL, SFT, sweep) into the repository.
    for name in sorted(os.listdir(os.path.join(out, "units"))):
        f = os.path.join(out, "units", name, "summary.json")
        if not os.path.exists(f):
            continue
        s = read_json(f)
        rows_f = os.path.join(out, "units", name, "rows.json")
        if s.get("kind") == "sft" and "sft_loss" not in s and os.path.exists(rows_f):
            # The SFT loss the job reported (its step-0 row), for units summarized before the
            # summary carried it.
            s["sft_loss"] = next((r["metrics"]["sft_loss"] for r in read_json(rows_f)
                                  if "sft_loss" in r["metrics"]), None)
        write_json(os.path.join(runs_dir, f"{name}.json"), s)
    shutil.copy(os.path.join(out, "config.yaml"), os.path.join(runs_dir, "config.yaml"))
    write_json(os.path.join(runs_dir, "aggregate.json"),
               {"planned_units": len(planned), "finished_units": len(finished),
                "failed_units": [u["unit"] for u in units if u["state"] != "SUCCEEDED"],
                "aggregate": agg})
    if finished:
        report_plots(units, [s for s in cfg["setups"]], args.docs)
    warm_f = os.path.join(out, "units", "warm-start", "summary.json")
    warm = read_json(warm_f) if os.path.exists(warm_f) else None
    job = cfg["job"]
    partial = len(finished) < len(planned)
    head = [
        "# FP8 precision table with confidence intervals"
        + (" (PARTIAL)" if partial else ""), "",
        f"<!-- Written by `scripts/experiment_fp8_table.py report --out {out}`; do not edit. -->",
        "",
        f"**{len(finished)} of {len(planned)} planned units finished** "
        f"({len(cfg['setups'])} setups x seeds {cfg['seeds']})"
        + (": the table is partial; setups with fewer than 2 seeds have no interval, and the "
           "paired comparisons use only the seeds that both setups finished." if partial else "."),
        "",
        f"Task: {cfg['data']['digits']}-digit addition with a worked one-line answer "
        f"(scripts/experiment_cot_data.py), reward 1 only for the exact derivation; "
        f"{job['validation']['num_prompts']} held-out prompts (greedy). Model: "
        f"{cfg['warm_start']['model']} (qwen3 architecture, byte vocabulary), BF16 SFT warm "
        f"start of {cfg['warm_start']['sft']['steps']} steps"
        + (f" (held-out accuracy after it: {warm['val_accuracy']})" if warm else "")
        + f", then {job['algorithm']['steps']} GRPO steps of {job['algorithm']['prompts_per_step']}"
        f" prompts x {job['algorithm']['samples_per_prompt']} samples, max "
        f"{job['algorithm']['max_new_tokens']} new tokens, lr {job['algorithm']['learning_rate']}."
        " Every setup of a seed starts from the same warm start (paired seeds).", "",
        "Cells: mean ± half-width of the 95% Student-t interval over seeds. Paired column: "
        "setup minus BF16 over the seeds both finished, mean difference [95% t CI], two-sided "
        "paired t-test p (p_t) and sign-flip permutation p (p_flip, exact up to 16 seeds). "
        "Mismatch metrics: "
        "each run's mean over its RL steps. Step times are of fp8rl's CPU reference path, where "
        "FP8 is emulated (quantize, then fp32 GEMM per block); they say nothing about GPU speed, "
        "and the machine was shared with other jobs (load average per unit below).", ""]
    if not finished:
        lines = ["**No GRPO unit has finished yet, so there is no table.** Warm start: "
                 + (f"finished ({warm['date']})." if warm else
                    "not finished when this report was written (the GRPO units start from it)."),
                 ""]
    tail = ["", "![curves](experiment-fp8-table.png)"] if finished else []
    tail += ["", "Units:", ""] if units else []
    for u in sorted(units, key=lambda u: (u["seed"], u["setup"])):
        tail.append(
            f"- {u['unit']}: {u['state']}, held-out {fnum(u.get('start_accuracy'))} -> "
            f"{fnum(u.get('final_accuracy'))} (best {fnum(u.get('best_accuracy'))}), "
            f"token_mult_prob_error {fnum(u.get('token_mult_prob_error'), 5)}, step "
            f"{fnum(u.get('time_step_seconds'), 1)} s, wall {u['wall_seconds'] / 60:.0f} min, "
            f"{u.get('date', '?')}, load {fnum(u.get('load_avg_start'), 1)}"
            f"->{fnum(u.get('load_avg_end'), 1)}")
    total = sum(u["wall_seconds"] for u in units) / 3600
    tail += ["", f"Wall time of the GRPO units run so far: {total:.1f} h"
             + (f"; warm start {warm['wall_seconds'] / 60:.0f} min" if warm else "") + "."]
    with open(os.path.join(args.docs, "experiment-fp8-table.md"), "w") as fh:
        fh.write("\n".join(head + lines + tail) + "\n")
    print("\n".join(lines))
    print(f"{len(finished)} of {len(planned)} units finished")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run (or resume) the units")
    r.add_argument("--config", default=os.path.join(REPO, "configs/experiments/fp8-table.yaml"))
    r.add_argument("--out", required=True)
    r.add_argument("--bin-dir", default=os.environ.get("FP8RL_BIN_DIR",
                                                       os.path.join(REPO, "build/bin")))
    r.add_argument("--seeds", default=None, help="override the config's seeds (comma-separated)")
    r.add_argument("--setups", default=None, help="override the config's setups")
    r.add_argument("--only", default=None,
                   help="comma-separated phases: sweep (on the warm start), sweep-models (their "
                        "own SFT, then the sweep), table (default: all three)")
    r.add_argument("--port-offset", type=int, default=PORT_OFFSET,
                   help="ports of this invocation's local cluster (two concurrent invocations "
                        "need different offsets)")
    p = sub.add_parser("report", help="tables and plots from the finished units")
    p.add_argument("--out", required=True)
    p.add_argument("--docs", default=os.path.join(REPO, "docs/results"))
    args = ap.parse_args()
    return run_main(args) if args.cmd == "run" else report_main(args)


if __name__ == "__main__":
    sys.exit(main())
