#!/usr/bin/env python3
"""The seed's precision table with statistical power: resumable units for hours in the background.

One config (configs/experiments/fp8-table.yaml) describes everything; `run` works through the
units below in order, and a unit whose summary.json exists is skipped, so the same command
resumes after a stop (an interrupted unit starts again from its beginning):

  data                  the task files (scripts/experiment_cot_data.py) under OUT/data
  repro                 two identical short SFT jobs from the random init; their weight hashes
                        must match (the warm start is rebuilt, not stored: it must be bit-exact)
  timing                a 2-step GRPO job of the table's config (measures a step and a
                        500-prompt validation before hours are spent)
  warm-start            BF16 SFT from a random init (the shared starting checkpoint), as chained
                        parts; with `warm_start.sft.target_accuracy` it stops at the first part
                        whose held-out accuracy reaches it; with `warm_start.sha256` its weights
                        must hash to that value
  sweep-<model>         the mismatch sweep (scripts/experiment_mismatch_sweep.py) on the warm
                        start, then on each `sweep_models` entry (its own short BF16 SFT job first)
  <setup>-s<seed>       one GRPO job from the warm start per (setup, seed), seed-major, so that
                        the finished units form complete paired seeds as early as possible

With --commit, every finished unit's summary.json is copied into
docs/results/experiment-runs/fp8-table/<design>/ and committed (that path only) at once, so a
unit survives the loss of the run folder.

Each job runs on a local cluster (`fp8rl up`, loopback, port offset 310) that this process starts
and stops. `report` reads the finished units only and writes the table (mean and 95% t interval
over seeds of the pre-registered primary endpoint and the secondary ones, a paired comparison
of each setup against BF16 over the seeds both finished), the curves with 95% bands, the mismatch
metrics and the step times; FP8 is the CPU emulation of the recipe, so its step times say nothing
about a GPU.

  experiment_fp8_table.py run --out /work/exp-runs/fp8-table-d2 [--config ...] [--only PHASE]
      [--commit]
  experiment_fp8_table.py report --out /work/exp-runs/fp8-table-d2 --docs docs/results
"""

import argparse
import copy
import hashlib
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
# The keys of `warm_start.sft` that are job keys; the others (parts, extend_steps, ...) say how the
# harness splits the warm start into jobs.
SFT_JOB_KEYS = ("steps", "learning_rate", "batch_size")
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


def weights_sha256(checkpoint):
    """SHA-256 of a checkpoint folder's weights (model.safetensors: the F32 weights and the
    safetensors header; config.json and the optimizer state are not part of it)."""
    h = hashlib.sha256()
    with open(os.path.join(checkpoint, "model.safetensors"), "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def runs_dir(docs, cfg):
    """Where a design's unit summaries are kept in the repository: one folder per design, so a
    table never mixes designs."""
    return os.path.join(docs, "experiment-runs", "fp8-table", cfg.get("design", "design1-ceiling"))


class Publisher:
    """Copies a finished unit's summary into the repository's runs folder and, with commit=True,
    commits that one file at once (`git commit -- PATH` leaves every other change alone). A
    failed commit (e.g. another git command holds the index lock) is retried, then logged; it
    never stops the run: the summary stays in the run folder and `report` copies it again."""

    def __init__(self, docs, cfg, commit):
        self.dir, self.commit, self.design = runs_dir(docs, cfg), commit, cfg.get("design", "")

    def __call__(self, name, summary):
        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, f"{name}.json")
        write_json(path, summary)
        self._commit(path, f"experiment {self.design}: unit {name} finished")

    def config(self, src):
        """The run's config beside the summaries (what a later session rebuilds from)."""
        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, "config.yaml")
        shutil.copy(src, path)
        self._commit(path, f"experiment {self.design}: the run's config")

    def _commit(self, path, msg):
        if not self.commit:
            return
        for attempt in range(5):
            add = subprocess.run(["git", "-C", REPO, "add", "--", path], capture_output=True,
                                 text=True)
            res = subprocess.run(["git", "-C", REPO, "commit", "-q", "-m", msg, "--", path],
                                 capture_output=True, text=True) if add.returncode == 0 else add
            if res.returncode == 0:
                log(f"committed {os.path.relpath(path, REPO)}")
                return
            if "nothing to commit" in res.stdout + res.stderr:
                return
            time.sleep(3 + 5 * attempt)
        log(f"WARNING: could not commit {path}: {(res.stderr or res.stdout).strip()[:200]}")


