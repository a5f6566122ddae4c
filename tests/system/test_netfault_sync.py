#!/usr/bin/env python3
"""System test (network faults): the links of one generation worker to weight sync and to the
coordinator. The cluster of test_netfault.py, with generation-worker-1 in its own network
namespace (net_fault.py) receiving weight versions over TCP (`--weight-same-host off`, as a
worker on another host would; `--fanout direct`, so weight sync itself sends them). Worker 1
reaches weight sync and the coordinator, and the coordinator reaches worker 1, through a
DelayRelay each (net_fault.py: a fixed latency in user space, since the kernel lacks tc netem);
the relays add no delay until part 2. A reference job runs first.

1. Partition mid-push: the link is slowed (tc tbf) so that a version takes a while to cross it;
   when a job's step is in its "publish" phase and weight sync has stored the new version but
   worker 1 does not hold it yet (its push is under way), only the packets between worker 1 and
   weight sync are dropped (nftables on the relay's port: worker 1 keeps heartbeating to the
   coordinator and stays live) for PARTITION_S, then the link is healed. The step waits for
   every live worker to hold the version (--sync-wait-seconds, 60 s); after 5 s the coordinator
   says which worker lags (log line `live workers lag behind the new weight version` naming
   worker 1, fp8rl_coordinator_sync_lagging_workers_total). After the heal the version reaches
   worker 1 and the job goes on.
2. Delay: every relay holds each byte DELAY_S, each way, during a whole job.

Checked for both: the job SUCCEEDS within the bound with rows 0..N exactly once, equal to the
reference's (test_chaos.py's comparison); in 1, the push was in flight at the cut, the lag was
logged and counted, worker 1 holds the job's last version at the end and no step waited out the
sync wait; in 2, the relays carried the job's traffic.

Needs root, iproute2 and nftables (skips with a message otherwise)."""

import re
import time

import net_fault
import system_util as su
import test_chaos as chaos
import test_netfault as netfault

chaos.STEPS = 15
PARTITION_S = 12.0
DELAY_S = 0.05
LAG_WARN_S = 5.0  # the coordinator's kSyncLagWarn (rl_loop.cc)


def metric_of(host, port, name):
    status, text = su.http_quiet("GET", f"http://{host}:{port}/metrics", timeout=10)
    su.check(status == 200, f"/metrics of {host}:{port}: {status} {text}")
    total, seen = 0.0, False
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M):
        total, seen = total + float(m.group(1)), True
    return total if seen else None


def progress(cluster, job_id):
    status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{job_id}", timeout=10)
    su.check(status == 200, f"GET job: {status} {job}")
    p = job.get("progress") or {}
    step = p.get("done", -1) + 1 if p.get("phase") == "rl" else -1
    return job["state"], p.get("detail"), step


def cut_mid_push(cluster, net, job_id, ws_port, relay_port, rng):
    """Partitions worker 1 from weight sync while the version of a step reaches weight sync and
    not yet worker 1; returns (step, version). A step whose push was over before the cut is let
    go and a later one is tried."""
    w1 = cluster.health["generation-worker-1"]
    from_step = rng.randrange(2, 6)
    deadline = time.time() + 200
    while time.time() < deadline:
        state, detail, step = progress(cluster, job_id)
        su.check(state in ("QUEUED", "RUNNING"), f"job ended before the cut: {state}")
        if detail != "train" or step < from_step:
            time.sleep(0.01)
            continue
        # The step trains; its version is the next one weight sync stores.
        before = metric_of(net.host_ip, ws_port, "fp8rl_weight_sync_latest_version") or 0
        while time.time() < deadline:
            latest = metric_of(net.host_ip, ws_port, "fp8rl_weight_sync_latest_version") or 0
            if latest > before:
                break
            time.sleep(0.005)
        net.partition(ports=[relay_port])
        held = metric_of(*w1, "fp8rl_generation_weight_version")
        if held is not None and held < latest:
            su.log(f"  cut worker 1 from weight sync at step {step}: weight sync holds version "
                   f"{latest:.0f}, worker 1 {held:.0f}")
            return step, latest
        net.heal()
        net.slow(rate=SLOW_RATE)
        su.log(f"  version {latest:.0f} reached worker 1 before the cut; a later step")
        from_step = step + 1
    su.fail("no step's push could be cut in flight")


SLOW_RATE = "2mbit"


def body(clusters):
    seed, rng = netfault.seeded_start("netfault (weight sync link)")
    with net_fault.NetNamespace(rng) as net:
        offset = su.free_port_offset(workers=2)
        ports = netfault.ports_of(offset)
        host = net.host_ip
        relays = {
            "weight-sync": net_fault.DelayRelay((host, 0), (host, ports["weight-sync"][0]), 0.0),
            "coordinator": net_fault.DelayRelay((host, 0), (host, ports["coordinator"][0]), 0.0),
            # The coordinator calls worker 1 at the address it advertises: the host end, where
            # this relay listens on worker 1's own port number.
            "worker": net_fault.DelayRelay((host, ports["generation-worker-1"][0]),
                                           (net.ns_ip, ports["generation-worker-1"][0]), 0.0),
        }
        try:
            run(clusters, net, rng, relays, offset)
        finally:
            for relay in relays.values():
                relay.close()
        su.log(f"seed {seed}")


