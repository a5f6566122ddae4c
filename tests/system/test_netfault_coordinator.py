#!/usr/bin/env python3
"""System test (network faults): the coordinator cut off. The cluster of test_netfault.py with
the coordinator (not a worker) in its own network namespace joined to the host by a veth pair
(net_fault.py), so every call between it and the trainer, weight sync and the generation workers
crosses the link, and so does this test's REST client. A reference job runs with the link clean;
then, while a second job's step is in its "train" phase (a TrainStep call in flight; the seed
picks the step), the link drops every packet (sockets stay open) for PARTITION_S, longer than
the worker expiry, and is healed.

To the coordinator this is every worker going silent at once: each misses heartbeats and expires
from the registry (a `worker expired` line per worker, fp8rl_coordinator_workers_expired_total),
the trainer call in flight is given up by its watchdog (the job records `trainer_lost` and
waits for a trainer, fp8rl_coordinator_job_resumes_total); to the workers, a coordinator that
does not answer. After the heal the workers register again and the job resumes from its last
checkpoint. Checked: the job SUCCEEDS within the bound with rows 0..N exactly once, equal to the
reference's; every worker's expiry was logged within the expiry (+ slack) of the cut and counted;
the trainer_lost event names the train step; the resume is logged and counted.

Needs root, iproute2 and nftables (skips with a message otherwise)."""

import re
import time

import net_fault
import system_util as su
import test_chaos as chaos
import test_netfault as netfault

chaos.STEPS = 15
PARTITION_S = 12.0
WORKERS = ("trainer", "generation-worker-0", "generation-worker-1")


def wait_train(cluster, job_id, from_step, timeout=200):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{job_id}", timeout=10)
        su.check(status == 200, f"GET job: {status} {job}")
        su.check(job["state"] in ("QUEUED", "RUNNING"), f"job ended before the cut: {job}")
        p = job.get("progress") or {}
        if p.get("phase") == "rl" and p.get("detail") == "train" and p["done"] + 1 >= from_step:
            return p["done"] + 1
        time.sleep(0.01)
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
        step = wait_train(cluster, job_id, rng.randrange(2, 8))
        net.partition()
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
        # The step whose TrainStep was in flight when the cut took hold (the cut lands at the
        # phase seen, or just after it: the next step's).
        trained = [int(m.group(1)) for m in (re.match(r"train step (\d+): ", x) for x in lost) if m]
        su.check(any(step <= k <= step + 1 for k in trained),
                 f"no trainer_lost event naming train step {step} or the next: {lost}")
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