# Called with (unit name, summary) when a unit finishes; run_main sets it.
PUBLISH = None


def finish_unit(out, name, summary):
    """Writes units/<name>/summary.json (the unit is done) and publishes it."""
    udir = os.path.join(out, "units", name)
    os.makedirs(udir, exist_ok=True)
    write_json(os.path.join(udir, "summary.json"), summary)
    if PUBLISH is not None:
        PUBLISH(name, summary)


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


def sft_job_config(cfg, out, name, model_config, sft, seed, start=None, task_seed_offset=0,
                   val_prompts=None):
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
    job["sft"] = {k: sft[k] for k in SFT_JOB_KEYS if k in sft}
    job["algorithm"].update({"steps": 1, "learning_rate": 1e-9, "warmup_steps": 0,
                             "prompts_per_step": 2, "samples_per_prompt": 2, "seed": seed})
    job["precision"] = {**job.get("precision", {}), **ws["precision"]}
    job["algorithm"]["is"] = {"rule": "tis", "cap": 2.0}
    job["validation"] = {"every_steps": 0,
                         "num_prompts": val_prompts or ws.get("val_prompts", 100)}
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


def chained_sft_unit(cluster, cfg, out, name, model_config, sft, seed, expect_sha256=None):
    """An SFT unit run as chained jobs, each continuing from the checkpoint of the one before (a
    finished part is a unit of its own, so an interrupted warm start resumes at its first
    unfinished part instead of from the beginning). Each part starts with fresh AdamW moments and
    draws its examples with the task seed + its index. Two ways to split:

      sft.parts: P                   `sft.steps` in P equal parts (design 1)
      sft.target_accuracy: A         a first part of `sft.steps`, then parts of
      sft.extend_steps: E            `sft.extend_steps` until the held-out accuracy after a part
      sft.max_extensions: M          (greedy, `warm_start.val_prompts` prompts) reaches A; stops
                                     with an error when M extensions did not reach it

    The summary is the last part's, with the parts' wall and SFT seconds added up and the weight
    hash; with `expect_sha256` a different hash stops the run (the start was not rebuilt
    bit-exactly, so its GRPO units would not pair with the committed ones)."""
    done = os.path.join(out, "units", name, "summary.json")
    if os.path.exists(done):
        return read_json(done)
    adaptive = sft.get("target_accuracy") is not None
    if adaptive:
        steps = [sft["steps"]] + [sft["extend_steps"]] * int(sft.get("max_extensions", 0))
    else:
        steps = warm_start_parts(sft)
        if len(steps) == 1:
            summary = sft_unit(cluster, cfg, out, name, model_config, sft, seed)
            check_warm_hash(name, summary, expect_sha256)
            return summary
    start, parts = None, []
    for i, n in enumerate(steps):
        part = sft_unit(cluster, cfg, out, f"{name}-part{i + 1}", model_config,
                        {**sft, "steps": n}, seed, start=start, task_seed_offset=i)
        parts.append(part)
        start = part["checkpoint"]
        if adaptive and sft_accuracy(part) >= sft["target_accuracy"]:
            break
    if adaptive and sft_accuracy(parts[-1]) < sft["target_accuracy"]:
        raise SystemExit(
            f"experiment_fp8_table: {name}: held-out accuracy {sft_accuracy(parts[-1])} after "
            f"{sum(p['sft']['steps'] for p in parts)} SFT steps is below "
            f"warm_start.sft.target_accuracy {sft['target_accuracy']}; raise "
            f"warm_start.sft.max_extensions or the steps, and start again in a new --out")
    summary = dict(parts[-1])
    summary.update({"unit": name, "sft": dict(sft),
                    "parts": [p["unit"] for p in parts],
                    "part_accuracy": [[p["unit"], sum(q["sft"]["steps"] for q in parts[:k + 1]),
                                       sft_accuracy(p)] for k, p in enumerate(parts)],
                    "sft_steps_total": sum(p["sft"]["steps"] for p in parts),
                    "wall_seconds": sum(p["wall_seconds"] for p in parts),
                    "sft_seconds": sum(p.get("sft_seconds", 0) for p in parts)})
    check_warm_hash(name, summary, expect_sha256)
    finish_unit(out, name, summary)
    log(f"{name}: all {len(parts)} parts done, weights sha256 {summary.get('weights_sha256')}")
    return summary


