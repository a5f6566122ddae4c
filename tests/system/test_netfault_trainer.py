#!/usr/bin/env python3
"""System test (network faults): the trainer cut off. The cluster of test_netfault.py, with the
trainer (not a generation worker) in its own network namespace joined to the host by a veth pair
(net_fault.py), so every call between the trainer and the coordinator, weight sync or the
rendezvous crosses the link. A reference job runs with the link clean; then, while a second job
is in its RL steps (the seed picks the moment), the link drops every packet (sockets stay open)
for PARTITION_S, longer than the worker expiry, and is healed.

A partitioned trainer looks like a stopped one to the coordinator (docs/design/faults.md "Hung
services"): it misses heartbeats, expires from the registry (`worker expired` line), the trainer
call in flight is given up by its watchdog and the job waits for a trainer; after the heal the
trainer registers again and the job resumes from its last checkpoint. Checked: the job SUCCEEDS
with rows 0..N exactly once equal to the reference's; the trainer expired within the expiry
(+ slack) and a `trainer_lost` job event was recorded while the link was cut; the job resumed
(log line) once the link was back; the job ended within the bound.

Needs root, iproute2 and nftables (skips with a message otherwise)."""

import re
import time

import net_fault
import system_util as su
import test_chaos as chaos
import test_netfault as netfault

chaos.STEPS = 15
PARTITION_S = 12.0


def body(clusters):
    seed, rng = netfault.seeded_start("netfault (trainer)")
    with net_fault.NetNamespace(rng) as net:
        cluster = netfault.LocalCluster(net, isolated="trainer")
        clusters.append(cluster)
        cluster.start()

        started = time.time()
        reference_id = chaos.submit(cluster, "reference")
        job = chaos.wait_done(cluster, reference_id, timeout=netfault.JOB_BOUND_S)
        su.check(job["state"] == "SUCCEEDED", f"reference: {job['state']} {job.get('error')}")
        reference = chaos.rows_of(cluster, reference_id)
        su.log(f"reference job {reference_id}: {time.time() - started:.1f} s")

        log_before = len(cluster.log_of("coordinator"))
        started = time.time()
        job_id, job = netfault.start_job_in_generation(cluster, "partition")
        time.sleep(rng.uniform(0.0, 1.0))
        net.partition()
        cut = time.time()
        su.log(f"  trainer cut off at step {job['step']}, for {PARTITION_S} s")
        expired_at, lost_at = None, None
        while time.time() - cut < PARTITION_S:
            new = cluster.log_of("coordinator")[log_before:]
            if expired_at is None and re.search(
                    r"worker expired: no heartbeat within the expiry.*kind=trainer", new):
                expired_at = time.time() - cut
            if lost_at is None:
                status, events = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/events")
                if status == 200 and any(e["kind"] == "trainer_lost" for e in events["events"]):
                    lost_at = time.time() - cut
            time.sleep(0.2)
        net.heal()
        su.log(f"  healed after {time.time() - cut:.1f} s; trainer expired {expired_at} s and "
               f"trainer_lost recorded {lost_at} s after the cut")
        took = netfault.finish(cluster, job_id, "trainer partition", reference, started)
        su.check(expired_at is not None and expired_at < netfault.EXPIRY_S + 5,
                 f"no 'worker expired' line for the trainer within the expiry + 5 s ({expired_at})")
        su.check(lost_at is not None, "no trainer_lost event while the trainer was cut off")
        new = cluster.log_of("coordinator")[log_before:]
        su.check(f"resuming job after trainer loss\" job={job_id}" in new,
                 "the coordinator log does not show the resume")
        _, events = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/events")
        su.log(f"  events: {[(e['kind'], e['message'][:120]) for e in events['events']]}")
        su.log(f"  the partitioned job took {took:.1f} s")
        cluster.stop()
        su.log(f"seed {seed}")


if __name__ == "__main__":
    su.main_guard(body)
