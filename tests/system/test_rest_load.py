#!/usr/bin/env python3
"""System test (load, short): fp8rl-bench-rest-load drives the REST API of a local cluster under
`fp8rl up` with concurrent clients (submit, get, watch, list, cancel, one connection per request)
and fails on any 5xx or transport error, or a job that is not listed or did not end after its
cancel; afterwards the coordinator still answers and the cluster stops cleanly.
FP8RL_LOAD_CLIENTS (default 32) and FP8RL_LOAD_SECONDS (default 5) size it; FP8RL_LOAD_WAIT_ON_429=1
makes refused clients wait out Retry-After;
bench/rest_load/run.sh runs it with 200 clients for 60 s for docs/perf.md."""

import json
import os
import subprocess

import system_util as su

BENCH = os.path.join(su.BIN_DIR, "fp8rl-bench-rest-load")


def body(clusters):
    su.require_binaries()
    if not os.access(BENCH, os.X_OK):
        print(f"SKIP: not built: {BENCH}", flush=True)
        raise SystemExit(su.SKIP)
    clients = int(os.environ.get("FP8RL_LOAD_CLIENTS", "32"))
    seconds = float(os.environ.get("FP8RL_LOAD_SECONDS", "5"))
    cluster = su.Cluster(workers=2)
    clusters.append(cluster)
    cluster.wait_up()
    job = os.path.join(cluster.tmp, "job.json")
    with open(job, "w") as f:
        json.dump(su.smoke_config(cluster.tmp), f)
    args = [BENCH, "--url", cluster.rest, "--job", job, "--clients", str(clients),
            "--seconds", str(seconds),
            "--wait-on-429", os.environ.get("FP8RL_LOAD_WAIT_ON_429", "0")]
    su.log("running: " + " ".join(args))
    run = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 240)
    su.log(run.stdout + run.stderr)
    su.check(run.returncode == 0, f"fp8rl-bench-rest-load exited with {run.returncode}")
    su.check("PASS" in run.stdout.splitlines()[-1], "bench did not report PASS")
    status, reply = su.http("GET", f"{cluster.rest}/healthz")
    su.check(status == 200, f"coordinator /healthz after the load: {status} {reply}")
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(body)