def sft_accuracy(summary):
    """Held-out accuracy of an SFT unit's model right after SFT (its job's step-0 validation)."""
    val = summary["val_accuracy"]
    return val[0][1] if val else 0.0


def check_warm_hash(name, summary, expect):
    if expect and summary.get("weights_sha256") != expect:
        raise SystemExit(
            f"experiment_fp8_table: {name}: weights sha256 {summary.get('weights_sha256')} != "
            f"warm_start.sha256 {expect} in the config: this machine did not rebuild the same "
            f"warm start, so new GRPO units would not pair with the committed ones")


def sft_unit(cluster, cfg, out, name, model_config, sft, seed, start=None, task_seed_offset=0,
             val_prompts=None):
    """Runs (or finds) an SFT unit; returns its summary (with the checkpoint folder)."""
    udir = os.path.join(out, "units", name)
    done = os.path.join(udir, "summary.json")
    if os.path.exists(done):
        return read_json(done)
    os.makedirs(udir, exist_ok=True)
    job_cfg = sft_job_config(cfg, out, name, model_config, sft, seed, start, task_seed_offset,
                             val_prompts)
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
               "weights_sha256": weights_sha256(os.path.join(ckpt_root, f"step-{steps[-1]}")),
               "val_accuracy": val, "wall_seconds": wall,
               "sft_loss": next((r["metrics"]["sft_loss"] for r in rows
                                 if "sft_loss" in r["metrics"]), None),
               "sft_seconds": sum(r["metrics"].get("time_sft_seconds", 0) for r in rows),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
               "load_avg_end": os.getloadavg()[0]}
    finish_unit(out, name, summary)
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
    if PUBLISH is not None:
        PUBLISH(name, read_json(os.path.join(udir, "summary.json")))


def repro_unit(cluster, cfg, out):
    """Two identical short SFT jobs from the random init (units repro-a, repro-b: the warm
    start's model, seed, data, precision and learning rate, `repro.sft_steps` steps); their
    weight hashes must be equal, or the run stops: the warm start is rebuilt from its config,
    not stored, so it has to be bit-exact. Returns repro-a's summary (its checkpoint serves the
    timing unit)."""
    done = os.path.join(out, "units", "repro", "summary.json")
    ws = cfg["warm_start"]
    sft = {**{k: ws["sft"][k] for k in SFT_JOB_KEYS if k in ws["sft"]},
           "steps": cfg.get("repro", {}).get("sft_steps", 10)}
    # A few validation prompts only: validation does not touch the weights.
    a = sft_unit(cluster, cfg, out, "repro-a", ws["model"], sft, ws["init_seed"], val_prompts=8)
    b = sft_unit(cluster, cfg, out, "repro-b", ws["model"], sft, ws["init_seed"], val_prompts=8)
    same = a["weights_sha256"] == b["weights_sha256"]
    if not os.path.exists(done):
        finish_unit(out, "repro", {
            "unit": "repro", "kind": "repro", "sft_steps": sft["steps"], "identical": same,
            "weights_sha256": [a["weights_sha256"], b["weights_sha256"]],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine()})
        log(f"repro: two {sft['steps']}-step SFT jobs gave "
            f"{'identical' if same else 'DIFFERENT'} weights ({a['weights_sha256'][:16]}...)")
    if not same:
        raise SystemExit("experiment_fp8_table: repro: two identical SFT jobs gave different "
                         "weights, so the warm start cannot be rebuilt bit-exactly here; commit "
                         "the warm-start checkpoint instead (docs/results/experiment-README.md)")
    return a


