#!/usr/bin/env python3
"""Asynchronous RL on the local CPU cluster: the demo job (configs/demo.yaml) with
algorithm.max_staleness K = 0, 1, 2 x seeds, one job at a time on one `fp8rl up` cluster
(loopback only). Prints a markdown table: RL steps per minute (from the row-0 record to the last
row, so SFT is left out), held-out accuracy after SFT / at the end / best, and the staleness the
async runs trained with. A benchmark, not a test (docs/perf.md "Asynchronous RL").

  python3 bench/async/run.py --seeds 1,2 --steps 40 --out runs/async
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from experiment import TERMINAL, http, mean_std, wait_healthy  # noqa: E402

PORT_OFFSET = 340  # apart from scripts/experiment.py's cluster


def job_config(base, k, seed, steps, out_dir):
    cfg = copy.deepcopy(base)
    cfg["name"] = f"async-k{k}-s{seed}"
    cfg["model"]["init"]["seed"] = seed
    cfg["algorithm"]["seed"] = seed
    cfg["algorithm"]["max_staleness"] = k
    if steps is not None:
        cfg["algorithm"]["steps"] = steps
    cfg["checkpoint"]["every_steps"] = 0
    cfg["checkpoint"]["dir"] = os.path.join(out_dir, "checkpoints", cfg["name"])
    return cfg


def run_summary(run):
    rows = run["rows"]
    val = [(r["step"], r["metrics"]["val_accuracy"]) for r in rows if "val_accuracy" in r["metrics"]]
    rl = [r for r in rows if r["step"] > 0]
    minutes = (rl[-1]["recorded_unix_ms"] - rows[0]["recorded_unix_ms"]) / 60000.0
    buckets = {}
    for r in rl:
        for key, value in r["metrics"].items():
            if key.startswith("samples_staleness_"):
                buckets[int(key.rsplit("_", 1)[1])] = buckets.get(int(key.rsplit("_", 1)[1]), 0) + value
    total = sum(buckets.values())
    return {
        "steps_per_minute": len(rl) / minutes if minutes > 0 else float("nan"),
        "start": val[0][1] if val and val[0][0] == 0 else float("nan"),
        "final": val[-1][1] if val else float("nan"),
        "best": max(v for s, v in val if s > 0) if len(val) > 1 else float("nan"),
        "staleness_mean": (sum(k * n for k, n in buckets.items()) / total) if total else 0.0,
        "regenerated": sum(r["metrics"].get("stale_regenerated_samples", 0) for r in rl),
        "trainer_idle": sum(r["metrics"].get("trainer_idle_seconds", 0) for r in rl) / len(rl),
        "generate": sum(r["metrics"].get("time_generate_seconds", 0) for r in rl) / len(rl),
        "train": sum(r["metrics"].get("time_train_seconds", 0) for r in rl) / len(rl),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--ks", default="0,1,2", help="max_staleness values (default 0,1,2)")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the config's)")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--out", default="runs/async")
    ap.add_argument("--bin-dir", default=os.environ.get("FP8RL_BIN_DIR", "build/bin"))
    args = ap.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        ks = [int(k) for k in args.ks.split(",") if k.strip()]
    except ValueError:
        raise SystemExit("async bench: --seeds and --ks take comma-separated integers")
    if not seeds or not ks:
        raise SystemExit("async bench: --seeds and --ks must name at least one value")
    with open(args.config) as fh:
        base = yaml.safe_load(fh)
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    fp8rl = os.path.join(args.bin_dir, "fp8rl")
    if not os.access(fp8rl, os.X_OK):
        raise SystemExit(f"async bench: {fp8rl} not found (build first: bash scripts/build.sh)")
    base_url = f"http://127.0.0.1:{8080 + PORT_OFFSET}"
    log = open(os.path.join(args.out, "cluster.log"), "w")
    proc = subprocess.Popen([fp8rl, "up", "--data-dir", os.path.join(args.out, "cluster"),
                             "--port-offset", str(PORT_OFFSET), "--bin-dir", args.bin_dir,
                             "--data-root", os.path.abspath(args.out)],
                            stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    runs = []
    try:
        wait_healthy(base_url, proc, 120)
        # Seed-major, K inner: the machine's load drifts over the run, every K sees it alike.
        jobs = [(k, seed, http("POST", base_url + "/v1/jobs",
                               job_config(base, k, seed, args.steps, args.out))["id"])
                for seed in seeds for k in ks]
        for k, seed, job_id in jobs:
            while True:
                job = http("GET", f"{base_url}/v1/jobs/{job_id}")
                if job["state"] in TERMINAL:
                    break
                time.sleep(2)
            rows = http("GET", f"{base_url}/v1/jobs/{job_id}/metrics")["steps"]
            run = {"k": k, "seed": seed, "state": job["state"], "error": job.get("error", ""),
                   "rows": rows}
            if job["state"] == "SUCCEEDED":
                run["summary"] = run_summary(run)
            runs.append(run)
            print(f"[{time.time() - t0:6.0f} s] K={k} seed {seed}: {job['state']} "
                  f"{json.dumps(run.get('summary', {}))}", flush=True)
            with open(os.path.join(args.out, "results.json"), "w") as fh:
                json.dump(runs, fh, indent=1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

    def f(xs, digits):
        m, s = mean_std(xs)
        return "n/a" if math.isnan(m) else f"{m:.{digits}f} +- {s:.{digits}f}"
    lines = ["| K | runs | RL steps/min | generate s/step | train s/step | trainer idle s/step "
             "| mean staleness | regenerated | held-out acc. after SFT | final | best |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in ks:
        ok = [r["summary"] for r in runs if r["k"] == k and "summary" in r]
        if not ok:
            lines.append(f"| {k} | 0 | (no run succeeded) |||||||||")
            continue
        col = lambda key: [s[key] for s in ok]  # noqa: E731
        lines.append(f"| {k} | {len(ok)} | {f(col('steps_per_minute'), 1)} | "
                     f"{f(col('generate'), 2)} | {f(col('train'), 2)} | "
                     f"{f(col('trainer_idle'), 2)} | {f(col('staleness_mean'), 2)} | "
                     f"{sum(col('regenerated')):.0f} | {f(col('start'), 3)} | "
                     f"{f(col('final'), 3)} | {f(col('best'), 3)} |")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "table.md"), "w") as fh:
        fh.write(table + "\n")
    print(f"wall {(time.time() - t0) / 60:.1f} min, {os.cpu_count()} cores")
    print(table)
    return 0 if all(r["state"] == "SUCCEEDED" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
