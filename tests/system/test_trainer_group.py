#!/usr/bin/env python3
"""System test: data-parallel trainer groups on Gloo over loopback (docs/design/training.md "Trainer
groups"). One `fp8rl up --trainers 3` cluster runs the same job (same seeds) with
trainer.data_parallel 1, 2 and 3; every job SUCCEEDS with rows 0..N, the training metrics of every
step agree across group sizes and so do the checkpointed weights after every step. Then a rank of a
group of 2 is SIGKILLed mid-job: the group is formed again once the launcher restarted it, the job
resumes from its last checkpoint and SUCCEEDS with rows 0..N exactly once.

Tolerances. A group changes only the order of float32 summations (each rank sums its share of the
per-token gradient terms, then the ranks' sums are added). The unit test
(tests/unit/train/data_parallel_test.cc) bounds the effect on one update; here it compounds over
the SFT warm start and the RL steps and can reach the rollouts: a weight that moved by 1e-7 may
flip one FP8 code of the published weights and so one sampled token. The checks therefore are:
  - weights: max |w_N - w_1| <= 2 * lr_max * updates (AdamW moves an element by at most ~lr per
    update, so two runs that differ only by rounding cannot drift further), and the relative L2
    difference ||w_N - w_1|| / ||w_1|| <= WEIGHT_REL_TOL;
  - metrics rows: loss, grad_norm and train_tokens of every step within METRIC_REL_TOL relative
    (absolute for values below 1).
The measured differences are printed, so a change that loosens them is visible."""

import json
import os
import struct

import numpy as np

import system_util as su

STEPS = 3
KILL_STEPS = 60  # the kill job: long enough (a smoke step takes ~0.15 s) to kill a rank mid-job
WEIGHT_REL_TOL = 1e-4
METRIC_REL_TOL = 5e-2
METRIC_KEYS = ["loss", "grad_norm", "train_tokens"]


def read_safetensors(path):
    """name -> float32 array of an F32 safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=np.float32)
    return out


def submit(cluster, tag, data_parallel, every_steps=1, steps=STEPS):
    config = su.smoke_config(os.path.join(cluster.tmp, tag), steps=steps)
    config["checkpoint"]["every_steps"] = every_steps
    config["trainer"] = {"data_parallel": data_parallel}
    # BF16 training: a group then differs from one trainer by summation order only. (FP8 training
    # also changes the token blocks of the backward's quantization scales; its larger, measured
    # noise is checked in tests/unit/train/data_parallel_test.cc.)
    config["precision"]["training"] = "bf16"
    # The smoke job's SFT warm start and format reward make its GRPO groups' rewards differ, so the
    # RL steps move the weights; but a group's weights differ from one trainer's by rounding, and
    # the FP8 rollouts then sample different tokens, so two runs train on different batches and
    # their RL rows cannot be compared. Here the warm start stays short and answers earn nothing
    # for format: every GRPO group has equal rewards, the RL steps leave the weights as they are,
    # and what is compared is the SFT warm start (real gradients, every step) carried through the
    # RL loop, publishing and checkpoints. The RL update with nonzero advantages in a group is
    # compared in tests/unit/train/data_parallel_test.cc, on identical batches.
    config["sft"]["steps"] = 5
    config["task"]["format_reward"] = 0.0
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    return reply["id"], config


def checkpoint_weights(config, job_id, step):
    path = os.path.join(config["checkpoint"]["dir"], job_id, f"step-{step}", "model.safetensors")
    su.check(os.path.exists(path), f"no checkpoint {path}")
    return read_safetensors(path)


def run_job(cluster, data_parallel):
    job_id, config = submit(cluster, f"dp{data_parallel}", data_parallel)
    job = su.wait_job(cluster, job_id, timeout=300)
    su.check(job["state"] == "SUCCEEDED",
             f"data_parallel {data_parallel}: job ended {job['state']}: {job.get('error')}")
    return job_id, config, su.metrics_rows(cluster, job_id, STEPS)


def compare(alone, group, size, lr_max, updates_per_step):
    job1, config1, rows1 = alone
    jobn, confign, rowsn = group
    for step in range(1, STEPS + 1):
        for key in METRIC_KEYS:
            a, b = rows1[step].get(key), rowsn[step].get(key)
            su.check(a is not None and b is not None, f"step {step} lacks {key}")
            diff = abs(a - b)
            su.log(f"  dp={size} step {step} {key}: {b:.6g} vs {a:.6g} (diff {diff:.3g})")
            su.check(diff <= METRIC_REL_TOL * max(1.0, abs(a)),
                     f"dp={size} step {step} {key}: {b} vs {a}")
        w1 = checkpoint_weights(config1, job1, step)
        wn = checkpoint_weights(confign, jobn, step)
        su.check(w1.keys() == wn.keys(), "checkpoints hold different tensors")
        num = sum(float(np.sum((wn[k].astype(np.float64) - w1[k]) ** 2)) for k in w1)
        den = sum(float(np.sum(w1[k].astype(np.float64) ** 2)) for k in w1)
        max_abs = max(float(np.max(np.abs(wn[k] - w1[k]))) for k in w1)
        rel = (num / den) ** 0.5
        bound = 2 * lr_max * updates_per_step * step
        su.log(f"  dp={size} step {step} weights: rel L2 {rel:.3g}, max |diff| {max_abs:.3g} "
               f"(bounds {WEIGHT_REL_TOL:g}, {bound:.3g})")
        su.check(rel <= WEIGHT_REL_TOL, f"dp={size} step {step}: weights rel L2 diff {rel}")
        su.check(max_abs <= bound, f"dp={size} step {step}: weights max diff {max_abs} > {bound}")


def body(clusters):
    su.require_binaries()
    cluster = su.Cluster(workers=2, trainers=3)
    clusters.append(cluster)
    cluster.wait_up(timeout=180)

    results = {size: run_job(cluster, size) for size in (1, 2, 3)}
    config = results[1][1]
    # The SFT warm start's lr is the largest; the smoke job's updates: SFT steps before step 1
    # (their checkpoints are not compared), `minibatches` per RL step.
    lr_max = max(config["algorithm"]["learning_rate"], config["sft"]["learning_rate"])
    updates = config["algorithm"]["minibatches"] + config["sft"]["steps"]
    for size in (2, 3):
        compare(results[1], results[size], size, lr_max, updates)
    trainer_log = cluster.log_of("trainer-2")
    su.check("joined trainer group" in trainer_log, "trainer-2 never joined a group")

    # A rank of a group of 2 dies mid-job: the group is formed again, the job resumes.
    job_id, _ = submit(cluster, "kill", 2, every_steps=5, steps=KILL_STEPS)
    su.kill_at_step(cluster, job_id, "trainer-1", 12)
    job = su.wait_job(cluster, job_id, timeout=300)
    su.check(job["state"] == "SUCCEEDED",
             f"job ended {job['state']} after a group rank was killed: {job.get('error')}")
    su.metrics_rows(cluster, job_id, KILL_STEPS)
    coordinator_log = cluster.log_of("coordinator")
    su.check("resuming job after trainer loss" in coordinator_log,
             "coordinator log does not show the resume after losing a rank")
    cluster.stop()


if __name__ == "__main__":
    su.main_guard(body)