def timing_unit(cluster, cfg, out, checkpoint):
    """A short GRPO job with the table's config (BF16, seed 1, `timing.steps` steps, validation
    only at the first and last step) from `checkpoint`: a step's and a validation's time on
    this machine before the table's hours are spent. From a barely trained model most
    completions run to max_new_tokens, so its generation time is an upper bound."""
    name = "timing"
    if os.path.exists(os.path.join(out, "units", name, "summary.json")):
        return
    job_cfg = rl_job_config(cfg, out, "bf16", 1, checkpoint)
    job_cfg["name"] = "table-timing"
    job_cfg["algorithm"]["steps"] = cfg.get("timing", {}).get("steps", 2)
    job_cfg["validation"] = {**job_cfg["validation"], "every_steps": 0}
    load0 = os.getloadavg()[0]
    final, rows, wall = cluster.job(job_cfg, name)
    os.makedirs(os.path.join(out, "units", name), exist_ok=True)
    write_json(os.path.join(out, "units", name, "rows.json"), rows)
    summary = {"unit": name, "kind": "timing", "setup": "bf16", "state": final["state"],
               "error": final.get("error", ""), "wall_seconds": wall,
               "steps": job_cfg["algorithm"]["steps"],
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
               "load_avg_start": load0, "load_avg_end": os.getloadavg()[0], **summarize_rl(rows)}
    finish_unit(out, name, summary)
    log(f"timing: {final['state']}, step {fnum(summary['time_step_no_val_seconds'], 1)} s "
        f"without validation (generate "
        f"{fnum(summary['time_generate_seconds'], 1)} s, train "
        f"{fnum(summary['time_train_seconds'], 1)} s), validation "
        f"{fnum(summary['time_validate_seconds'], 1)} s, wall {wall / 60:.1f} min")


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
    # A step's time without the validation that some steps run (time_step_seconds includes it).
    no_val = [r["metrics"]["time_step_seconds"] - r["metrics"].get("time_validate_seconds", 0.0)
              for r in rl_rows if "time_step_seconds" in r["metrics"]]
    out["time_step_no_val_seconds"] = sum(no_val) / len(no_val) if no_val else None
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
    finish_unit(out, name, summary)
    log(f"{name}: {final['state']} in {wall / 60:.1f} min, held-out accuracy "
        f"{summary['start_accuracy']} -> {summary['final_accuracy']}, token_mult_prob_error "
        f"{summary['token_mult_prob_error']}")


PHASES = ("repro", "timing", "sweep", "sweep-models", "table")


def check_config(cfg):
    """The harness's own keys (the job keys are checked by the coordinator at submission);
    stops with one line naming the field."""
    def bad(field, why):
        raise SystemExit(f"experiment_fp8_table: config: {field}: {why}")
    sft = cfg.get("warm_start", {}).get("sft", {})
    if sft.get("target_accuracy") is not None:
        if not 0 < sft["target_accuracy"] <= 1:
            bad("warm_start.sft.target_accuracy", "must be in (0, 1]")
        if int(sft.get("extend_steps", 0)) < 1:
            bad("warm_start.sft.extend_steps", "must be >= 1 with target_accuracy")
        if int(sft.get("max_extensions", 0)) < 0:
            bad("warm_start.sft.max_extensions", "must be >= 0")
    early = cfg.get("analysis", {}).get("early_step")
    if early is not None:
        every = cfg["job"]["validation"]["every_steps"]
        steps = cfg["job"]["algorithm"]["steps"]
        if not 0 < early <= steps or (every and early % every and early != steps):
            bad("analysis.early_step", f"must be a validated step (a multiple of "
                f"job.validation.every_steps {every}, at most job.algorithm.steps {steps})")
    for p in cfg.get("phases", []):
        if p not in PHASES:
            bad("phases", f"unknown phase '{p}' ({', '.join(PHASES)})")


def run_main(args):
    global PUBLISH
    if not os.path.isfile(args.config):
        raise SystemExit(f"experiment_fp8_table: --config {args.config}: no such file")
    with open(args.config) as fh:
        cfg = yaml.safe_load(fh)
    check_config(cfg)
    out = args.out
    os.makedirs(os.path.join(out, "units"), exist_ok=True)
    with open(os.path.join(out, "config.yaml"), "w") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else cfg["seeds"]
    setups = args.setups.split(",") if args.setups else cfg["setups"]
    for s in setups:
        if s not in base.SETUPS:
            raise SystemExit(f"experiment_fp8_table: unknown setup '{s}' ({list(base.SETUPS)})")
    phases = args.only.split(",") if args.only else list(cfg.get("phases", PHASES))
    for p in phases:
        if p not in PHASES:
            raise SystemExit(f"experiment_fp8_table: --only: unknown phase '{p}' ({PHASES})")
    PUBLISH = Publisher(args.docs, cfg, args.commit)
    PUBLISH.config(os.path.join(out, "config.yaml"))
    cluster = Cluster(out, args.bin_dir, args.port_offset)

    def stop(signum, frame):
        raise SystemExit(f"experiment_fp8_table: signal {signum}, stopping")
    signal.signal(signal.SIGTERM, stop)
    try:
        data_unit(cfg, out)
        ws = cfg["warm_start"]
        sw = cfg.get("sweep", {})
        if "repro" in phases or "timing" in phases:
            first = repro_unit(cluster, cfg, out)
            if "timing" in phases:
                timing_unit(cluster, cfg, out, first["checkpoint"])
        if "sweep-models" in phases:
            # Each sweep model gets its own short BF16 SFT; no need for the warm start.
            for m in sw.get("models", []):
                s = sft_unit(cluster, cfg, out, f"sft-{m['label']}", m["model"], m["sft"],
                             ws["init_seed"])
                sweep_unit(cfg, out, args.bin_dir, f"sweep-{m['label']}", s["checkpoint"])
        if "sweep" in phases or "table" in phases:
            warm = chained_sft_unit(cluster, cfg, out, "warm-start", ws["model"], ws["sft"],
                                    ws["init_seed"], expect_sha256=ws.get("sha256"))
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


