#!/usr/bin/env python3
"""System test: SIGKILL the trainer, then the coordinator, then the weight-sync service, each in
the middle of a job on a local cluster started with `fp8rl up`. The launcher restarts each; the
coordinator resumes the job from its last checkpoint once the new trainer is up (after its own
restart: from the job store; after a weight-sync restart: when a publish fails or a version
reaches no worker). Every job SUCCEEDS with exactly one metrics row per step, nothing is lost,
and the cluster stops cleanly afterwards."""

import json
import os
import signal
import time

import system_util as su

STEPS = 8


def read_pids(cluster):
    with open(os.path.join(cluster.data_dir, "cluster.json")) as f:
        return {s["name"]: s["pid"] for s in json.load(f)["services"]}


def wait_restarted(cluster, name, old_pid, timeout=60):
    """The new pid of `name` once `fp8rl up` restarted it and it answers /healthz."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            pid = read_pids(cluster).get(name)
        except (OSError, ValueError):
            pid = None  # cluster.json being replaced
        if pid and pid != old_pid and su.pid_alive(pid):
            port = cluster.service(name)["http_port"]
            status, _ = su.http_quiet("GET", f"http://127.0.0.1:{port}/healthz")
            if status == 200:
                return pid
        time.sleep(0.2)
    su.fail(f"{name} was not restarted within {timeout} s:\n{cluster.text()}")


def submit(cluster, tag):
    config = su.smoke_config(os.path.join(cluster.tmp, tag), steps=STEPS)
    config["checkpoint"]["every_steps"] = 2
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    return reply["id"]


def kill_mid_job(cluster, job_id, name, at_step):
    """Waits until the job recorded `at_step` (after the step-2 checkpoint), SIGKILLs `name`,
    and returns (its old pid, the step it was killed at)."""
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
        time.sleep(0.2)
    su.fail(f"job {job_id} never reached step {at_step}")


def check_rows(cluster, job_id):
    status, metrics = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
    su.check(status == 200, f"metrics: {status}")
    steps = [r["step"] for r in metrics["steps"]]
    su.check(steps == list(range(STEPS + 1)), f"metrics rows {steps}")
    su.check("val_accuracy" in metrics["steps"][0]["metrics"], "row 0 lacks val_accuracy")
    su.check("val_accuracy" in metrics["steps"][STEPS]["metrics"], "last row lacks val_accuracy")


def wait_job_through_restarts(cluster, job_id, timeout=150):
    """Like su.wait_job, but the coordinator may be unreachable for a while (restarting)."""
    deadline = time.time() + timeout
    phases = set()
    while time.time() < deadline:
        status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        if status == 200:
            if job.get("progress"):
                phases.add(job["progress"]["phase"])
            if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return job, phases
        time.sleep(0.3)
    su.fail(f"job {job_id} not finished within {timeout} s:\n{cluster.text()}")


def body(clusters):
    su.require_binaries()
    cluster = su.Cluster(workers=2)
    clusters.append(cluster)
    cluster.wait_up()

    # 1. The trainer dies after the step-2 checkpoint; the launcher brings it back and the job
    #    resumes from the checkpoint instead of failing.
    job_id = submit(cluster, "job1")
    old_pid, killed_at = kill_mid_job(cluster, job_id, "trainer", at_step=3)
    start = time.time()
    new_pid = wait_restarted(cluster, "trainer", old_pid)
    su.log(f"  trainer back as pid {new_pid} after {time.time() - start:.1f} s")
    job, phases = wait_job_through_restarts(cluster, job_id)
    su.check(job["state"] == "SUCCEEDED",
             f"job ended {job['state']} after the trainer was killed: {job.get('error')}")
    su.check(killed_at < STEPS, "trainer killed only after the last step")
    check_rows(cluster, job_id)
    coordinator_log = cluster.log_of("coordinator")
    su.check("resuming job after trainer loss" in coordinator_log,
             "coordinator log does not show the resume after the trainer loss")
    su.check(f"job={job_id} from_step=" in coordinator_log.replace('"', ""),
             "coordinator did not resume from a checkpoint")
    su.check(not su.pid_alive(old_pid), "killed trainer still alive")
    status, text = su.http("GET", f"{cluster.rest}/metrics")
    resumes = [float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("fp8rl_coordinator_job_resumes_total")]
    su.check(resumes and resumes[0] >= 1, f"fp8rl_coordinator_job_resumes_total: {resumes}")

    # 2. The coordinator dies mid-job; restarted, it resumes the RUNNING job from its store and
    #    last checkpoint, and the workers register with it again.
    job2 = submit(cluster, "job2")
    old_coordinator, _ = kill_mid_job(cluster, job2, "coordinator", at_step=3)
    wait_restarted(cluster, "coordinator", old_coordinator)
    job, _ = wait_job_through_restarts(cluster, job2)
    su.check(job["state"] == "SUCCEEDED",
             f"job ended {job['state']} after the coordinator was killed: {job.get('error')}")
    check_rows(cluster, job2)
    status, jobs = su.http("GET", f"{cluster.rest}/v1/jobs")
    su.check(status == 200 and {j["id"] for j in jobs["jobs"]} >= {job_id, job2},
             f"a job was lost across the coordinator restart: {jobs}")

    # 3. Weight sync dies mid-job: it comes back empty, the workers subscribe again, and the job
    #    goes on (a publish that failed or a version lost on its way resumes from the checkpoint).
    job3 = submit(cluster, "job3")
    old_sync, _ = kill_mid_job(cluster, job3, "weight-sync", at_step=3)
    wait_restarted(cluster, "weight-sync", old_sync)
    job, _ = wait_job_through_restarts(cluster, job3, timeout=200)
    su.check(job["state"] == "SUCCEEDED",
             f"job ended {job['state']} after weight sync was killed: {job.get('error')}")
    check_rows(cluster, job3)

    su.check(cluster.proc.poll() is None, "fp8rl up exited after restarting services")
    cluster.pids = read_pids(cluster)  # the restarted children must stop too
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(body)
