#!/usr/bin/env python3
"""System test (network faults): a cluster whose generation-worker-1 runs in its own network
namespace, joined to the host by a veth pair (net_fault.py); the coordinator, weight sync, the
trainer and generation-worker-0 listen on the host end of the pair, so every call to or from
worker 1 crosses the link. A reference job runs with the link clean. Then, each while a job is
in its first steps:

  1. a slow, lossy link (8 mbit/s, 10% of packets dropped each way) for 8 s;
  2. a partition (every packet dropped, sockets left open) for 25 s: longer than the worker
     expiry (5 s) and the generation call deadline (--generate-deadline-seconds 15);

then the link is healed. The jobs must SUCCEED: losing one of two generation workers is a fault
the coordinator handles (it hands the worker's samples to the other one), so FAILED would be a
bug. Checked: rows 0..N exactly once, equal to the reference's (test_chaos.py's comparison);
while partitioned the coordinator expires worker 1 within the expiry (+ slack), says so in one
log line (`worker expired`) and shows it in fp8rl_coordinator_live_workers; no step waits longer
than the expiry plus the generation deadline; after the heal worker 1 registers again, takes new
weight versions again and serves a job's calls (the job after the heal would otherwise wait the
60 s sync wait at every step).

Needs root, iproute2 and nftables (skips with a message otherwise). The namespace, the veth pair
and worker 1 are removed on every exit path; a run killed outright leaves them to the next run,
which removes them first (net_fault.remove_stale)."""

import os
import random
import re
import subprocess
import tempfile
import time

import net_fault
import system_util as su
import test_chaos as chaos

EXPIRY_S = 5.0
GENERATE_DEADLINE_S = 15
SLOW_S = 8.0
PARTITION_S = 25.0
JOB_BOUND_S = 300  # a 24-step job takes ~15 s undisturbed on the loaded 2-core VM


def ports_of(offset):
    """{service: [gRPC port, HTTP port]} of a LocalCluster on port offset `offset`."""
    o = offset
    return {"coordinator": [50051 + o, 8080 + o], "weight-sync": [50052 + o, 9402 + o],
            "trainer": [50053 + o, 9403 + o], "generation-worker-0": [50061 + o, 9461 + o],
            "generation-worker-1": [50062 + o, 9462 + o]}