def paired_cell_holm(p, digits=3):
    cell = paired_cell(p, digits)
    return cell + (f", p_holm={p['p_t_holm']:.2f}" if "p_t_holm" in p else "")


def val_at(u, step):
    """A unit's held-out accuracy at `step` (None if it was not validated there)."""
    return next((v for s, v in u.get("val_accuracy", []) if int(s) == step), None)


def mean_val_after_start(u):
    """The pre-registered primary endpoint: the mean held-out accuracy over a unit's validation
    points after step 0 (the normalized area under its learning curve)."""
    xs = [v for s, v in u.get("val_accuracy", []) if int(s) > 0]
    return sum(xs) / len(xs) if xs else None


def step_seconds(u):
    """A unit's mean GRPO step time without validation (summaries of design 1 have only the
    step time with it)."""
    x = u.get("time_step_no_val_seconds")
    return x if x is not None else u.get("time_step_seconds")


def holm(pvals):
    """Holm step-down adjusted p-values (family-wise error over the comparisons), same order."""
    order = sorted(range(len(pvals)), key=lambda i: pvals[i])
    adj, running = [None] * len(pvals), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvals) - rank) * pvals[i]))
        adj[i] = running
    return adj


# The accuracy endpoints of the table: (key, label); the first is the primary one.
ENDPOINTS = [("primary", "PRIMARY: mean acc. over steps > 0"),
             ("early_accuracy", "acc. at step {early}"),
             ("final_accuracy", "final acc.")]


