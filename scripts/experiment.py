#!/usr/bin/env python3
"""The seed's precision table in miniature: one job in four precision setups x several seeds.

Runs on a local cluster (`fp8rl up`, loopback only), one job at a time, and writes a results
folder: results.json (every metrics row of every job), table.md (mean +- std over seeds),
accuracy.png and mismatch.png (matplotlib). See docs/results/README.md for the choice of task,
model and step count, and for how to read the table.

Setups (all from configs/demo.yaml, same SFT warm start, same task data):
  bf16            BF16 generation, training and KV cache
  fp8             FP8 generation and training (linears) and FP8 KV cache       (the recipe)
  fp8-gen-tis     FP8 generation + FP8 KV cache, BF16 training, tis correction
  fp8-gen-none    the same without IS correction (is.rule: none)
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
import urllib.error
import urllib.request

import yaml

SETUPS = {
    "bf16": {"precision": {"generation": "bf16", "training": "bf16", "kv_cache": "bf16"},
             "is": {"rule": "tis", "cap": 2.0}},
    "fp8": {"precision": {"generation": "fp8", "training": "fp8", "kv_cache": "fp8"},
            "is": {"rule": "tis", "cap": 2.0}},
    "fp8-gen-tis": {"precision": {"generation": "fp8", "training": "bf16", "kv_cache": "fp8"},
                    "is": {"rule": "tis", "cap": 2.0}},
    "fp8-gen-none": {"precision": {"generation": "fp8", "training": "bf16", "kv_cache": "fp8"},
                     "is": {"rule": "none"}},
}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
# Port offset of the experiment's cluster, so it does not collide with a `fp8rl up` on the
# default ports.
PORT_OFFSET = 300


def http(method, url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode() or "null")
    except urllib.error.HTTPError as e:
        raise SystemExit(f"experiment: {method} {url}: HTTP {e.code} {e.read().decode()[:300]}")


def job_config(base, setup, seed, steps, out_dir):
    cfg = copy.deepcopy(base)
    spec = SETUPS[setup]
    cfg["name"] = f"exp-{setup}-s{seed}"
    cfg["precision"].update(spec["precision"])
    cfg["algorithm"]["is"] = dict(spec["is"])
    # One seed drives the model init, the rollout sampling and the SFT batches; the task data
    # (train/held-out split) stays the same for every run.
    cfg["model"]["init"]["seed"] = seed
    cfg["algorithm"]["seed"] = seed
    if steps is not None:
        cfg["algorithm"]["steps"] = steps
        cfg["validation"]["every_steps"] = max(1, min(cfg["validation"]["every_steps"], steps // 4))
        cfg["checkpoint"]["every_steps"] = 0
    cfg["checkpoint"]["dir"] = os.path.join(out_dir, "checkpoints", cfg["name"])
    return cfg


def wait_healthy(base_url, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"experiment: fp8rl up exited with {proc.returncode}")
        try:
            http("GET", base_url + "/v1/jobs", timeout=2)
            return
        except (urllib.error.URLError, OSError, json.JSONDecodeError):
            time.sleep(1)
    raise SystemExit(f"experiment: coordinator not ready at {base_url} after {timeout} s")


def start_cluster(fp8rl, out_dir, bin_dir, port_offset, extra_args=(), cluster_dir="cluster"):
    """`fp8rl up` on loopback ports + port_offset, its state and job data under
    out_dir/cluster_dir, its output in out_dir/cluster.log (appended); extra_args go to `fp8rl up`
    (e.g. --models-root). Returns (process, log file) for stop_cluster."""
    log = open(os.path.join(out_dir, "cluster.log"), "a")
    proc = subprocess.Popen([fp8rl, "up", "--data-dir", os.path.join(out_dir, cluster_dir),
                             "--port-offset", str(port_offset), "--bin-dir", bin_dir,
                             "--data-root", os.path.abspath(out_dir), *extra_args],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, log


def wait_job(base_url, job_id, label, t0, poll=2.0):
    """Polls GET /v1/jobs/{id} until the job ends, printing one line per change of state or step;
    returns (final job record, its metrics rows)."""
    last = None
    while True:
        job = http("GET", f"{base_url}/v1/jobs/{job_id}")
        state = job["state"]
        if state in TERMINAL:
            break
        progress = (state, job.get("step"))
        if progress != last:
            print(f"[{time.time() - t0:6.0f} s] {label}: {state} step {job.get('step', 0)}/"
                  f"{job.get('total_steps', '?')}", flush=True)
            last = progress
        time.sleep(poll)
    rows = http("GET", f"{base_url}/v1/jobs/{job_id}/metrics")["steps"]
    return job, rows


def stop_cluster(proc, log):
    """SIGTERM, up to 60 s for a clean stop, then SIGKILL."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def mean_std(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def summarize(runs):
    """runs: list of {setup, seed, rows}. Returns per-setup aggregates over seeds."""
    out = {}
    for setup in SETUPS:
        per_seed = [r for r in runs if r["setup"] == setup and r["state"] == "SUCCEEDED"]
        if not per_seed:
            continue
        agg = {}
        finals, bests, tmpe, gkl, oob, sir, steptime, start = [], [], [], [], [], [], [], []
        for r in per_seed:
            val = [(row["step"], row["metrics"]["val_accuracy"]) for row in r["rows"]
                   if "val_accuracy" in row["metrics"]]
            rl_rows = [row["metrics"] for row in r["rows"] if row["step"] > 0]
            start.append(val[0][1] if val and val[0][0] == 0 else None)
            finals.append(val[-1][1] if val else None)
            bests.append(max(v for _, v in val if _ > 0) if len(val) > 1 else None)

            def avg(key):
                xs = [m[key] for m in rl_rows if key in m]
                return sum(xs) / len(xs) if xs else None
            tmpe.append(avg("token_mult_prob_error"))
            gkl.append(avg("gen_kl_error"))
            oob.append(avg("is_oob_ratio"))
            sir.append(avg("sampling_importance_ratio"))
            steptime.append(avg("time_step_seconds"))
        for name, xs in [("start_accuracy", start), ("final_accuracy", finals),
                         ("best_accuracy", bests), ("token_mult_prob_error", tmpe),
                         ("gen_kl_error", gkl), ("is_oob_ratio", oob),
                         ("sampling_importance_ratio", sir), ("step_seconds", steptime)]:
            agg[name] = mean_std(xs)
        agg["seeds"] = len(per_seed)
        out[setup] = agg
    return out


