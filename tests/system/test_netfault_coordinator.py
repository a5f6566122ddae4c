#!/usr/bin/env python3
"""System test (network faults): the coordinator cut off. The cluster of test_netfault.py with
the coordinator (not a worker) in its own network namespace joined to the host by a veth pair
(net_fault.py), so every call between it and the trainer, weight sync and the generation workers
crosses the link, and so does this test's REST client. A reference job runs with the link clean;
then, while a TrainStep call of a second job is in flight (the seed picks the step; the trainer
is held stopped for 0.3 s around the cut so the call cannot end first), the link drops every
packet (sockets stay open) for PARTITION_S, longer than the worker expiry, and is healed.

To the coordinator this is every worker going silent at once: each misses heartbeats and expires
from the registry (a `worker expired` line per worker, fp8rl_coordinator_workers_expired_total),
the trainer call in flight is given up by its watchdog (the job records `trainer_lost` and
waits for a trainer, fp8rl_coordinator_job_resumes_total); to the workers, a coordinator that
does not answer. After the heal the workers register again and the job resumes from its last
checkpoint. Checked: the job SUCCEEDS within the bound with rows 0..N exactly once, equal to the
reference's; every worker's expiry was logged within the expiry (+ slack) of the cut and counted;
the trainer_lost event names the train step; the resume is logged and counted.

Needs root, iproute2 and nftables (skips with a message otherwise)."""

import os
import re
import signal
import time

import net_fault
import system_util as su
import test_chaos as chaos
import test_netfault as netfault

chaos.STEPS = 15
PARTITION_S = 12.0
WORKERS = ("trainer", "generation-worker-0", "generation-worker-1")


def progress(cluster, job_id):
    status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{job_id}", timeout=10)
    su.check(status == 200, f"GET job: {status} {job}")
    su.check(job["state"] in ("QUEUED", "RUNNING"), f"job ended before the cut: {job}")
    p = job.get("progress") or {}
    return (p.get("detail"), p["done"] + 1) if p.get("phase") == "rl" else (None, -1)


def cut_in_train_step(cluster, net, job_id, from_step, timeout=200):
    """Partitions the coordinator while a TrainStep of a step >= from_step is in flight; returns
    the step. The trainer is stopped (SIGSTOP) when the job is seen in a train phase: still there
    0.3 s later, the call cannot finish before the partition is in place; the trainer is
    continued once it is (it then works on behind the cut)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        detail, step = progress(cluster, job_id)
        if detail != "train" or step < from_step:
            time.sleep(0.01)
            continue
        trainer = cluster.procs["trainer"].pid
        os.kill(trainer, signal.SIGSTOP)
        try:
            time.sleep(0.3)
            if progress(cluster, job_id) == ("train", step):
                net.partition()
                return step
        finally:
            os.kill(trainer, signal.SIGCONT)
        from_step = step + 1
    su.fail(f"the job reached no train phase of a step >= {from_step}")


def body(clusters):
    seed, rng = netfault.seeded_start("netfault (coordinator)")
    with net_fault.NetNamespace(rng) as net:
        cluster = netfault.LocalCluster(net, isolated="coordinator")
        clusters.append(cluster)
        cluster.start()

        started = time.time()
        reference_id = chaos.submit(cluster, "reference")
        job = chaos.wait_done(cluster, reference_id, timeout=netfault.JOB_BOUND_S)
        su.check(job["state"] == "SUCCEEDED", f"reference: {job['state']} {job.get('error')}")
        reference = chaos.rows_of(cluster, reference_id)
        su.log(f"reference job {reference_id}: {time.time() - started:.1f} s")

        expired_before = cluster.metric("fp8rl_coordinator_workers_expired_total")
        resumes_before = cluster.metric("fp8rl_coordinator_job_resumes_total")
        log_before = len(cluster.log_of("coordinator"))
        started = time.time()
        job_id = chaos.submit(cluster, "partition")
        step = cut_in_train_step(cluster, net, job_id, rng.randrange(2, 8))
        cut = time.time()
        su.log(f"  coordinator cut off in the train phase of step {step}, for {PARTITION_S} s")
        expired_at = {}
        while time.time() - cut < PARTITION_S:
            new = cluster.log_of("coordinator")[log_before:]
            for name in WORKERS:
                if name not in expired_at and re.search(
                        rf"worker expired: no heartbeat within the expiry.*{name}", new):
                    expired_at[name] = round(time.time() - cut, 1)
            time.sleep(0.2)
        net.heal()
        su.log(f"  healed after {time.time() - cut:.1f} s; workers expired after {expired_at} s")
        took = netfault.finish(cluster, job_id, "coordinator partition", reference, started)
        su.check(sorted(expired_at) == sorted(WORKERS) and
                 max(expired_at.values()) < netfault.EXPIRY_S + 5,
                 f"not every worker's expiry was logged within the expiry + 5 s: {expired_at}")
        expired = cluster.metric("fp8rl_coordinator_workers_expired_total") - expired_before
        su.check(expired >= len(WORKERS), f"fp8rl_coordinator_workers_expired_total grew by "
                 f"{expired}, want >= {len(WORKERS)}")
        _, events = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/events")
        su.log(f"  events: {[(e['kind'], e['message'][:140]) for e in events['events']]}")
        lost = [e["message"] for e in events["events"] if e["kind"] == "trainer_lost"]
        su.check(any(m.startswith(f"train step {step}:") for m in lost),
                 f"no trainer_lost event naming train step {step}: {lost}")
        new = cluster.log_of("coordinator")[log_before:]
        su.check(f"resuming job after trainer loss\" job={job_id}" in new,
                 "the coordinator log does not show the resume")
        resumes = cluster.metric("fp8rl_coordinator_job_resumes_total") - resumes_before
        su.check(resumes >= 1, f"fp8rl_coordinator_job_resumes_total grew by {resumes}")
        su.log(f"  the partitioned job took {took:.1f} s; {expired:.0f} expiries counted, "
               f"{resumes:.0f} resume(s)")
        cluster.stop()
        su.log(f"seed {seed}")


if __name__ == "__main__":
    su.main_guard(body)