def build_report(units, meta):
    """Returns (markdown lines, aggregate dict) from the finished RL units. meta: setups, seeds
    and optionally early_step (the step of the secondary early-accuracy endpoint)."""
    ok = [u for u in units if u["state"] == "SUCCEEDED"]
    early = meta.get("early_step", 10)
    for u in ok:  # from the stored curve, so summaries written before the endpoints work too
        u["primary"] = mean_val_after_start(u)
        u["early_accuracy"] = val_at(u, early)
    setups = [s for s in meta["setups"] if any(u["setup"] == s for u in ok)]
    by = {(u["setup"], u["seed"]): u for u in ok}
    agg = {}
    for s in setups:
        us = [u for u in ok if u["setup"] == s]
        a = {"seeds": sorted(u["seed"] for u in us)}
        for k in ["start_accuracy", "primary", "early_accuracy", "final_accuracy",
                  "best_accuracy", *MISMATCH_KEYS, "time_step_seconds", "wall_seconds",
                  "response_length_mean"]:
            a[k] = st.mean_ci([u.get(k) for u in us])
        a["step_seconds"] = st.mean_ci([step_seconds(u) for u in us])
        if s != "bf16":
            common = sorted(seed for (x, seed) in by if x == s and ("bf16", seed) in by)
            a["paired_seeds"] = common
            for k in ("primary", "early_accuracy", "final_accuracy", "best_accuracy"):
                pairs = [(by[(s, x)].get(k), by[("bf16", x)].get(k)) for x in common]
                pairs = [(p, q) for p, q in pairs if p is not None and q is not None]
                a[f"{k}_vs_bf16"] = st.paired_compare([p for p, _ in pairs], [q for _, q in pairs])
            # Step-time ratio per seed (CPU emulation), then its mean and t interval.
            a["step_time_ratio_vs_bf16"] = st.mean_ci(
                [step_seconds(by[(s, x)]) / step_seconds(by[("bf16", x)])
                 for x in common if step_seconds(by[(s, x)]) and step_seconds(by[("bf16", x)])])
        agg[s] = a
    # Holm over the FP8 setups' primary comparisons (the pre-registered family).
    fam = [s for s in setups if s != "bf16" and agg[s]["primary_vs_bf16"]["n"] >= 2]
    for s, p in zip(fam, holm([agg[s]["primary_vs_bf16"]["p_t"] for s in fam])):
        agg[s]["primary_vs_bf16"]["p_t_holm"] = p
    labels = [lab.format(early=early) for _, lab in ENDPOINTS]
    L = ["Accuracy (greedy, held-out). Each cell: mean ± half-width of the 95% t interval over "
         "seeds; \"− BF16\" columns: the setup minus BF16 paired by seed.", "",
         "| setup | seeds | held-out acc. at step 0 | " + " | ".join(
             f"{lab} | − BF16, paired" for lab in labels) + " |",
         "|---|---|---|" + "---|---|" * len(labels)]
    for s in setups:
        a = agg[s]
        cells = []
        for k, _ in ENDPOINTS:
            cells.append(ci_cell(a[k]))
            cells.append("(reference)" if s == "bf16" else paired_cell_holm(a[f"{k}_vs_bf16"]))
        L.append(f"| {s} | {len(a['seeds'])} | {ci_cell(a['start_accuracy'])} | "
                 + " | ".join(cells) + " |")
    L += ["", "Mismatch between sampler and learner (each run's mean over its GRPO steps) and "
          "time per GRPO step. Step times are of the CPU reference path, FP8 emulated (CPU "
          "emulation: they say nothing about a GPU).", "",
          "| setup | token_mult_prob_error | gen_kl_error | sampling_importance_ratio "
          "| IS weights clipped | response length (tokens) | step time without validation (s) "
          "| step time / BF16 (CPU emulation) |",
          "|---|---|---|---|---|---|---|---|"]
    for s in setups:
        a = agg[s]
        L.append(f"| {s} | {ci_cell(a['token_mult_prob_error'], 5)} "
                 f"| {ci_cell(a['gen_kl_error'], 6)} | {ci_cell(a['sampling_importance_ratio'], 4)}"
                 f" | {ci_cell(a['is_oob_ratio'], 4)} | {ci_cell(a['response_length_mean'], 1)} "
                 f"| {ci_cell(a['step_seconds'], 1)} "
                 f"| {ci_cell(a['step_time_ratio_vs_bf16'], 2) if s != 'bf16' else '1'} |")
    return L, agg


def report_plots(units, setups, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [u for u in units if u["state"] == "SUCCEEDED"]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
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
    # Paired differences against BF16 (same seed) at each validation step.
    ax = axes[3]
    bf = {u["seed"]: dict((int(a), b) for a, b in u["val_accuracy"]) for u in ok
          if u["setup"] == "bf16"}
    for s in setups:
        if s == "bf16":
            continue
        diffs = {}
        for u in ok:
            if u["setup"] == s and u["seed"] in bf:
                for t, v in u["val_accuracy"]:
                    if int(t) in bf[u["seed"]]:
                        diffs.setdefault(int(t), []).append(v - bf[u["seed"]][int(t)])
        if not diffs:
            continue
        steps = sorted(diffs)
        cis = [st.mean_ci(diffs[t]) for t in steps]
        n = min(len(diffs[t]) for t in steps)
        ax.plot(steps, [c["mean"] for c in cis], color=SETUP_COLORS[s], label=f"{s} (n={n})")
        if n > 1:
            ax.fill_between(steps, [c["lo"] for c in cis], [c["hi"] for c in cis],
                            color=SETUP_COLORS[s], alpha=0.15)
    ax.axhline(0.0, color="tab:blue", lw=0.8)
    ax.set_title("held-out accuracy minus BF16, paired by seed\nmean, band = 95% t CI",
                 fontsize=9)
    ax.set_xlabel("GRPO step")
    ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "experiment-fp8-table.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_summary(out, name):
    f = os.path.join(out, "units", name, "summary.json")
    return read_json(f) if os.path.exists(f) else None


def copy_summaries(out, dst):
    """Every small unit summary (RL, SFT, sweep, repro, timing) into the repository."""
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(os.path.join(out, "units"))):
        s = load_summary(out, name)
        if s is None:
            continue
        rows_f = os.path.join(out, "units", name, "rows.json")
        if s.get("kind") == "sft" and "sft_loss" not in s and os.path.exists(rows_f):
            # The SFT loss the job reported (its step-0 row), for units summarized before the
            # summary carried it.
            s["sft_loss"] = next((r["metrics"]["sft_loss"] for r in read_json(rows_f)
                                  if "sft_loss" in r["metrics"]), None)
        write_json(os.path.join(dst, f"{name}.json"), s)