class LocalCluster:
    """The four kinds of service started directly (fp8rl up listens on 127.0.0.1 only), on the
    host end of the veth pair, one of them (`isolated`: any service name) inside the namespace.
    `extra` adds flags to a service ({name: [flags]}); `reach` changes the address one service
    calls another by ({name: {"coordinator" or "weight-sync": "host:port"}}) and `advertise` the
    host a service gives others ({name: host}): how a delaying relay is put on a link."""

    def __init__(self, net, isolated="generation-worker-1", extra=None, reach=None,
                 advertise=None, offset=None):
        self.net = net
        self.isolated = isolated
        self.tmp = tempfile.mkdtemp(prefix="fp8rl-system-")
        self.offset = su.free_port_offset(workers=2) if offset is None else offset
        self.procs = {}
        host, o = net.host_ip, self.offset
        extra, reach, advertise = extra or {}, reach or {}, advertise or {}

        def at(name):  # the address a service listens on
            return net.ns_ip if name == isolated else host

        self.rest = f"http://{at('coordinator')}:{8080 + o}"
        self.ports = ports_of(o)

        def common(name):
            return ["--listen-host", at(name), "--advertise-host", advertise.get(name, at(name)),
                    "--log-level", "info", "--data-dir", os.path.join(self.tmp, "data", name)]

        def peers(name, *which):
            flags = []
            for peer in which:
                address = f"{at(peer)}:{self.ports[peer][0]}"
                flags += ["--" + peer, reach.get(name, {}).get(peer, address)]
            return flags

        self.specs = {
            "weight-sync": ["fp8rl-weight-sync"] + common("weight-sync") +
            ["--grpc-port", str(50052 + o), "--http-port", str(9402 + o)] +
            peers("weight-sync", "coordinator"),
            "coordinator": ["fp8rl-coordinator"] + common("coordinator") +
            ["--grpc-port", str(50051 + o), "--http-port", str(8080 + o), "--data-root", self.tmp,
             "--generate-deadline-seconds", str(GENERATE_DEADLINE_S)],
            "trainer": ["fp8rl-trainer-worker"] + common("trainer") +
            ["--grpc-port", str(50053 + o), "--http-port", str(9403 + o)] +
            peers("trainer", "coordinator", "weight-sync") +
            ["--data-root", self.tmp, "--models-root", su.SOURCE_DIR],
        }
        for i in (0, 1):
            name = f"generation-worker-{i}"
            self.specs[name] = (
                ["fp8rl-generation-worker"] + common(name)[:6] +
                ["--grpc-port", str(50061 + i + o), "--http-port", str(9461 + i + o)] +
                peers(name, "coordinator", "weight-sync") + ["--worker-id", name])
        for name, flags in extra.items():
            self.specs[name] += list(flags)
        self.health = {name: (at(name), ports[1]) for name, ports in self.ports.items()}

    def log_path(self, name):
        return os.path.join(self.tmp, f"{name}.log")

    def log_of(self, name):
        with open(self.log_path(name), errors="replace") as f:
            return f.read()

    def start(self):
        for name, args in self.specs.items():
            command = [os.path.join(su.BIN_DIR, args[0])] + args[1:]
            if name == self.isolated:
                command = self.net.command(command)
            self.procs[name] = subprocess.Popen(command, stdout=open(self.log_path(name), "w"),
                                                stderr=subprocess.STDOUT, cwd=su.SOURCE_DIR)
        deadline = time.time() + 120
        for name, (host, port) in self.health.items():
            while su.http_quiet("GET", f"http://{host}:{port}/healthz", timeout=2)[0] != 200:
                su.check(self.procs[name].poll() is None,
                         f"{name} exited {self.procs[name].returncode}:\n{self.log_of(name)}")
                su.check(time.time() < deadline, f"{name} not healthy within 120 s")
                time.sleep(0.2)
        su.log(f"cluster up on {self.net.host_ip} (+ {self.isolated} on {self.net.ns_ip} in "
               f"{self.net.name}), "
               f"port offset {self.offset}, logs in {self.tmp}")

    def metric(self, name, text=None):
        """Sum of a counter over its labels on the coordinator's /metrics."""
        if text is None:
            _, text = su.http("GET", f"{self.rest}/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def worker_requests(self):
        host, port = self.health["generation-worker-1"]
        status, text = su.http_quiet("GET", f"http://{host}:{port}/metrics", timeout=5)
        su.check(status == 200, f"worker 1 /metrics: {status} {text}")
        return self.metric("fp8rl_generation_requests_total", text)

    def stop(self):
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.terminate()
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill_all(self):  # main_guard's cleanup
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def start_job_in_generation(cluster, tag):
    """Submits a job and returns (id, job) once it is RUNNING an RL step (SFT done)."""
    job_id = chaos.submit(cluster, tag)
    deadline = time.time() + 120
    while time.time() < deadline:
        status, job = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        if job["state"] == "RUNNING" and job.get("step", 0) >= 1:
            return job_id, job
        su.check(job["state"] in ("QUEUED", "RUNNING"), f"job {job_id}: {job}")
        time.sleep(0.1)
    su.fail(f"job {job_id} did not reach step 1 within 120 s")


def finish(cluster, job_id, tag, reference, started):
    job = chaos.wait_done(cluster, job_id, timeout=JOB_BOUND_S)
    took = time.time() - started
    su.check(job["state"] == "SUCCEEDED", f"job {job_id} ({tag}) ended {job['state']}: "
             f"{job.get('error')}")
    chaos.check_same_rows(job_id, chaos.rows_of(cluster, job_id), reference)
    su.log(f"job {job_id} ({tag}): SUCCEEDED in {took:.1f} s, rows 0..{chaos.STEPS} equal the "
           "reference")
    return took


def seeded_start(label):
    """Skips (exit code su.SKIP) where namespaces cannot be made, removes what an earlier run left,
    and returns the run's seed and its random source (FP8RL_CHAOS_SEED reruns a seed)."""
    su.require_binaries()
    why = net_fault.available()
    if why:
        print(f"SKIP: {why}", flush=True)
        raise SystemExit(su.SKIP)
    net_fault.remove_stale()
    seed = int(os.environ.get("FP8RL_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    su.log(f"{label} seed {seed} (rerun with FP8RL_CHAOS_SEED={seed})")
    return seed, random.Random(seed)


def body(clusters):
    seed, rng = seeded_start("netfault")
    with net_fault.NetNamespace(rng) as net:
        cluster = LocalCluster(net)
        clusters.append(cluster)
        cluster.start()

        started = time.time()
        reference_id = chaos.submit(cluster, "reference")
        job = chaos.wait_done(cluster, reference_id, timeout=JOB_BOUND_S)
        su.check(job["state"] == "SUCCEEDED", f"reference: {job['state']} {job.get('error')}")
        reference = chaos.rows_of(cluster, reference_id)
        su.log(f"reference job {reference_id}: {time.time() - started:.1f} s")
        served_clean = cluster.worker_requests()
        su.check(served_clean > 0, "worker 1 (in the namespace) served no call of the reference "
                 "job: the test would not exercise the link")

        # 1. Slow and lossy.
        started = time.time()
        job_id, job = start_job_in_generation(cluster, "slow")
        net.slow()
        net.lossy(10)
        su.log(f"  {', '.join(net.faults)} on the link at step {job['step']}, for {SLOW_S} s")
        time.sleep(SLOW_S)
        net.heal()
        finish(cluster, job_id, "slow and lossy", reference, started)

        # 2. Partition, longer than the expiry and the generation call deadline.
        redispatched_before = cluster.metric("fp8rl_rl_redispatched_requests_total")
        log_before = len(cluster.log_of("coordinator"))
        started = time.time()
        job_id, job = start_job_in_generation(cluster, "partition")
        time.sleep(rng.uniform(0.0, 1.0))
        net.partition()
        cut = time.time()
        su.log(f"  partition at step {job['step']}, for {PARTITION_S} s")
        expired_at, live_seen = None, set()
        while time.time() - cut < PARTITION_S:
            new = cluster.log_of("coordinator")[log_before:]
            if expired_at is None and re.search(
                    r"worker expired: no heartbeat within the expiry.*generation-worker-1", new):
                expired_at = time.time() - cut
            live_seen.add(cluster.metric('fp8rl_coordinator_live_workers{kind="generation"}'))
            time.sleep(0.2)
        net.heal()
        su.log(f"  healed after {time.time() - cut:.1f} s; worker 1 expired from the registry "
               f"{expired_at} s after the cut; live generation workers seen: {sorted(live_seen)}")
        took = finish(cluster, job_id, "partition", reference, started)
        su.check(took < JOB_BOUND_S, f"the partitioned job took {took:.0f} s")
        su.check(expired_at is not None and expired_at < EXPIRY_S + 5,
                 f"no 'worker expired' line for worker 1 within the expiry + 5 s ({expired_at})")
        su.check(1.0 in live_seen, f"fp8rl_coordinator_live_workers{{kind=generation}} never "
                 f"showed the lost worker: {sorted(live_seen)}")
        new = cluster.log_of("coordinator")[log_before:]
        # The longest step of the job: the wait the partition cost it (a version probe of the
        # cut-off worker waits out its 5 s deadline until the worker expires; a generation call
        # to it is handed to worker 0 at the expiry or at --generate-deadline-seconds).
        steps = [(int(a), float(b)) for a, b in re.findall(
            rf"step done\" job={job_id} step=(\d+) \S+ seconds=([0-9.]+)", new)]
        longest = max(t for _, t in steps)
        su.log(f"  steps over 1 s: {[(n, round(t, 1)) for n, t in steps if t > 1]}")
        su.log(f"  longest step of the partitioned job: {longest:.1f} s; redispatched calls: "
               f"{cluster.metric('fp8rl_rl_redispatched_requests_total') - redispatched_before:.0f}"
               f"; 'generation worker expired' lines: "
               f"{new.count('generation worker expired; re-dispatching its call')}")
        su.check(longest < EXPIRY_S + GENERATE_DEADLINE_S + 5,
                 f"a step of the partitioned job took {longest:.1f} s, longer than the expiry "
                 "plus the generation deadline")

        # Worker 1 registers again once the link is back.
        deadline = time.time() + 30
        while cluster.metric('fp8rl_coordinator_live_workers{kind="generation"}') != 2.0:
            su.check(time.time() < deadline, "worker 1 not live again 30 s after the heal")
            time.sleep(0.2)
        su.log(f"  worker 1 live again {time.time() - cut - PARTITION_S:.1f} s after the heal")

        # 3. After the heal worker 1 is back: it registers again and serves calls.
        served_before = cluster.worker_requests()
        started = time.time()
        job_id = chaos.submit(cluster, "healed")
        finish(cluster, job_id, "after the heal", reference, started)
        served_after = cluster.worker_requests()
        su.check(served_after > served_before,
                 f"worker 1 served no call after the heal ({served_before} -> {served_after})")
        worker_log = cluster.log_of("generation-worker-1")
        su.log(f"  worker 1 calls: {served_clean:.0f} in the reference, {served_before:.0f} "
               f"before the last job, {served_after:.0f} after; re-registrations logged: "
               f"{worker_log.count('registering again')}; subscribe streams stalled / ended: "
               f"{worker_log.count('subscribe stream stalled')} / "
               f"{worker_log.count('subscribe stream ended')}")
        cluster.stop()
        su.log(f"seed {seed}")


if __name__ == "__main__":
    su.main_guard(body)
