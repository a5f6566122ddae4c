#!/usr/bin/env python3
"""System test (chaos, storage): the latest checkpoint of a running job is corrupted on disk and
the trainer killed, so the job must resume from a checkpoint it cannot read. On a local cluster
under `fp8rl up`: a reference job runs undisturbed; a second, identical job runs until it has
taken at least two checkpoints, then the trainer is stopped (nothing can be written), the
checkpoint the job store records as the job's latest is corrupted (its model.safetensors cut to
a random length, or its header overwritten, chosen by the seed) and the trainer SIGKILLed.
`fp8rl up` restarts it; the coordinator's resume cannot load the corrupt folder.

Checked: the job SUCCEEDS with metrics rows 0..N exactly once, equal to the reference's; the
coordinator says so in a log line, fp8rl_coordinator_checkpoint_fallbacks_total and a
checkpoint_fallback job event naming the corrupt folder (GET /v1/jobs/{id}/events); every
checkpoint folder left at the end loads (the corrupt one was written again).

The seed is printed; rerun one with FP8RL_CHAOS_SEED=<seed>."""

import os
import random
import re
import signal
import sqlite3
import time

import system_util as su
import test_chaos as chaos

chaos.STEPS = 12  # shorter jobs than test_chaos.py; its helpers read the module's STEPS


def recorded_checkpoint(cluster, job_id):
    """(path, step) of the job's latest checkpoint as the coordinator's job store has it."""
    db = os.path.join(cluster.data_dir, "coordinator", "jobs.db")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        row = conn.execute("SELECT checkpoint, checkpoint_step FROM jobs WHERE id = ?",
                           (job_id,)).fetchone()
    su.check(row is not None, f"job {job_id} not in {db}")
    return row


def corrupt(path, rng):
    """Damages <path>/model.safetensors as a torn write or bad media would; says how."""
    target = os.path.join(path, "model.safetensors")
    size = os.path.getsize(target)
    if rng.random() < 0.5:
        cut = rng.randrange(8, size // 2)
        os.truncate(target, cut)
        return f"model.safetensors cut from {size} to {cut} bytes"
    with open(target, "r+b") as f:
        f.seek(8)  # the JSON header after its 8-byte length
        f.write(bytes(rng.randrange(256) for _ in range(64)))
    return "model.safetensors header overwritten with 64 random bytes"


def fallback_count(cluster):
    status, text = su.http_quiet("GET", f"{cluster.rest}/metrics")
    su.check(status == 200, f"/metrics: {status}")
    m = re.search(r"^fp8rl_coordinator_checkpoint_fallbacks_total (\S+)$", text, re.M)
    su.check(m is not None, "no fp8rl_coordinator_checkpoint_fallbacks_total in /metrics")
    return float(m.group(1))


def body(clusters):
    su.require_binaries()
    seed = int(os.environ.get("FP8RL_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    su.log(f"checkpoint fallback seed {seed} (rerun with FP8RL_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    cluster = su.Cluster(workers=chaos.WORKERS)
    clusters.append(cluster)
    cluster.wait_up()

    reference_id = chaos.submit(cluster, "reference")
    job = chaos.wait_done(cluster, reference_id, timeout=300)
    su.check(job["state"] == "SUCCEEDED", f"reference job: {job['state']} {job.get('error')}")
    reference = chaos.rows_of(cluster, reference_id)

    job_id = chaos.submit(cluster, "corrupt")
    # At least two checkpoints (so there is a previous one), then a random moment.
    min_step = 2 * 3 + rng.randrange(0, 3)
    deadline = time.time() + 300
    while True:
        status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        if status == 200 and job["step"] >= min_step:
            break
        su.check(status != 200 or job["state"] in ("QUEUED", "RUNNING"),
                 f"job ended before step {min_step}: {job}")
        su.check(time.time() < deadline, f"job did not reach step {min_step}")
        time.sleep(0.2)
    pid = chaos.read_pids(cluster)["trainer"]
    os.kill(pid, signal.SIGSTOP)  # nothing is written from here on
    time.sleep(0.5)  # a save that returned just before the stop is recorded by now
    path, step = recorded_checkpoint(cluster, job_id)
    su.check(path and step >= 6, f"recorded checkpoint {path!r} (step {step}), want >= 6")
    how = corrupt(path, rng)
    os.kill(pid, signal.SIGKILL)
    su.log(f"  job {job_id} at step {job['step']}: trainer stopped, {path} corrupted ({how}), "
           "trainer killed")

    job = chaos.wait_done(cluster, job_id, timeout=400)
    su.check(job["state"] == "SUCCEEDED",
             f"job {job_id} ended {job['state']} (seed {seed}): {job.get('error')}")
    chaos.check_same_rows(job_id, chaos.rows_of(cluster, job_id), reference)
    n = chaos.check_checkpoints(cluster, job_id, "corrupt")
    su.log(f"job {job_id}: SUCCEEDED, rows 0..{chaos.STEPS} equal the reference, {n} "
           "checkpoints readable")

    status, events = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/events")
    su.check(status == 200, f"GET events: {status} {events}")
    fallbacks = [e for e in events["events"] if e["kind"] == "checkpoint_fallback"]
    su.log(f"  events: {[(e['kind'], e['message'][:160]) for e in events['events']]}")
    su.check(len(fallbacks) == 1 and f"'{path}' unreadable" in fallbacks[0]["message"],
             f"want one checkpoint_fallback event naming {path}: {events}")
    su.check(f"step-{step - 3}'" in fallbacks[0]["message"],
             f"the fallback is not the previous checkpoint (step {step - 3}): {fallbacks[0]}")
    su.check(fallback_count(cluster) == 1, "fallback not counted in /metrics")
    log = cluster.log_of("coordinator")
    su.check("checkpoint unreadable; falling back to the previous one" in log and path in log,
             "no log line for the checkpoint fallback")
    cluster.pids = chaos.read_pids(cluster)
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(body)