def report_head(cfg, out, n_finished, n_planned, complete_seeds, warm, repro, timing):
    job = cfg["job"]
    alg = job["algorithm"]
    ws = cfg["warm_start"]
    design = cfg.get("design", "design1-ceiling")
    partial = n_finished < n_planned
    head = [
        f"# FP8 precision table with confidence intervals ({design})"
        + (" (INCOMPLETE)" if partial else ""), "",
        f"<!-- Written by `scripts/experiment_fp8_table.py report --out {out}`; do not edit. -->",
        "",
        f"**{n_finished} of {n_planned} planned GRPO units finished** ({len(cfg['setups'])} "
        f"setups x seeds {cfg['seeds']}); {complete_seeds} seed(s) have all setups."]
    if complete_seeds < 5:
        head.append(
            "**The table is incomplete:** the design needs 5 paired seeds per setup; with "
            "fewer, the intervals are wide or missing (one seed has none) and no difference "
            "between setups is claimed from it.")
    head += [
        "", f"Design and pre-registered endpoint: [experiment-README.md](experiment-README.md). "
        f"Unit summaries: [experiment-runs/fp8-table/{design}/](experiment-runs/fp8-table/"
        f"{design}/).", "",
        f"Task: {cfg['data']['digits']}-digit addition with a worked one-line answer "
        f"(scripts/experiment_cot_data.py), reward 1 only for the exact derivation; "
        f"{job['validation']['num_prompts']} held-out prompts (greedy), validated every "
        f"{job['validation']['every_steps']} steps. Model: {ws['model']} (qwen3 architecture, "
        f"byte vocabulary). {alg['steps']} GRPO steps of {alg['prompts_per_step']} prompts x "
        f"{alg['samples_per_prompt']} samples, max {alg['max_new_tokens']} new tokens, lr "
        f"{alg['learning_rate']}. Every setup of a seed starts from the same warm start and "
        f"uses the same sampling seed (paired seeds)."]
    if repro:
        head.append(f"Reproducibility check: two {repro['sft_steps']}-step SFT jobs from the "
                    f"random init gave {'identical' if repro['identical'] else 'DIFFERENT'} "
                    f"weights ({repro['date']}).")
    if warm:
        parts = warm.get("part_accuracy")
        head.append(
            f"Warm start: BF16 SFT, {warm.get('sft_steps_total', ws['sft']['steps'])} steps"
            + (" in parts (cumulative steps, held-out accuracy on "
               f"{ws.get('val_prompts', 100)} prompts after each: "
               + ", ".join(f"{n}: {a:.3f}" for _, n, a in parts) + ")" if parts else "")
            + f"; weights sha256 `{warm.get('weights_sha256', 'not recorded')}`"
            + f"; {warm['wall_seconds'] / 60:.0f} min.")
    else:
        head.append("Warm start: not finished when this report was written.")
    if timing:
        head.append(
            f"Timing job ({timing['date']}, load {fnum(timing.get('load_avg_start'), 1)}): "
            f"{timing['steps']} BF16 GRPO steps from a 10-step SFT model, "
            f"{fnum(step_seconds(timing), 1)} s per step without validation, "
            f"{fnum(timing['time_validate_seconds'], 1)} s per "
            f"{job['validation']['num_prompts']}-prompt validation.")
    head += [
        "", "Paired cells: mean difference [95% t CI], two-sided paired t-test p (p_t) and "
        "exact sign-flip permutation p (p_flip; with n paired seeds it cannot go below "
        "2/2^n, e.g. 0.0625 for 5). The pre-registered test of the primary endpoint is the "
        "paired t-test, Holm-corrected over the three FP8 setups (p_holm).", ""]
    return head


