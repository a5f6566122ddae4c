#!/usr/bin/env python3
"""System test (storage): a job's checkpoint.dir is a 1 MiB tmpfs, too small for one checkpoint
of the smoke model, so the trainer's first SaveCheckpoint fails with ENOSPC. On a local cluster
under `fp8rl up`: the job must end FAILED (not hang, not SUCCEED) with an error that names the
checkpoint step and the full disk; the rows recorded before the failure stay (rows 0..N-1 of a
checkpoint at step N), no partial checkpoint folder is left, and the cluster keeps serving: a
second job with its checkpoints on ordinary disk SUCCEEDS.

Then a coordinator (no workers) whose job store lies on a 2 MiB tmpfs that is filled up: a
submission answers 503 naming the job store and the full disk (UNAVAILABLE: nothing was
written, the same call works once there is room), the jobs stored before stay listed, and after
space is freed a submission is accepted again.

Needs root (mount -t tmpfs); skipped with a message otherwise."""

import os
import subprocess
import time

import system_util as su


def mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        print("SKIP: mounting a tmpfs needs root", flush=True)
        raise SystemExit(su.SKIP)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(f"SKIP: mount -t tmpfs not permitted here: {p.stderr.strip()}", flush=True)
        raise SystemExit(su.SKIP)


def check_full_job_store(tmp):
    store = os.path.join(tmp, "store")
    mount_tmpfs(store, "2m")
    proc = None
    try:
        offset = su.free_port_offset(workers=0)
        rest = f"http://127.0.0.1:{8080 + offset}"
        log = open(os.path.join(tmp, "store-coordinator.log"), "w")
        proc = subprocess.Popen(
            [os.path.join(su.BIN_DIR, "fp8rl-coordinator"), "--listen-host", "127.0.0.1",
             "--http-port", str(8080 + offset), "--grpc-port", str(50051 + offset),
             "--data-dir", store, "--data-root", tmp, "--worker-wait-seconds", "600"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while su.http_quiet("GET", f"{rest}/healthz")[0] != 200:
            su.check(proc.poll() is None and time.time() < deadline, "coordinator not up")
            time.sleep(0.2)
        config = su.smoke_config(tmp)
        status, first = su.http("POST", f"{rest}/v1/jobs", config)
        su.check(status == 201, f"submit before the disk is full: {status} {first}")
        filler = os.path.join(store, "filler")
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        answers = [su.http("POST", f"{rest}/v1/jobs", config) for _ in range(20)]
        su.log(f"  submit on a full job-store disk: {answers[-1]}")
        su.check(all(a[0] == 503 for a in answers[-5:]),
                 f"expected 503 once the disk is full: {[a[0] for a in answers]}")
        su.check("job store: database or disk is full (nothing was written)" in
                 answers[-1][1]["error"], f"unclear error: {answers[-1]}")
        status, listing = su.http("GET", f"{rest}/v1/jobs")
        su.check(status == 200 and first["id"] in [j["id"] for j in listing["jobs"]],
                 f"the job stored before is gone: {status} {listing}")
        os.remove(filler)
        status, reply = su.http("POST", f"{rest}/v1/jobs", config)
        su.check(status == 201, f"submit after freeing space: {status} {reply}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        subprocess.run(["umount", "-l", store], capture_output=True)


def body(clusters):
    su.require_binaries()
    cluster = su.Cluster(workers=1)
    clusters.append(cluster)
    full = os.path.join(cluster.tmp, "full")
    mount_tmpfs(full, "1m")
    try:
        cluster.wait_up()
        config = su.smoke_config(cluster.tmp)
        config["checkpoint"]["dir"] = os.path.join(full, "checkpoints")
        every = config["checkpoint"]["every_steps"]
        status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
        su.check(status == 201, f"submit: {status} {reply}")
        job = su.wait_job(cluster, reply["id"], timeout=300)
        su.log(f"  job on a full disk: {job['state']}: {job['error']}")
        su.check(job["state"] == "FAILED", f"expected FAILED, got {job['state']}")
        su.check(f"checkpoint at step {every}" in job["error"] and
                 "No space left on device" in job["error"],
                 f"the error does not name the step and the full disk: {job['error']}")
        status, metrics = su.http("GET", f"{cluster.rest}/v1/jobs/{reply['id']}/metrics")
        steps = [r["step"] for r in metrics["steps"]]
        su.check(steps == list(range(every)), f"rows {steps}, want 0..{every - 1}")
        left = []
        for root, dirs, files in os.walk(full):
            left += [os.path.join(root, f) for f in files]
        su.log(f"  files left on the full disk: {left}")
        su.check(not any("/step-" in f for f in left), f"a partial checkpoint was left: {left}")
        # The cluster still works.
        status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", su.smoke_config(cluster.tmp))
        su.check(status == 201, f"second submit: {status} {reply}")
        job = su.wait_job(cluster, reply["id"], timeout=300)
        su.check(job["state"] == "SUCCEEDED", f"second job: {job['state']} {job['error']}")
        cluster.stop(expect_rc=0)
    finally:
        subprocess.run(["umount", "-l", full], capture_output=True)
    check_full_job_store(cluster.tmp)


if __name__ == "__main__":
    su.main_guard(body)
