#!/usr/bin/env python3
"""System test: asynchronous RL (algorithm.max_staleness: 2) on a local cluster under `fp8rl up`.
Three jobs: one undisturbed, one losing a generation worker (SIGKILL) mid-job, one losing the
trainer (SIGKILL; the launcher restarts it and the job resumes from its step-2 checkpoint). Each
must SUCCEED with metrics rows 0..N exactly once, every step's staleness histogram summing to
the batch size and no trained sample more than 2 versions behind."""

import os
import signal
import time

import system_util as su
from test_kill_trainer import read_pids, wait_job_through_restarts, wait_restarted

STEPS = 8
K = 2


def submit(cluster, tag):
    config = su.smoke_config(os.path.join(cluster.tmp, tag), steps=STEPS)
    config["algorithm"]["max_staleness"] = K
    config["checkpoint"]["every_steps"] = 2
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    batch = config["algorithm"]["prompts_per_step"] * config["algorithm"]["samples_per_prompt"]
    return reply["id"], batch


def check_rows(cluster, job_id, batch):
    status, metrics = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
    su.check(status == 200, f"metrics: {status}")
    rows = metrics["steps"]
    su.check([r["step"] for r in rows] == list(range(STEPS + 1)),
             f"metrics rows {[r['step'] for r in rows]}")
    histogram = [0] * (K + 1)
    for row in rows[1:]:
        m = row["metrics"]
        su.check(m.get("max_staleness") == K, f"step {row['step']}: max_staleness {m}")
        su.check(m["staleness_max"] <= K, f"step {row['step']}: staleness_max {m['staleness_max']}")
        buckets = [m[f"samples_staleness_{k}"] for k in range(K + 1)]
        su.check(f"samples_staleness_{K + 1}" not in m, f"step {row['step']}: bucket above K")
        su.check(sum(buckets) == batch, f"step {row['step']}: histogram {buckets} != {batch}")
        for k in range(K + 1):
            histogram[k] += buckets[k]
    return histogram


def kill_at_step(cluster, job_id, name, at_step):
    deadline = time.time() + 120
    while time.time() < deadline:
        status, job = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        su.check(status == 200, f"GET job: {status} {job}")
        su.check(job["state"] in ("QUEUED", "RUNNING"), f"job ended early: {job}")
        if job["step"] >= at_step:
            pid = read_pids(cluster)[name]
            os.kill(pid, signal.SIGKILL)
            su.log(f"  SIGKILL {name} (pid {pid}) at step {job['step']}")
            return pid, job["step"]
        time.sleep(0.1)
    su.fail(f"job {job_id} never reached step {at_step}")


def body(clusters):
    su.require_binaries()
    cluster = su.Cluster(workers=2)
    clusters.append(cluster)
    cluster.wait_up()

    # 1. Undisturbed.
    job_id, batch = submit(cluster, "job1")
    job = su.wait_job(cluster, job_id, timeout=150)
    su.check(job["state"] == "SUCCEEDED", f"async job ended {job['state']}: {job.get('error')}")
    histogram = check_rows(cluster, job_id, batch)
    su.log(f"  staleness histogram over {STEPS} steps (0..{K}): {histogram}")
    su.check(sum(histogram[1:]) > 0, "no sample was generated ahead: nothing ran asynchronously")
    status, text = su.http("GET", f"{cluster.rest}/metrics")
    count = [float(line.split()[-1]) for line in text.splitlines()
             if line.startswith("fp8rl_rl_sample_staleness_count")]
    su.check(count and count[0] == STEPS * batch, f"fp8rl_rl_sample_staleness_count {count}")
    log = cluster.log_of("coordinator")
    su.check("asynchronous RL" in log, "coordinator log does not show the asynchronous mode")

    # 2. A generation worker dies mid-job: its unfinished samples go to the other one.
    job2, _ = submit(cluster, "job2")
    kill_at_step(cluster, job2, "generation-worker-1", at_step=2)
    job, _ = wait_job_through_restarts(cluster, job2)
    su.check(job["state"] == "SUCCEEDED",
             f"async job ended {job['state']} after losing a worker: {job.get('error')}")
    check_rows(cluster, job2, batch)

    # 3. The trainer dies after the step-2 checkpoint: the job resumes from it; the rollouts made
    #    ahead are dropped and generated again, every row once.
    job3, _ = submit(cluster, "job3")
    old_pid, _ = kill_at_step(cluster, job3, "trainer", at_step=3)
    wait_restarted(cluster, "trainer", old_pid)
    job, _ = wait_job_through_restarts(cluster, job3)
    su.check(job["state"] == "SUCCEEDED",
             f"async job ended {job['state']} after the trainer was killed: {job.get('error')}")
    check_rows(cluster, job3, batch)
    su.check("resuming job after trainer loss" in cluster.log_of("coordinator"),
             "coordinator log does not show the resume after the trainer loss")

    su.check(cluster.proc.poll() is None, "fp8rl up exited after restarting services")
    cluster.pids = read_pids(cluster)
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(body)