def report_main(args):
    out = args.out
    if not os.path.isfile(os.path.join(out, "config.yaml")):
        raise SystemExit(f"experiment_fp8_table: report: {out} is not a run folder (no "
                         f"config.yaml)")
    cfg = yaml.safe_load(open(os.path.join(out, "config.yaml")))
    units = load_rl_units(out)
    planned = [(s, x) for x in cfg["seeds"] for s in cfg["setups"]]
    finished = [u for u in units if u["state"] == "SUCCEEDED"]
    done = {(u["setup"], u["seed"]) for u in finished}
    complete_seeds = sum(all((s, x) in done for s in cfg["setups"]) for x in cfg["seeds"])
    meta = {"setups": cfg["setups"], "seeds": cfg["seeds"],
            "early_step": cfg.get("analysis", {}).get("early_step", 10)}
    lines, agg = build_report(units, meta)
    os.makedirs(args.docs, exist_ok=True)
    rdir = runs_dir(args.docs, cfg)
    copy_summaries(out, rdir)
    shutil.copy(os.path.join(out, "config.yaml"), os.path.join(rdir, "config.yaml"))
    write_json(os.path.join(rdir, "aggregate.json"),
               {"planned_units": len(planned), "finished_units": len(finished),
                "complete_seeds": complete_seeds,
                "failed_units": [u["unit"] for u in units if u["state"] != "SUCCEEDED"],
                "aggregate": agg})
    if finished:
        report_plots(units, [s for s in cfg["setups"]], args.docs)
    warm, repro, timing = (load_summary(out, n) for n in ("warm-start", "repro", "timing"))
    head = report_head(cfg, out, len(finished), len(planned), complete_seeds, warm, repro,
                       timing)
    if not finished:
        lines = ["**No GRPO unit has finished yet, so there is no table.**", ""]
    tail = ["", "![curves](experiment-fp8-table.png)"] if finished else []
    tail += ["", "Units:", ""] if units else []
    for u in sorted(units, key=lambda u: (u["seed"], u["setup"])):
        tail.append(
            f"- {u['unit']}: {u['state']}, held-out {fnum(u.get('start_accuracy'))} -> "
            f"{fnum(u.get('final_accuracy'))} (curve "
            + ", ".join(f"{int(s)}: {v:.3f}" for s, v in u.get("val_accuracy", []))
            + f"), token_mult_prob_error {fnum(u.get('token_mult_prob_error'), 5)}, step "
            f"{fnum(step_seconds(u), 1)} s, wall {u['wall_seconds'] / 60:.0f} min, "
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


def restore_main(args):
    """Seeds a new run folder with the committed summaries of finished GRPO units (and of the
    timing job), so `run` on it skips them and rebuilds only the warm start, whose hash
    `warm_start.sha256` checks, and the missing units. SFT summaries are not restored (their
    checkpoints are gone), nor the repro check (it runs again on the new machine)."""
    if not os.path.isdir(args.runs):
        raise SystemExit(f"experiment_fp8_table: restore: --runs {args.runs}: no such folder")
    restored = []
    for f in sorted(os.listdir(args.runs)):
        if not f.endswith(".json") or f == "aggregate.json":
            continue
        s = read_json(os.path.join(args.runs, f))
        keep = (s.get("kind") == "rl" and s.get("state") == "SUCCEEDED") or \
            s.get("kind") == "timing"
        if keep:
            dst = os.path.join(args.out, "units", f[:-len(".json")], "summary.json")
            if os.path.exists(dst):
                raise SystemExit(f"experiment_fp8_table: restore: {dst} exists; use a new --out")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            write_json(dst, s)
            restored.append(f[:-len(".json")])
    print(f"restored {len(restored)} unit summaries into {args.out}: {' '.join(restored)}")
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
                   help="comma-separated phases: repro, timing, sweep (on the warm start), "
                        "sweep-models (their own SFT, then the sweep), table (default: the "
                        "config's `phases`, else all)")
    r.add_argument("--commit", action="store_true",
                   help="commit each finished unit's summary to the repository at once")
    r.add_argument("--docs", default=os.path.join(REPO, "docs/results"))
    r.add_argument("--port-offset", type=int, default=PORT_OFFSET,
                   help="ports of this invocation's local cluster (two concurrent invocations "
                        "need different offsets)")
    p = sub.add_parser("report", help="tables and plots from the finished units")
    p.add_argument("--out", required=True)
    p.add_argument("--docs", default=os.path.join(REPO, "docs/results"))
    rs = sub.add_parser("restore", help="seed a new run folder with committed GRPO summaries")
    rs.add_argument("--runs", required=True,
                    help="a committed runs folder, e.g. docs/results/experiment-runs/fp8-table/"
                         "design2")
    rs.add_argument("--out", required=True)
    args = ap.parse_args()
    return {"run": run_main, "report": report_main, "restore": restore_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