def run(clusters, net, rng, relays, offset):
    host = net.host_ip
    reach = {"generation-worker-1": {
        name: f"{host}:{relays[name]._server.getsockname()[1]}"
        for name in ("weight-sync", "coordinator")}}
    cluster = netfault.LocalCluster(
        net, extra={"generation-worker-1": ["--weight-same-host", "off"],
                    "weight-sync": ["--fanout", "direct"]},
        reach=reach, advertise={"generation-worker-1": host}, offset=offset)
    clusters.append(cluster)
    cluster.start()
    ws_port = cluster.ports["weight-sync"][1]

    started = time.time()
    reference_id = chaos.submit(cluster, "reference")
    job = chaos.wait_done(cluster, reference_id, timeout=netfault.JOB_BOUND_S)
    su.check(job["state"] == "SUCCEEDED", f"reference: {job['state']} {job.get('error')}")
    reference = chaos.rows_of(cluster, reference_id)
    su.log(f"reference job {reference_id}: {time.time() - started:.1f} s")
    su.check(cluster.worker_requests() > 0, "worker 1 served no call of the reference job")

    # 1. Partition from weight sync while a version is on its way to worker 1.
    lagging_before = cluster.metric("fp8rl_coordinator_sync_lagging_workers_total")
    log_before = len(cluster.log_of("coordinator"))
    started = time.time()
    job_id = chaos.submit(cluster, "partition")
    net.slow(rate=SLOW_RATE)
    step, version = cut_mid_push(cluster, net, job_id, ws_port,
                                 int(reach["generation-worker-1"]["weight-sync"].split(":")[1]),
                                 rng)
    cut = time.time()
    time.sleep(PARTITION_S)
    net.heal()
    su.log(f"  healed after {time.time() - cut:.1f} s")
    took = netfault.finish(cluster, job_id, "weight-sync partition mid-push", reference, started)
    new = cluster.log_of("coordinator")[log_before:]
    lag_lines = [line for line in new.splitlines()
                 if "live workers lag behind the new weight version" in line]
    su.log(f"  lag lines: {lag_lines[:2]}")
    su.check(any("generation-worker-1" in line and f"version={version:.0f}" in line
                 for line in lag_lines),
             f"no lag line naming worker 1 and version {version:.0f}")
    lagging = cluster.metric("fp8rl_coordinator_sync_lagging_workers_total") - lagging_before
    su.check(lagging >= 1, f"fp8rl_coordinator_sync_lagging_workers_total grew by {lagging}")
    steps = [(int(a), float(b)) for a, b in re.findall(
        rf"step done\" job={job_id} step=(\d+) \S+ seconds=([0-9.]+)", new)]
    longest = max(t for _, t in steps)
    su.log(f"  steps over 1 s: {[(n, round(t, 1)) for n, t in steps if t > 1]}")
    su.check(longest < PARTITION_S + 30,
             f"a step took {longest:.1f} s: the version did not reach worker 1 soon after the heal")
    w1 = cluster.health["generation-worker-1"]
    held = metric_of(*w1, "fp8rl_generation_weight_version")
    latest = metric_of(host, ws_port, "fp8rl_weight_sync_latest_version")
    su.check(held == latest, f"worker 1 holds version {held}, weight sync {latest}")
    reconnects = metric_of(*w1, "fp8rl_generation_weight_stream_reconnects_total")
    worker_log = cluster.log_of("generation-worker-1")
    su.log(f"  the partitioned job took {took:.1f} s; worker 1 holds version {held:.0f}; "
           f"subscribe stream reconnects {reconnects}; stalled / ended lines: "
           f"{worker_log.count('subscribe stream stalled')} / "
           f"{worker_log.count('subscribe stream ended')}")

    # 2. A fixed delay on every link of worker 1.
    carried = {name: relay.forwarded for name, relay in relays.items()}
    for relay in relays.values():
        relay.delay_s = DELAY_S
    started = time.time()
    job_id = chaos.submit(cluster, "delay")
    took = netfault.finish(cluster, job_id, f"{DELAY_S * 1000:.0f} ms delay", reference, started)
    for relay in relays.values():
        relay.delay_s = 0.0
    grown = {name: relay.forwarded - carried[name] for name, relay in relays.items()}
    su.log(f"  bytes through the delaying relays during the job: {grown}")
    su.check(all(b > 0 for b in grown.values()), f"a relay carried nothing: {grown}")
    cluster.stop()


if __name__ == "__main__":
    su.main_guard(body)
