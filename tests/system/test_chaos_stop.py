#!/usr/bin/env python3
"""System test (chaos, hangs): SIGSTOP each kind of service (coordinator, weight sync, trainer, a
generation worker) at a random moment of a running job on a local cluster under `fp8rl up`, hold
it stopped longer than the coordinator's worker expiry (5 s: the deadline that decides a worker
is gone while its sockets stay open), then SIGCONT it. A stopped process keeps its sockets, so
nothing sees a connection drop; the coordinator must notice from missed heartbeats.

Checked: while the trainer is stopped the coordinator gives its call up (phase trainer_lost)
before the trainer is continued, instead of waiting out the trainer call timeout; every job
SUCCEEDS with metrics rows 0..N exactly once whose values equal those of the same job run
undisturbed (test_chaos.py's reference and checks); no job is lost; every checkpoint loads.

The seed is printed; rerun one with FP8RL_CHAOS_SEED=<seed>. FP8RL_CHAOS_ROUNDS (default 1) is
how many times each kind of service is stopped."""

import os
import random
import signal
import time

import system_util as su
import test_chaos as chaos

EXPIRY_S = 5.0  # the coordinator's --worker-expiry-ms default, which fp8rl up keeps


def observe_while_stopped(cluster, job_id, hold):
    """Polls the job for `hold` seconds; returns the phases seen, each with its first time."""
    seen = {}
    start = time.time()
    while time.time() - start < hold:
        # The coordinator itself may be the stopped one: a short timeout, no retries.
        status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{job_id}", timeout=1)
        if status == 200:
            phase = (job.get("progress") or {}).get("phase") or job["state"]
            seen.setdefault(phase, round(time.time() - start, 1))
        time.sleep(0.2)
    return seen


def body(clusters):
    su.require_binaries()
    seed = int(os.environ.get("FP8RL_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    rounds = int(os.environ.get("FP8RL_CHAOS_ROUNDS", "1"))
    su.log(f"chaos (SIGSTOP) seed {seed} (rerun with FP8RL_CHAOS_SEED={seed}), {rounds} rounds")
    rng = random.Random(seed)

    cluster = su.Cluster(workers=chaos.WORKERS)
    clusters.append(cluster)
    cluster.wait_up()

    start = time.time()
    reference_id = chaos.submit(cluster, "reference")
    job = chaos.wait_done(cluster, reference_id, timeout=300)
    su.check(job["state"] == "SUCCEEDED", f"reference job: {job['state']} {job.get('error')}")
    reference = chaos.rows_of(cluster, reference_id)
    job_seconds = time.time() - start
    su.log(f"reference job {reference_id}: {job_seconds:.1f} s")

    plan = chaos.KINDS * rounds
    rng.shuffle(plan)
    jobs, stops = [], []
    current = None
    for i, kind in enumerate(plan):
        while True:
            if current is None or chaos.wait_state(cluster, current) != "RUNNING_OR_QUEUED":
                tag = f"stop{len(jobs)}"
                current = chaos.submit(cluster, tag)
                jobs.append((current, tag))
            delay = rng.uniform(0.0, min(0.8 * job_seconds, 6.0))
            time.sleep(delay)
            status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{current}")
            if status == 200 and job["state"] == "RUNNING":
                break
        # The trainer is held long enough for a generation phase plus the expiry to pass.
        hold = rng.uniform(EXPIRY_S + 15, EXPIRY_S + 20) if kind == "trainer" else \
            rng.uniform(EXPIRY_S + 3, EXPIRY_S + 8)
        pids = chaos.read_pids(cluster)
        name = kind if kind != "generation-worker" else \
            f"generation-worker-{rng.randrange(chaos.WORKERS)}"
        moment = f"step {job['step']} phase {(job.get('progress') or {}).get('phase')}"
        os.kill(pids[name], signal.SIGSTOP)
        try:
            seen = observe_while_stopped(cluster, current, hold)
        finally:
            os.kill(pids[name], signal.SIGCONT)
        su.log(f"  stop {i + 1}/{len(plan)}: SIGSTOP {name} (pid {pids[name]}) for {hold:.1f} s, "
               f"{delay:.1f} s into job {current} at {moment}; phases seen while stopped "
               f"(first second): {seen}")
        if kind == "trainer":
            su.check("trainer_lost" in seen,
                     f"the coordinator did not give up the stopped trainer's call within "
                     f"{hold:.1f} s (expiry {EXPIRY_S} s); phases seen: {seen} (seed {seed})")
        su.check(chaos.read_pids(cluster)[name] == pids[name],
                 f"{name} was restarted while stopped: the launcher must not kill a live process")
        stops.append((name, hold, seen))

    for job_id, tag in jobs:
        job = chaos.wait_done(cluster, job_id, timeout=400)
        su.check(job["state"] == "SUCCEEDED",
                 f"job {job_id} ended {job['state']} under SIGSTOP (seed {seed}): "
                 f"{job.get('error')}")
        chaos.check_same_rows(job_id, chaos.rows_of(cluster, job_id), reference)
        n = chaos.check_checkpoints(cluster, job_id, tag)
        su.log(f"job {job_id}: SUCCEEDED, rows 0..{chaos.STEPS} equal the reference, {n} "
               "checkpoints readable")
    status, listed = chaos.rest_retry(cluster, "GET", "/v1/jobs")
    ids = {j["id"] for j in listed["jobs"]}
    su.check(ids >= {reference_id} | {j for j, _ in jobs}, f"a job was lost: {listed}")
    if any(name == "trainer" for name, _, _ in stops):
        su.check("trainer stopped heartbeating; call abandoned" in cluster.log_of("coordinator"),
                 "no log line for the abandoned trainer call")
    cluster.stop(expect_rc=0)
    su.log(f"{len(stops)} stops over {len(jobs)} jobs, seed {seed}")


if __name__ == "__main__":
    su.main_guard(body)
