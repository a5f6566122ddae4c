#!/usr/bin/env python3
"""System test: a trainer group of 2 under `trainer.shard: grads_optimizer` (ZeRO-2) and under
`trainer.shard: params` (ZeRO-3: the working weights sharded too and gathered unit by unit;
docs/design/sharding.md) on one `fp8rl up --trainers 2` cluster, against the same job with
`trainer.shard: none`. With 2 ranks the sharded update equals the unsharded one bit for bit (the
reduce-scatter's rank-order sum a + b equals the all-reduce's b + a; the clip norm is summed in
one trainer's order; ZeRO-3 computes with the same working weights), so the three jobs must agree
exactly: every metrics row's training values and every step's checkpointed weights, byte for
byte. The sharded jobs' checkpoints hold one optimizer file per rank and a manifest
(optimizer_shards/), the unsharded job's one optimizer.safetensors. Then a rank of a ZeRO-3 group
is SIGKILLed mid-job: the group forms again, each rank restores its optimizer shard from the last
checkpoint and shards its working weights again, and the job SUCCEEDS with rows 0..N exactly
once.

The job keeps the settings of test_trainer_group.py (BF16 training, a short SFT warm start, no
format reward), so what differs between the two jobs can only come from the shard mode."""

import json
import os

import system_util as su

STEPS = 3
KILL_STEPS = 40
# Row values that measure time or payload size (the sharded group moves other bytes) or count
# weight versions (shared by the jobs of one cluster: the second job starts above the first); the
# rest must be equal.
NOT_COMPARED = ("seconds", "bytes", "time", "per_s", "wait", "version")


def submit(cluster, tag, shard, every_steps=1, steps=STEPS):
    config = su.smoke_config(os.path.join(cluster.tmp, tag), steps=steps)
    config["checkpoint"]["every_steps"] = every_steps
    config["trainer"] = {"data_parallel": 2, "shard": shard}
    config["precision"]["training"] = "bf16"
    config["sft"]["steps"] = 5
    config["task"]["format_reward"] = 0.0
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST /v1/jobs ({shard}): {status} {reply}")
    return reply["id"], config


def checkpoint_dir(config, job_id, step):
    return os.path.join(config["checkpoint"]["dir"], job_id, f"step-{step}")


def run_job(cluster, shard):
    job_id, config = submit(cluster, f"shard-{shard}", shard)
    job = su.wait_job(cluster, job_id, timeout=300)
    su.check(job["state"] == "SUCCEEDED",
             f"trainer.shard {shard}: job ended {job['state']}: {job.get('error')}")
    return job_id, config, su.metrics_rows(cluster, job_id, STEPS)


def body(clusters):
    su.require_binaries()
    cluster = su.Cluster(workers=2, trainers=2)
    clusters.append(cluster)
    cluster.wait_up(timeout=180)

    # A mode that does not exist is refused at submit, naming the key.
    config = su.smoke_config(os.path.join(cluster.tmp, "bad"))
    config["trainer"] = {"data_parallel": 2, "shard": "zero2"}
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 400 and "trainer.shard" in json.dumps(reply),
             f"shard zero2: {status} {reply}")

    plain_id, plain_config, plain_rows = run_job(cluster, "none")
    for mode in ("grads_optimizer", "params"):
        check_mode(cluster, mode, plain_id, plain_config, plain_rows)

    # A rank of a ZeRO-3 group dies mid-job: the job resumes from its sharded checkpoint.
    job_id, _ = submit(cluster, "shard-kill", "params", every_steps=5, steps=KILL_STEPS)
    su.kill_at_step(cluster, job_id, "trainer-1", 12)
    job = su.wait_job(cluster, job_id, timeout=300)
    su.check(job["state"] == "SUCCEEDED",
             f"job ended {job['state']} after a sharded rank was killed: {job.get('error')}")
    su.metrics_rows(cluster, job_id, KILL_STEPS)
    su.check("resuming job after trainer loss" in cluster.log_of("coordinator"),
             "coordinator log does not show the resume after losing a rank")
    cluster.stop()


def check_mode(cluster, mode, plain_id, plain_config, plain_rows):
    """The job under `mode` equals the unsharded job: rows and checkpointed weights."""
    shard_id, shard_config, shard_rows = run_job(cluster, mode)
    compared = 0
    for step in range(STEPS + 1):
        a, b = plain_rows[step], shard_rows[step]
        for key, value in a.items():
            if any(word in key for word in NOT_COMPARED) or not isinstance(value, (int, float)):
                continue
            su.check(key in b, f"{mode} step {step}: the sharded row lacks {key}")
            su.check(b[key] == value,
                     f"{mode} step {step} {key}: sharded {b[key]} vs unsharded {value}")
            compared += 1
    su.check(all(k in shard_rows[1] for k in ("loss", "grad_norm", "train_tokens")),
             f"rows lack training values: {sorted(shard_rows[1])}")
    su.log(f"  {mode}: {compared} row values equal across {STEPS + 1} rows")
    for step in range(1, STEPS + 1):
        plain_dir = checkpoint_dir(plain_config, plain_id, step)
        shard_dir = checkpoint_dir(shard_config, shard_id, step)
        with open(os.path.join(plain_dir, "model.safetensors"), "rb") as f:
            plain_weights = f.read()
        with open(os.path.join(shard_dir, "model.safetensors"), "rb") as f:
            shard_weights = f.read()
        su.check(plain_weights == shard_weights,
                 f"{mode} step {step}: checkpointed weights differ from the unsharded job's")
        su.check(os.path.exists(os.path.join(plain_dir, "optimizer.safetensors")),
                 f"step {step}: unsharded checkpoint lacks optimizer.safetensors")
        shards = os.path.join(shard_dir, "optimizer_shards")
        names = sorted(os.listdir(shards))
        su.check(names == ["manifest.json", "rank-0-of-2.safetensors", "rank-1-of-2.safetensors"],
                 f"step {step}: optimizer_shards holds {names}")
        with open(os.path.join(shards, "manifest.json")) as f:
            manifest = json.load(f)
        su.check(manifest["ranks"] == 2 and manifest["bounds"][0] == 0
                 and 0 < manifest["bounds"][1] < manifest["bounds"][2],
                 f"step {step}: manifest {manifest}")
    su.log(f"  {mode}: checkpoints of steps 1..{STEPS}: weights byte-identical, optimizer in 2 "
           "shards")


if __name__ == "__main__":
    su.main_guard(body)
