#!/usr/bin/env python3
"""System test: SIGKILL a generation worker in the middle of a job. The job must still SUCCEED
on the remaining worker with a metrics row for every step; `fp8rl up` reports the dead worker,
keeps running, and later stops cleanly."""

import os
import signal
import time

import system_util as su

STEPS = 30  # a smoke RL step takes ~0.15 s and the job is polled every 0.5 s


def body(clusters):
    su.require_binaries()
    cluster = su.Cluster(workers=2)
    clusters.append(cluster)
    cluster.wait_up()
    config = su.smoke_config(cluster.tmp, steps=STEPS)
    config["checkpoint"]["every_steps"] = 0
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    job_id = reply["id"]
    victim = "generation-worker-1"
    pid = cluster.pids[victim]
    killed = {}

    def kill_once(job):
        # Kill after the first RL step, while the loop is busy with the next ones.
        if not killed and job["state"] == "RUNNING" and job.get("step", 0) >= 1:
            os.kill(pid, signal.SIGKILL)
            killed["at_step"] = job["step"]
            killed["time"] = time.time()
            su.log(f"  SIGKILL {victim} (pid {pid}) at step {job['step']}")

    job = su.wait_job(cluster, job_id, timeout=160, on_poll=kill_once)
    su.check(killed, f"the job finished before a worker could be killed (state {job['state']})")
    su.check(job["state"] == "SUCCEEDED",
             f"job ended {job['state']} after losing a worker: {job.get('error')}")
    su.check(killed["at_step"] < STEPS, "worker killed only after the last step")
    status, metrics = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
    su.check(status == 200, f"metrics: {status}")
    su.check([r["step"] for r in metrics["steps"]] == list(range(STEPS + 1)),
             f"metrics rows {[r['step'] for r in metrics['steps']]}")
    su.log(f"  job SUCCEEDED {time.time() - killed['time']:.1f} s after the kill")
    su.check(not su.pid_alive(pid), "killed worker still alive")
    su.check(cluster.proc.poll() is None, "fp8rl up exited after losing one worker")
    # Give the launcher's supervision loop a moment, then check it reported the death.
    deadline = time.time() + 5
    while time.time() < deadline and "generation-worker-1 killed by signal 9" not in cluster.text():
        time.sleep(0.2)
    su.check("generation-worker-1 killed by signal 9" in cluster.text(),
             "fp8rl up did not report the killed worker")
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(body)