def write_table(summary, runs, path, meta):
    lines = [f"# Precision setups, {meta['steps']} GRPO steps, seeds {meta['seeds']}",
             "",
             f"Task and model: {meta['task']}. Machine: {meta['machine']}. Date: {meta['date']}.",
             f"Wall time of the whole experiment: {meta['wall_minutes']:.1f} min. "
             "Values are mean +- sample std over seeds; mismatch metrics are means over the RL "
             "steps of each run.",
             "",
             "| setup | seeds | held-out acc. after SFT | final held-out acc. | best held-out acc. "
             "| token_mult_prob_error | gen_kl_error | sampling_importance_ratio "
             "| IS weights clipped/masked | step time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def f(pair, digits=3):
        m, s = pair
        if math.isnan(m):
            return "n/a"
        return f"{m:.{digits}f} +- {s:.{digits}f}"
    for setup, a in summary.items():
        lines.append(
            f"| {setup} | {a['seeds']} | {f(a['start_accuracy'])} | {f(a['final_accuracy'])} | "
            f"{f(a['best_accuracy'])} | {f(a['token_mult_prob_error'], 5)} | "
            f"{f(a['gen_kl_error'], 6)} | {f(a['sampling_importance_ratio'], 4)} | "
            f"{f(a['is_oob_ratio'], 4)} | {f(a['step_seconds'], 2)} |")
    failed = [r for r in runs if r["state"] != "SUCCEEDED"]
    if failed:
        lines += ["", "Runs that did not succeed (left out of the table):"]
        lines += [f"- {r['setup']} seed {r['seed']}: {r['state']} {r.get('error', '')}"
                  for r in failed]
    lines += ["", "Per run (final / best held-out accuracy):", ""]
    for r in runs:
        val = [row["metrics"]["val_accuracy"] for row in r["rows"]
               if "val_accuracy" in row["metrics"]]
        if val:
            lines.append(f"- {r['setup']} seed {r['seed']}: {val[-1]:.3f} / "
                         f"{max(val[1:]) if len(val) > 1 else float('nan'):.3f}")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def plot(runs, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bf16": "tab:blue", "fp8": "tab:green", "fp8-gen-tis": "tab:orange",
              "fp8-gen-none": "tab:red"}

    def band(ax, key, setup):
        series = []
        for r in runs:
            if r["setup"] != setup or r["state"] != "SUCCEEDED":
                continue
            series.append({row["step"]: row["metrics"][key] for row in r["rows"]
                           if key in row["metrics"]})
        if not series:
            return
        steps = sorted(set.intersection(*[set(s) for s in series]))
        means = [sum(s[t] for s in series) / len(series) for t in steps]
        lo = [min(s[t] for s in series) for t in steps]
        hi = [max(s[t] for s in series) for t in steps]
        ax.plot(steps, means, label=f"{setup} (n={len(series)})", color=colors[setup])
        ax.fill_between(steps, lo, hi, alpha=0.15, color=colors[setup])

    def chart(key, xlabel, ylabel, title, name):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for setup in SETUPS:
            band(ax, key, setup)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)

    chart("val_accuracy", "GRPO step (0 = after SFT)", "held-out accuracy",
          "Held-out accuracy: mean over seeds, band = min..max", "accuracy.png")
    chart("token_mult_prob_error", "GRPO step", "token_mult_prob_error = mean(exp(|gen - prev|))",
          "Sampler/learner mismatch per step", "mismatch.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 seed, 6 steps per setup (checks the pipeline, ~4 min)")
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    ap.add_argument("--steps", type=int, default=None,
                    help="GRPO steps per run (default: configs/demo.yaml's)")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--out", default="runs/experiment")
    ap.add_argument("--bin-dir", default=os.environ.get("FP8RL_BIN_DIR", "build/bin"))
    ap.add_argument("--docs", default=None,
                    help="also copy table.md and the plots into this folder (e.g. docs/results)")
    args = ap.parse_args()

    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"experiment: --seeds: expected comma-separated integers, got '{args.seeds}'")
    if not seeds:
        raise SystemExit("experiment: --seeds: no seed given")
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"experiment: --steps: must be >= 1, got {args.steps}")
    if not os.path.isfile(args.config):
        raise SystemExit(f"experiment: --config: no such file '{args.config}'")
    steps = args.steps
    if args.quick:
        seeds = seeds[:1]
        steps = steps or 6
    with open(args.config) as fh:
        base = yaml.safe_load(fh)
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    fp8rl = os.path.join(args.bin_dir, "fp8rl")
    if not os.access(fp8rl, os.X_OK):
        raise SystemExit(f"experiment: {fp8rl} not found (build first: bash scripts/build.sh)")

    base_url = f"http://127.0.0.1:{8080 + PORT_OFFSET}"
    proc, cluster_log = start_cluster(fp8rl, args.out, args.bin_dir, PORT_OFFSET)
    t0 = time.time()
    runs = []
    try:
        wait_healthy(base_url, proc, 120)
        jobs = []
        for seed in seeds:
            for setup in SETUPS:
                cfg = job_config(base, setup, seed, steps, args.out)
                job = http("POST", base_url + "/v1/jobs", cfg)
                jobs.append((setup, seed, job["id"]))
        total = len(jobs)
        for i, (setup, seed, job_id) in enumerate(jobs):
            job, rows = wait_job(base_url, job_id, f"run {i + 1}/{total} {setup} seed {seed}", t0)
            state = job["state"]
            runs.append({"setup": setup, "seed": seed, "job": job_id, "state": state,
                         "error": job.get("error", ""), "rows": rows})
            val = [r["metrics"]["val_accuracy"] for r in rows if "val_accuracy" in r["metrics"]]
            print(f"[{time.time() - t0:6.0f} s] run {i + 1}/{total} {setup} seed {seed}: {state}"
                  + (f", held-out accuracy {val[0]:.3f} -> {val[-1]:.3f}" if val else ""),
                  flush=True)
            with open(os.path.join(args.out, "results.json"), "w") as fh:
                json.dump(runs, fh, indent=1)
    finally:
        stop_cluster(proc, cluster_log)

    wall = (time.time() - t0) / 60
    summary = summarize(runs)
    uname = os.uname()
    meta = {"steps": steps or base["algorithm"]["steps"], "seeds": seeds,
            "task": f"{base['task']['name']} ({base['task'].get('params', {})}), model "
                    f"{base['model']['init']['config']}",
            "machine": f"{uname.nodename} ({os.cpu_count()} cores, {uname.machine})",
            "date": time.strftime("%Y-%m-%d"), "wall_minutes": wall}
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump({"meta": meta, "summary": summary}, fh, indent=1)
    write_table(summary, runs, os.path.join(args.out, "table.md"), meta)
    plot(runs, args.out)
    if args.docs:
        os.makedirs(args.docs, exist_ok=True)
        for name in ("table.md", "accuracy.png", "mismatch.png", "summary.json"):
            shutil.copy(os.path.join(args.out, name), os.path.join(args.docs, name))
    print(open(os.path.join(args.out, "table.md")).read())
    bad = [r for r in runs if r["state"] != "SUCCEEDED"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
