#!/usr/bin/env python3
"""Soak run (a benchmark, not a test): a local cluster under `fp8rl up` runs jobs back to back
for a fixed time while a fault is injected every few minutes, and every service's RSS, open file
descriptors and threads plus the job store's size are sampled. At the end it prints a table and
writes a JSON summary: faults injected per kind and recovered, time to recover (p50/p99), every
job accounted for, and per service the RSS / FD / thread slope over its longest life without a
restart (a least-squares line after a warm-up, so a leak shows as a steady rise).

Fault kinds (one drawn per fault by the seed, printed; rerun with --seed):
  kill             SIGKILL of the coordinator, weight sync, a trainer rank or a generation worker
                   (`fp8rl up` restarts it)
  stop             SIGSTOP of one of them for 8-20 s, then SIGCONT
  ckpt-corrupt     the running job's latest checkpoint (as the job store records it) is cut short
                   or its header garbled while the trainer is stopped, then the trainer is
                   SIGKILLed: the resume must fall back to the previous checkpoint and say so
                   (a checkpoint_fallback event)
  ckpt-readonly    checkpoint.dir (a tmpfs the soak mounts) remounted read-only for 3-10 s
  ckpt-full        checkpoint.dir filled up for 3-10 s
  store-full       the job store's disk (a tmpfs the soak mounts under the coordinator's data
                   dir) filled up for 2-7 s, shorter than the coordinator's store retry (10 s)
  rank-kill        (--trainers 2 only) a rank of the trainer group, chosen by the seed,
                   SIGKILLed while the job is in a step's "train" phase (a group TrainStep)
  push-rank-kill   (--trainers 2 only) a rank, chosen by the seed, SIGKILLed while the group
                   publishes the step's version (the job's "publish" phase). As in
                   test_trainer_group_chaos.py, weight sync is stopped during the step's "train"
                   phase so the publish cannot end first; 0.2 s into "publish" the rank is killed
                   and weight sync continued. Rank 0 uploads, so its loss fails the publish
                   (trainer_lost "publish: ..."); rank 1 of an unsharded group only exports
                   locally and has answered by then, so its loss fails the group's next call.
                   Either way the group forms again (group_reformed) and the job resumes.
  net-slow         the link of generation-worker-1 (see below) slowed to 8 mbit/s (tc tbf) with
                   2-5% of packets dropped each way, for 8-20 s
  net-lossy        5-20% of that link's packets dropped each way, for 8-20 s
  net-partition    every packet of that link dropped (sockets stay open) for 8-30 s, longer than
                   the worker expiry (5 s), then healed: the coordinator expires the worker, hands
                   its calls to generation-worker-0, and the worker registers again after the heal
  burst            3-6 jobs submitted at once while the queue limit is 2 (the coordinator runs
                   with --max-queued-jobs 2 when this kind is drawn from): the excess must be
                   answered 429 with Retry-After and counted in
                   fp8rl_coordinator_requests_refused_total{reason="queue_full"}; each accepted
                   job is, as the seed says, left to run (accounted like any other job) or
                   cancelled at once by the soak (accounted as cancelled by the soak)

The storage kinds need root (mount -t tmpfs); without it they are left out and the run says so.
The network kinds need root, iproute2 and nftables (net_fault.available()). With --trainers 2
every job is a data-parallel group of 2 (`trainer.data_parallel`). --kinds restricts the draw to
the kinds named. --spare-rank0 keeps trainer rank 0 ("trainer") out of every fault: kill, stop,
rank-kill and push-rank-kill pick among the other ranks, and ckpt-corrupt kills the other ranks
only (rank 0 is stopped with them while the checkpoint is damaged, then continued), so one
trainer process lives the whole run and its RSS slope can tell a leak from warm-up.

How the network kinds are set up: `fp8rl up` starts every service on 127.0.0.1, so the soak
gives it a --bin-dir of its own (soak_net.py) in which fp8rl-generation-worker is a wrapper.
Once the cluster is up the soak makes a network namespace joined to the host by a veth pair
(net_fault.NetNamespace; private 10.231.K.0/30 addresses, no other interface touched), puts TCP
relays on the host end that forward to the coordinator's and weight sync's gRPC ports, and
SIGKILLs generation-worker-1; `fp8rl up` restarts it through the wrapper, which execs it inside
the namespace listening on and advertising the namespace's address. From then on, for the whole
run (restarts included), every call between that worker and the rest of the cluster crosses
the link the network kinds act on; the rest of the cluster stays on 127.0.0.1. The same folder
holds a coordinator wrapper that adds --max-queued-jobs for the burst kind. Weight versions
reach the worker as same-host files (the local cluster's default), so the link carries the
worker's gRPC control, heartbeat and generation traffic, not the weights.

What is expected: every job SUCCEEDS with metrics rows 0..N exactly once whose values equal the
first job's (run before any fault; test_chaos.py's comparison), except that a job whose
checkpoint falls in a ckpt-readonly / ckpt-full window may end FAILED with an error naming the
read-only or full disk, and a burst job the soak cancelled ends CANCELLED. A network fault must
not fail a job (losing one of two generation workers is handled by the coordinator, as
test_netfault.py expects) and no job may hang: a job that does not end counts as lost. Each
ended job's checkpoint folder is checked (step-K folders only, every checkpoint.every_steps)
and then removed, so the tmpfs does not fill up.

Time to recover: from the fault until a job records a new metrics row after the fault is over
(a SIGSTOP and a network fault count their hold; a storage fault counts its hold and, when the
job failed, the start of the next one; a rank kill counts until a row after the group formed
again). For net-partition the time from the heal until the coordinator counts both generation
workers live again is recorded too (rejoined_s). "Handled visibly" (seen) per kind: rank-kill a
trainer_lost event; push-rank-kill trainer_lost and group_reformed; ckpt-corrupt a
checkpoint_fallback event and counter; net-partition the worker expired (counter) and live
again; burst every excess submission refused with 429 + Retry-After and counted.

    bench/soak/soak.py --minutes 30 --fault-every 120 --out /tmp/soak   # build first, as for
                                                                          # tests/system
The JSON summary and the samples (CSV) go to --out. Exit status 1 when a job was lost, ended in
a way no fault explains, or the cluster did not stop cleanly."""

import argparse
import csv
import errno
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "system"))
import system_util as su  # noqa: E402
import test_chaos as chaos  # noqa: E402
import test_checkpoint_fallback as fallback  # noqa: E402
import net_fault  # noqa: E402
import soak_net  # noqa: E402

WORKERS = 2
EVERY = 3  # checkpoint.every_steps
PROCESS_KINDS = ["kill", "stop"]
STORAGE_KINDS = ["ckpt-readonly", "ckpt-full", "store-full"]
NET_KINDS = ["net-slow", "net-lossy", "net-partition"]
RANK_KINDS = ["rank-kill", "push-rank-kill"]
ALL_KINDS = PROCESS_KINDS + ["ckpt-corrupt"] + STORAGE_KINDS + RANK_KINDS + NET_KINDS + ["burst"]
NET_WORKER = "generation-worker-1"  # the worker that runs in the soak's network namespace
MAX_QUEUED = 2  # the coordinator's --max-queued-jobs when "burst" is drawn from
EXPIRY_S = 5.0  # the coordinator's --worker-expiry-ms default
# The error a job may end FAILED with, per storage fault kind.
STORAGE_ERRORS = {"ckpt-readonly": "Read-only file system", "ckpt-full": "No space left on device"}


def proc_sample(pid):
    """(rss_mib, fds, threads) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        rss = int(status["VmRSS"].split()[0]) / 1024.0
        threads = int(status["Threads"])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds, threads
    except (OSError, KeyError, ValueError):
        return None


def read_services(cluster):
    try:
        with open(os.path.join(cluster.data_dir, "cluster.json")) as f:
            return {s["name"]: s for s in json.load(f)["services"]}
    except (OSError, ValueError):
        return {}


def store_bytes(cluster):
    base = os.path.join(cluster.data_dir, "coordinator", "jobs.db")
    return sum(os.path.getsize(p) for p in (base, base + "-wal", base + "-shm")
               if os.path.exists(p))


def slope_per_hour(points):
    """Least-squares slope of (t_seconds, value) points, per hour; None with < 3 points."""
    if len(points) < 3:
        return None
    ts = [t for t, _ in points]
    vs = [v for _, v in points]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    den = sum((t - mt) ** 2 for t in ts)
    if den == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / den * 3600.0


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def sh(args):
    return subprocess.run(args, capture_output=True, text=True)


def fill(folder):
    """Writes <folder>/filler until the disk is full; returns its path."""
    path = os.path.join(folder, "filler")
    block = b"\xa5" * (1 << 16)
    with open(path, "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    return path


def metric_sum(text, name):
    """Sum of every sample of metric `name` in a Prometheus text page (0 when absent)."""
    total = 0.0
    for m in re.finditer(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text or "", re.M):
        total += float(m.group(1))
    return total


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.tmp = tempfile.mkdtemp(prefix="fp8rl-soak-")
        self.ckpt = os.path.join(self.tmp, "ckpt")
        self.store = os.path.join(self.tmp, "data", "coordinator")
        self.mounts = []
        wanted = args.kinds.split(",") if args.kinds else list(ALL_KINDS)
        self.kinds = [k for k in PROCESS_KINDS if k in wanted]
        if "ckpt-corrupt" in wanted:
            if args.spare_rank0 and args.trainers == 1:
                print("ckpt-corrupt left out: with --spare-rank0 and one trainer no rank may be "
                      "killed", flush=True)
            else:
                self.kinds.append("ckpt-corrupt")
        if self.mount(self.ckpt, "256m") and self.mount(self.store, "128m"):
            self.kinds += [k for k in STORAGE_KINDS if k in wanted]
        else:
            print("storage fault kinds left out: mounting a tmpfs needs root", flush=True)
        if args.trainers > 1:
            self.kinds += [k for k in RANK_KINDS if k in wanted]
        net_wanted = [k for k in NET_KINDS if k in wanted]
        why = net_fault.available() if net_wanted else None
        if why:
            print(f"network fault kinds left out: {why}", flush=True)
        elif net_wanted:
            self.kinds += net_wanted
        if "burst" in wanted:
            self.kinds.append("burst")
        if not self.kinds:
            raise SystemExit(f"no fault kind left of {wanted}")
        self.net = None      # net_fault.NetNamespace once set up
        self.relays = []
        self.netns_file = None
        extra = []
        if set(self.kinds) & set(NET_KINDS + ["burst"]):
            flags = [f"--max-queued-jobs={MAX_QUEUED}"] if "burst" in self.kinds else []
            bin_dir = os.path.join(self.tmp, "bin")
            self.netns_file = soak_net.make_bin_dir(bin_dir, su.BIN_DIR, flags)
            extra = ["--bin-dir", bin_dir]
        self.cluster = su.Cluster(workers=WORKERS, tmp=self.tmp, trainers=args.trainers,
                                  extra_args=extra)
        self.tags = {}       # job id -> tag (its checkpoint.dir is <ckpt>/<tag>)
        self.cancelled = set()  # jobs the soak cancelled (burst)
        self.burst_count = 0
        self.setup = {}
        self.samples = []  # dicts
        self.loads = []    # (t, load average over 1 minute)
        self.jobs = []     # ids in submission order
        self.ended = {}    # id -> {"state", "error", "rows", "differs", "checkpoints", ...}
        self.submitted = {}  # id -> seconds into the run
        self.reference = None
        self.faults = []   # dicts: kind, service, t, recovered_s, ...
        self.start = time.time()
        self._last_sample = 0.0

    def mount(self, path, size):
        os.makedirs(path, exist_ok=True)
        if os.geteuid() != 0:
            return False
        if sh(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path]).returncode != 0:
            return False
        self.mounts.append(path)
        return True

    def close_net(self):
        for relay in self.relays:
            relay.close()
        if self.net is not None:
            self.net.close()
            self.net = None

    def unmount_all(self):
        for path in self.mounts:
            sh(["mount", "-o", "remount,rw", path])
            sh(["umount", "-l", path])

    # --- jobs -------------------------------------------------------------------------------

    def config(self, tag=None):
        tag = tag or f"job{len(self.jobs)}"
        config = chaos.job_config(self.cluster, tag)
        config["algorithm"]["steps"] = self.args.steps
        config["checkpoint"]["every_steps"] = EVERY
        config["checkpoint"]["dir"] = os.path.join(self.ckpt, tag)
        if self.args.trainers > 1:
            config["trainer"] = {"data_parallel": self.args.trainers}
        return config

    def job(self, job_id):
        status, job = su.http_quiet("GET", f"{self.cluster.rest}/v1/jobs/{job_id}", timeout=5)
        return job if status == 200 else None

    def current(self):
        """The job in progress, submitting a new one when the last ended."""
        if self.jobs:
            job = self.job(self.jobs[-1])
            if job is None or job["state"] in ("QUEUED", "RUNNING"):
                return self.jobs[-1]
            if self.jobs[-1] not in self.ended and not self.account(self.jobs[-1], job):
                return self.jobs[-1]
        status, reply = su.http_quiet("POST", f"{self.cluster.rest}/v1/jobs", self.config(),
                                      timeout=10)
        if status == 201:
            self.jobs.append(reply["id"])
            self.tags[reply["id"]] = f"job{len(self.jobs) - 1}"
            self.submitted[reply["id"]] = time.time() - self.start
            return reply["id"]
        return self.jobs[-1] if self.jobs else None

    def account(self, job_id, job):
        """Records an ended job: state, rows, rows equal to the reference's, checkpoint folder
        (then removed). False when its rows could not be read now (retried later)."""
        status, metrics = su.http_quiet("GET", f"{self.cluster.rest}/v1/jobs/{job_id}/metrics",
                                        timeout=10)
        if status != 200:
            return False
        rows = metrics["steps"]
        steps = [r["step"] for r in rows]
        entry = {"state": job["state"], "error": job.get("error", ""), "rows": len(rows),
                 "rows_once": steps == list(range(len(rows))),
                 "submitted_s": round(self.submitted.get(job_id, 0), 1),
                 "ended_by_s": round(time.time() - self.start, 1)}
        if job["state"] == "SUCCEEDED":
            entry["rows_once"] = steps == list(range(self.args.steps + 1))
            if self.reference is None and entry["rows_once"]:
                self.reference = rows
            entry["differs"] = self.differs(rows)
        else:
            entry["differs"] = self.differs(rows)
        tag = self.tags[job_id]
        folder = os.path.join(self.ckpt, tag, job_id)
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        entry["checkpoints"] = names
        if job["state"] == "SUCCEEDED":
            want = [f"step-{s}" for s in range(EVERY, self.args.steps + 1, EVERY)]
            entry["checkpoints_ok"] = sorted(names, key=lambda n: (len(n), n)) == want
        shutil.rmtree(os.path.join(self.ckpt, tag), ignore_errors=True)
        self.ended[job_id] = entry
        return True

    def differs(self, rows):
        """Rows (of the steps both have) whose deterministic values differ from the
        reference's: [(step, {key: (got, want)})]."""
        if self.reference is None:
            return []
        out = []
        for row, ref in zip(rows, self.reference):
            got = {k: v for k, v in row["metrics"].items() if not chaos.volatile(k)}
            want = {k: v for k, v in ref["metrics"].items() if not chaos.volatile(k)}
            diff = {k: (got.get(k), want.get(k)) for k in set(got) | set(want)
                    if got.get(k) != want.get(k)}
            if diff:
                out.append((row["step"], diff))
        return out

    def rows(self, job_id):
        status, metrics = su.http_quiet("GET", f"{self.cluster.rest}/v1/jobs/{job_id}/metrics",
                                        timeout=5)
        return len(metrics["steps"]) if status == 200 else None

    def progress(self, job_id):
        """(state, sub-phase of the RL step, step in progress) of the job now, or None."""
        job = self.job(job_id)
        if job is None:
            return None
        p = job.get("progress") or {}
        step = p.get("done", -1) + 1 if p.get("phase") == "rl" else -1
        return job["state"], p.get("detail") if p.get("phase") == "rl" else p.get("phase"), step

    def events(self, job_id):
        status, reply = su.http_quiet("GET", f"{self.cluster.rest}/v1/jobs/{job_id}/events",
                                      timeout=5)
        return reply["events"] if status == 200 else []

    def coordinator_metrics(self):
        status, text = su.http_quiet("GET", f"{self.cluster.rest}/metrics", timeout=5)
        return text if status == 200 else ""

    # --- sampling ---------------------------------------------------------------------------

    def sample(self):
        now = time.time() - self.start
        self.loads.append((round(now, 1), os.getloadavg()[0]))
        for name, s in read_services(self.cluster).items():
            got = proc_sample(s["pid"])
            if got is not None:
                rss, fds, threads = got
                self.samples.append({"t": round(now, 1), "service": name, "pid": s["pid"],
                                     "rss_mib": round(rss, 2), "fds": fds, "threads": threads})
        # The job store's files (jobs.db, -wal, -shm) in MiB, in the rss_mib column.
        self.samples.append({"t": round(now, 1), "service": "jobs.db", "pid": 0,
                             "rss_mib": round(store_bytes(self.cluster) / 2**20, 3), "fds": 0,
                             "threads": 0})

    def sample_if_due(self):
        if time.time() - self._last_sample >= self.args.sample_every:
            self._last_sample = time.time()
            self.sample()

    def idle(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            self.sample_if_due()
            time.sleep(min(0.5, max(0.0, end - time.time())))

    def wait_progress(self, job_id, since_rows, timeout=600):
        """Waits until a job records a new row: `job_id` beyond since_rows, or, when it ended
        (FAILED by the fault, or SUCCEEDED), the job after it; True when one did in time."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            job = self.job(job_id)
            rows = self.rows(job_id)
            if rows is not None and rows > since_rows:
                return True
            if job is not None and job["state"] == "SUCCEEDED":
                return True
            if job is not None and job["state"] not in ("QUEUED", "RUNNING"):
                following = self.current()
                if following != job_id:
                    job_id, since_rows = following, 0
            self.sample_if_due()
            time.sleep(0.25)
        return False

    # --- faults -----------------------------------------------------------------------------

    def wait_step(self, low, high, detail=None, timeout=120):
        """The job in progress once its step is in [low, high] (and in sub-phase `detail`);
        (job id, rows) or (None, None)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            job_id = self.current()
            got = self.progress(job_id) if job_id else None
            if got is not None and got[0] == "RUNNING" and low <= got[2] <= high and \
                    (detail is None or got[1] == detail):
                return job_id, self.rows(job_id) or 0
            self.sample_if_due()
            time.sleep(0.02 if detail else 0.1)
        return None, None

    def trainer_names(self):
        return ["trainer"] + [f"trainer-{i}" for i in range(1, self.args.trainers)]

    def fault_trainers(self):
        """The trainer ranks a fault may hit: all, or all but rank 0 with --spare-rank0."""
        names = self.trainer_names()
        return names[1:] if self.args.spare_rank0 else names

    def inject(self):
        kind = self.rng.choice(self.kinds)
        fault = {"t": round(time.time() - self.start, 1), "kind": kind}
        if kind in PROCESS_KINDS:
            name = self.rng.choice(["coordinator", "weight-sync"] + self.fault_trainers() +
                                   [f"generation-worker-{i}" for i in range(WORKERS)])
            fault["service"] = name
            if kind == "stop":
                fault["hold_s"] = round(self.rng.uniform(8, 20), 1)
        elif kind == "ckpt-corrupt":
            fault["how_seed"] = self.rng.randrange(1 << 31)
        elif kind in RANK_KINDS:
            fault["service"] = self.rng.choice(self.fault_trainers())
        elif kind == "net-slow":
            fault["hold_s"] = round(self.rng.uniform(8, 20), 1)
            fault["rate"] = "8mbit"
            fault["loss_pct"] = self.rng.choice([2, 3, 4, 5])
        elif kind == "net-lossy":
            fault["hold_s"] = round(self.rng.uniform(8, 20), 1)
            fault["loss_pct"] = self.rng.choice([5, 10, 15, 20])
        elif kind == "net-partition":
            # Longer than the worker expiry (5 s): the coordinator must drop the worker.
            fault["hold_s"] = round(self.rng.uniform(EXPIRY_S + 3, 30), 1)
        elif kind == "burst":
            fault["size"] = MAX_QUEUED + self.rng.randint(1, 4)
            # For the i-th accepted job: cancel it at once (True) or let it run (False).
            fault["cancel_mask"] = [self.rng.random() < 0.5 for _ in range(fault["size"])]
        else:
            low, high = (2, 7) if kind == "store-full" else (3, 10)
            fault["hold_s"] = round(self.rng.uniform(low, high), 1)
        t0 = time.time()
        getattr(self, "inject_" + kind.replace("-", "_"))(fault, t0)
        fault["lifted_at_s"] = round(time.time() - self.start, 1)
        self.faults.append(fault)
        print(f"[{fault['t']:7.1f} s] {json.dumps(fault)}", flush=True)

    def finish(self, fault, t0, job_id, rows):
        """Waits for the next row after the fault and records the time to recover and the
        fault events the job stored since the fault."""
        ok = self.wait_progress(job_id, rows) if job_id else False
        fault["job"] = job_id
        fault["recovered_s"] = round(time.time() - t0, 1) if ok else None
        if job_id:
            since = (t0 - 1) * 1000
            got = [e for e in self.events(job_id) if e["recorded_unix_ms"] >= since]
            fault["events"] = [e["kind"] for e in got]
            return got
        return []

    def inject_kill(self, fault, t0):
        job_id = self.current()
        rows = self.rows(job_id) if job_id else 0
        pid = read_services(self.cluster).get(fault["service"], {}).get("pid")
        if pid is None:
            fault["skipped"] = "service not running"
            return
        os.kill(pid, signal.SIGKILL)
        self.finish(fault, t0, job_id, rows or 0)

    def inject_stop(self, fault, t0):
        job_id = self.current()
        rows = self.rows(job_id) if job_id else 0
        pid = read_services(self.cluster).get(fault["service"], {}).get("pid")
        if pid is None:
            fault["skipped"] = "service not running"
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            self.idle(fault["hold_s"])
        finally:
            os.kill(pid, signal.SIGCONT)
        self.finish(fault, t0, job_id, rows or 0)

    def inject_rank_kill(self, fault, t0):
        job_id, rows = self.wait_step(1, self.args.steps, detail="train")
        if job_id is None:
            fault["skipped"] = "no job reached a train phase"
            return
        pid = read_services(self.cluster)[fault["service"]]["pid"]
        os.kill(pid, signal.SIGKILL)
        fault["step"] = self.progress(job_id)[2]
        self.finish(fault, t0, job_id, rows)
        fault["seen"] = "trainer_lost" in fault.get("events", [])

    def inject_push_rank_kill(self, fault, t0):
        """A rank SIGKILLed while the group publishes the step's version (the "publish" phase:
        the ranks agree on the version, then upload their parts to weight sync). As
        test_trainer_group_chaos.py (b) does: weight sync is stopped while the step is in its
        "train" phase, so the publish cannot end before the kill; once the job is in that step's
        "publish" phase (and 0.2 s on, the call under way) the rank is killed and weight sync
        continued."""
        deadline = time.time() + 120
        sync = read_services(self.cluster)["weight-sync"]["pid"]
        tries = 0
        while True:
            job_id, rows = self.wait_step(1, self.args.steps - 2, detail="train",
                                          timeout=max(1, deadline - time.time()))
            if job_id is None:
                fault["skipped"] = "no job reached a train phase with weight sync stoppable"
                return
            step = self.progress(job_id)[2]
            tries += 1
            os.kill(sync, signal.SIGSTOP)
            if self.progress(job_id) == ("RUNNING", "train", step):
                break
            os.kill(sync, signal.SIGCONT)
        try:
            while True:
                got = self.progress(job_id)
                if got == ("RUNNING", "publish", step):
                    break
                if got is None or got[0] != "RUNNING" or got[1:] != ("train", step) or \
                        time.time() > deadline:
                    fault["skipped"] = f"the job left step {step}'s train phase for {got}"
                    return
                time.sleep(0.01)
            time.sleep(0.2)  # the publish call is under way; weight sync cannot take it
            t0 = time.time()
            fault["t"] = round(t0 - self.start, 1)
            os.kill(read_services(self.cluster)[fault["service"]]["pid"], signal.SIGKILL)
        finally:
            os.kill(sync, signal.SIGCONT)
        fault["step"], fault["tries"] = step, tries
        # The loss shows at the publish call (rank 0, the uploader, or any rank of a sharded
        # group) or, when the killed rank's part of the publish had ended (rank 1 of an
        # unsharded group only exports locally), at the group's next call. Recovered: a new row
        # after the group formed again (or the job's end).
        reformed = self.wait_event(job_id, t0, "group_reformed", timeout=180)
        events = self.finish(fault, t0, job_id, self.rows(job_id) or rows if reformed else rows)
        lost = [e["message"] for e in events if e["kind"] == "trainer_lost"]
        fault["lost"] = [m[:160] for m in lost]
        fault["lost_in"] = "publish" if any(m.startswith("publish:") for m in lost) else \
            lost[0].split(":")[0] if lost else None
        fault["seen"] = bool(lost) and "group_reformed" in fault["events"]

    def wait_event(self, job_id, t0, kind, timeout):
        """True once job `job_id` has recorded an event `kind` since t0; False when it ended
        or the time ran out first."""
        deadline = time.time() + timeout
        since = (t0 - 1) * 1000
        while time.time() < deadline:
            if any(e["kind"] == kind and e["recorded_unix_ms"] >= since
                   for e in self.events(job_id)):
                return True
            job = self.job(job_id)
            if job is not None and job["state"] not in ("QUEUED", "RUNNING"):
                return False
            self.sample_if_due()
            time.sleep(0.1)
        return False

    # --- network faults (generation-worker-1 in the soak's namespace) --------------------------

    def setup_net(self):
        """Moves NET_WORKER into a network namespace: the namespace and veth pair, relays at
        the host end to the coordinator's and weight sync's gRPC ports, netns.json for the
        worker's wrapper; then the worker is SIGKILLed and `fp8rl up` restarts it through the
        wrapper, inside the namespace. Waits until it runs there and is live again."""
        net_fault.remove_stale()
        self.net = net_fault.NetNamespace(random.Random(self.args.seed))
        o = self.cluster.offset
        for port in (50051 + o, 50052 + o):  # coordinator, weight sync (gRPC)
            self.relays.append(soak_net.Relay((self.net.host_ip, port), ("127.0.0.1", port)))
        soak_net.write_netns(self.netns_file, NET_WORKER, self.net)
        old = read_services(self.cluster)[NET_WORKER]["pid"]
        os.kill(old, signal.SIGKILL)
        ours = soak_net.net_namespace_of(os.getpid())
        deadline = time.time() + 180
        while True:
            pid = read_services(self.cluster).get(NET_WORKER, {}).get("pid")
            inside = pid not in (None, old) and soak_net.net_namespace_of(pid) not in (None, ours)
            if inside and self.live_generation() == WORKERS:
                break
            if time.time() > deadline:
                raise SystemExit(f"{NET_WORKER} not live inside {self.net.name} within 180 s "
                                 f"(pid {pid}, live generation workers {self.live_generation()})")
            time.sleep(0.5)
        self.setup = {"net_worker": NET_WORKER, "netns": self.net.name,
                      "host_ip": self.net.host_ip, "ns_ip": self.net.ns_ip,
                      "setup_kill_pid": old, "pid_in_namespace": pid}
        print(f"{NET_WORKER} runs in {self.net.name} ({self.net.ns_ip}; host end "
              f"{self.net.host_ip}), pid {pid}", flush=True)

    def live_generation(self):
        m = re.search(r'^fp8rl_coordinator_live_workers\{kind="generation"\} (\S+)$',
                      self.coordinator_metrics(), re.M)
        return int(float(m.group(1))) if m else None

    def inject_net(self, fault):
        """Applies the fault to the namespace's link while a job is in its RL steps, holds it,
        heals. Recovery: the job's next row after the heal; for a partition also the time from
        the heal until the worker is live again."""
        job_id, rows = self.wait_step(1, self.args.steps - 2)
        if job_id is None:
            fault["skipped"] = "no job reached its RL steps"
            return
        kind = fault["kind"]
        expired_before = metric_sum(self.coordinator_metrics(),
                                    "fp8rl_coordinator_workers_expired_total")
        t0 = time.time()
        fault["t"] = round(t0 - self.start, 1)
        fault["step"] = (self.progress(job_id) or (0, 0, -1))[2]
        try:
            if kind == "net-slow":
                self.net.slow(rate=fault["rate"])
                self.net.lossy(fault["loss_pct"])
            elif kind == "net-lossy":
                self.net.lossy(fault["loss_pct"])
            else:
                self.net.partition()
            fault["applied"] = list(self.net.faults)
            lows = []
            end = time.time() + fault["hold_s"]
            while time.time() < end:
                if kind == "net-partition":
                    lows.append(self.live_generation())
                self.sample_if_due()
                time.sleep(min(0.5, max(0.0, end - time.time())))
        finally:
            self.net.heal()
        healed = time.time()
        fault["rows_during"] = (self.rows(job_id) or 0) - rows
        if kind == "net-partition":
            fault["live_min_during"] = min((v for v in lows if v is not None), default=None)
            while self.live_generation() != WORKERS and time.time() - healed < 120:
                self.sample_if_due()
                time.sleep(0.2)
            back = self.live_generation() == WORKERS
            fault["rejoined_s"] = round(time.time() - healed, 1) if back else None
            expired = metric_sum(self.coordinator_metrics(),
                                 "fp8rl_coordinator_workers_expired_total") - expired_before
            fault["workers_expired"] = expired
            fault["seen"] = expired >= 1 and back
        self.finish(fault, t0, job_id, rows)

    def inject_net_slow(self, fault, t0):
        self.inject_net(fault)

    def inject_net_lossy(self, fault, t0):
        self.inject_net(fault)

    def inject_net_partition(self, fault, t0):
        self.inject_net(fault)

    # --- overload -----------------------------------------------------------------------------

    def post_job(self, config):
        """(status, reply, Retry-After header) of one submission."""
        request = urllib.request.Request(
            f"{self.cluster.rest}/v1/jobs", data=json.dumps(config).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, json.loads(response.read().decode()), None
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            return e.code, text[:200], e.headers.get("Retry-After")
        except (urllib.error.URLError, OSError) as e:
            return None, str(e)[:200], None

    def inject_burst(self, fault, t0):
        """fault["size"] submissions at once (threads), beyond --max-queued-jobs: the excess
        must be answered 429 with Retry-After and counted in
        fp8rl_coordinator_requests_refused_total{reason="queue_full"}. Accepted jobs join the
        soak's jobs (accounted like every other); those the seed marks are cancelled at once
        (accounted as cancelled by the soak)."""
        job_id = self.current()
        rows = (self.rows(job_id) or 0) if job_id else 0
        listed = su.http_quiet("GET", f"{self.cluster.rest}/v1/jobs?state=QUEUED", timeout=10)
        fault["queued_before"] = len((listed[1] or {}).get("jobs", [])) \
            if listed[0] == 200 else None
        refused_before = self.refused_queue_full()
        self.burst_count += 1
        configs = [self.config(f"burst{self.burst_count}-{i}") for i in range(fault["size"])]
        results = [None] * len(configs)

        def submit(i):
            results[i] = self.post_job(configs[i]) + (time.time(),)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(configs))]
        t0 = time.time()
        fault["t"] = round(t0 - self.start, 1)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        accepted, refused, other = [], [], []
        for i, (status, reply, retry_after, at) in enumerate(results):
            if status == 201:
                accepted.append((at, reply["id"], configs[i]))
            elif status == 429:
                refused.append(retry_after)
            else:
                other.append((status, reply))
        accepted.sort(key=lambda a: a[0])
        cancelled = []
        for n, (at, new_id, config) in enumerate(accepted):
            self.jobs.append(new_id)
            self.tags[new_id] = os.path.basename(config["checkpoint"]["dir"])
            self.submitted[new_id] = at - self.start
            if fault["cancel_mask"][n]:
                status, _ = su.http_quiet("POST", f"{self.cluster.rest}/v1/jobs/{new_id}:cancel",
                                          timeout=10)
                if status == 200:
                    self.cancelled.add(new_id)
                    cancelled.append(new_id)
        fault["accepted"], fault["refused"], fault["cancelled"] = (
            len(accepted), len(refused), len(cancelled))
        fault["accepted_ids"] = [a[1] for a in accepted]
        fault["retry_after"] = sorted(set(str(r) for r in refused))
        fault["other"] = other
        fault["refused_counted"] = self.refused_queue_full() - refused_before
        fault["seen"] = bool(refused) and all(r is not None for r in refused) and \
            fault["refused_counted"] == len(refused) and not other
        self.finish(fault, t0, job_id, rows)

    def refused_queue_full(self):
        m = re.search(r'^fp8rl_coordinator_requests_refused_total\{reason="queue_full"\} (\S+)$',
                      self.coordinator_metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def inject_ckpt_corrupt(self, fault, t0):
        # Two checkpoints taken (a previous one to fall back to: the step in progress is past
        # the second) and the job not at its end.
        job_id, rows = self.wait_step(2 * EVERY + 1, self.args.steps - 1)
        if job_id is None:
            fault["skipped"] = "no job reached its second checkpoint"
            return
        before = metric_sum(self.coordinator_metrics(),
                            "fp8rl_coordinator_checkpoint_fallbacks_total")
        pids = [read_services(self.cluster)[n]["pid"] for n in self.trainer_names()]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)  # nothing is written from here on
        time.sleep(0.5)  # a save that returned just before the stop is recorded by now
        path, step = fallback.recorded_checkpoint(self.cluster, job_id)
        if path and os.path.isdir(path):
            fault["corrupted"] = path
            fault["how"] = fallback.corrupt(path, random.Random(fault["how_seed"]))
        # With --spare-rank0 rank 0 is continued, not killed: losing rank 1 breaks the group.
        killed = self.fault_trainers()
        fault["killed"] = killed
        for name, pid in zip(self.trainer_names(), pids):
            os.kill(pid, signal.SIGKILL if name in killed else signal.SIGCONT)
        self.finish(fault, t0, job_id, rows)
        after = metric_sum(self.coordinator_metrics(),
                           "fp8rl_coordinator_checkpoint_fallbacks_total")
        fault["seen"] = "checkpoint_fallback" in fault.get("events", []) and after > before

    def inject_ckpt_readonly(self, fault, t0):
        job_id = self.current()
        rows = self.rows(job_id) if job_id else 0
        # A remount read-only is refused (EBUSY) while the trainer has a checkpoint file open.
        deadline = time.time() + 30
        while sh(["mount", "-o", "remount,ro", self.ckpt]).returncode != 0:
            if time.time() > deadline:
                fault["skipped"] = "tmpfs busy for 30 s"
                return
            time.sleep(0.02)
        try:
            self.idle(fault["hold_s"])
        finally:
            p = sh(["mount", "-o", "remount,rw", self.ckpt])
            if p.returncode != 0:
                raise SystemExit(f"cannot remount {self.ckpt} writable: {p.stderr}")
        self.finish(fault, t0, job_id, rows or 0)

    def inject_ckpt_full(self, fault, t0):
        job_id = self.current()
        rows = self.rows(job_id) if job_id else 0
        filler = fill(self.ckpt)
        try:
            self.idle(fault["hold_s"])
        finally:
            os.remove(filler)
        self.finish(fault, t0, job_id, rows or 0)

    def inject_store_full(self, fault, t0):
        job_id = self.current()
        rows = self.rows(job_id) if job_id else 0
        before = metric_sum(self.coordinator_metrics(),
                            "fp8rl_coordinator_store_write_failures_total")
        filler = fill(self.store)
        try:
            self.idle(fault["hold_s"])
        finally:
            os.remove(filler)
        self.finish(fault, t0, job_id, rows or 0)
        after = metric_sum(self.coordinator_metrics(),
                           "fp8rl_coordinator_store_write_failures_total")
        fault["store_write_failures"] = after - before

    # --- the run ----------------------------------------------------------------------------

    def run(self):
        self.cluster.wait_up(timeout=300)
        if set(self.kinds) & set(NET_KINDS):
            self.setup_net()
        end = self.start + self.args.minutes * 60
        next_fault = time.time() + self.args.fault_every
        while time.time() < end:
            self.current()
            self.sample_if_due()
            if time.time() >= next_fault:
                self.inject()
                next_fault = time.time() + self.args.fault_every
            time.sleep(1.0)
        # Let the last job finish, then account for every job.
        t0 = time.time()
        while time.time() - t0 < 900:
            job = self.job(self.jobs[-1]) if self.jobs else None
            if job is not None and job["state"] not in ("QUEUED", "RUNNING"):
                break
            time.sleep(1)
        for job_id in self.jobs:
            if job_id not in self.ended:
                job = self.job(job_id)
                if job is not None and job["state"] not in ("QUEUED", "RUNNING"):
                    self.account(job_id, job)
        self.sample()


def explained(soak, job_id, entry):
    """The storage fault whose error a FAILED job names, when one was in force while it ran."""
    for f in soak.faults:
        want = STORAGE_ERRORS.get(f["kind"])
        if want and want in entry["error"] and "skipped" not in f and \
                f["t"] <= entry["ended_by_s"] and f["lifted_at_s"] >= entry["submitted_s"]:
            return f["kind"]
    return None


def summarize(soak, args):
    listed = su.http_quiet("GET", f"{soak.cluster.rest}/v1/jobs", timeout=10)[1]
    states = {j["id"]: j["state"] for j in (listed or {}).get("jobs", [])}
    lost = [j for j in soak.jobs if j not in states or j not in soak.ended]
    failed_by_fault, unexplained, differs, bad_ckpt = {}, {}, {}, []
    cancelled = 0
    for job_id, e in soak.ended.items():
        if e["state"] == "CANCELLED" and job_id in soak.cancelled and not e["differs"]:
            cancelled += 1
        elif e["state"] == "SUCCEEDED":
            if not e["rows_once"] or e["differs"]:
                differs[job_id] = e["differs"][:2] or "rows not 0..N once"
            if not e.get("checkpoints_ok"):
                bad_ckpt.append((job_id, e["checkpoints"]))
        else:
            kind = explained(soak, job_id, e)
            if kind and e["rows_once"] and not e["differs"]:
                failed_by_fault[kind] = failed_by_fault.get(kind, 0) + 1
            else:
                unexplained[job_id] = (e["state"], e["error"], e["rows"], e["differs"][:1])
    services = {}
    warmup = args.warmup_minutes * 60
    for name in sorted({s["service"] for s in soak.samples}):
        mine = [s for s in soak.samples if s["service"] == name and s["t"] >= warmup]
        # The longest run of samples under one pid (a restart starts a new process).
        runs, cur = [], []
        for s in mine:
            if cur and s["pid"] != cur[-1]["pid"]:
                runs.append(cur)
                cur = []
            cur.append(s)
        if cur:
            runs.append(cur)
        best = max(runs, key=len) if runs else []
        # The same process's samples from its start (warm-up included) and the second half of
        # its life: a slope that stays up there is a leak, one that flattens was warm-up.
        pid = best[0]["pid"] if best else None
        life = [s for s in soak.samples if s["service"] == name and s["pid"] == pid]
        late = [s for s in best if s["t"] >= (best[0]["t"] + best[-1]["t"]) / 2] if best else []
        services[name] = {
            "longest_life_pid": pid,
            "longest_life_min": round((life[-1]["t"] - life[0]["t"]) / 60, 1) if life else 0,
            "rss_mib_life_first_last": [life[0]["rss_mib"], life[-1]["rss_mib"]] if life else None,
            "rss_mib_per_hour_second_half": slope_per_hour([(s["t"], s["rss_mib"])
                                                            for s in late]),
            "samples": len(best),
            "span_min": round((best[-1]["t"] - best[0]["t"]) / 60, 1) if best else 0,
            "restarts": max(0, len({s["pid"] for s in soak.samples if s["service"] == name}) - 1),
            "rss_mib_first_last": [best[0]["rss_mib"], best[-1]["rss_mib"]] if best else None,
            "rss_mib_per_hour": slope_per_hour([(s["t"], s["rss_mib"]) for s in best]),
            "fds_first_last": [best[0]["fds"], best[-1]["fds"]] if best else None,
            "fds_per_hour": slope_per_hour([(s["t"], s["fds"]) for s in best]),
            "threads_first_last": [best[0]["threads"], best[-1]["threads"]] if best else None,
            "threads_per_hour": slope_per_hour([(s["t"], s["threads"]) for s in best]),
        }
    injected = [f for f in soak.faults if "skipped" not in f]
    per_kind = {}
    for f in injected:
        k = per_kind.setdefault(f["kind"], {"injected": 0, "recovered": 0, "recover_s": []})
        k["injected"] += 1
        if f.get("recovered_s") is not None:
            k["recovered"] += 1
            k["recover_s"].append(f["recovered_s"])
        if "seen" in f:
            k["seen"] = k.get("seen", 0) + int(bool(f["seen"]))
        for field in ("accepted", "refused", "cancelled", "refused_counted", "workers_expired"):
            if field in f:
                k[field] = k.get(field, 0) + f[field]
        if f.get("rejoined_s") is not None:
            k.setdefault("rejoined_s", []).append(f["rejoined_s"])
        if f.get("recovered_s") is None:
            k.setdefault("not_recovered_at_s", []).append(f["t"])
    for k in per_kind.values():
        if "rejoined_s" in k:
            k["rejoined_s_p50"] = percentile(k["rejoined_s"], 0.5)
            k["rejoined_s_max"] = max(k.pop("rejoined_s"))
        k["recover_s_p50"] = percentile(k["recover_s"], 0.5)
        k["recover_s_p99"] = percentile(k["recover_s"], 0.99)
        del k["recover_s"]
    recovered = [f["recovered_s"] for f in injected if f.get("recovered_s") is not None]
    loads = [v for _, v in soak.loads]
    # For "jobs.db" the rss_mib fields are the store's size on disk (MiB), fds/threads are 0.
    summary = {
        "seed": args.seed, "minutes": args.minutes, "fault_every_s": args.fault_every,
        "trainers": args.trainers, "steps_per_job": args.steps, "kinds": soak.kinds,
        "spare_rank0": args.spare_rank0, "setup": soak.setup,
        "max_queued_jobs": MAX_QUEUED if "burst" in soak.kinds else None,
        "jobs": len(soak.jobs),
        "jobs_succeeded": sum(1 for e in soak.ended.values() if e["state"] == "SUCCEEDED"),
        "jobs_cancelled_by_soak": cancelled,
        "jobs_failed_naming_the_fault": failed_by_fault, "jobs_lost": lost,
        "jobs_unexplained": unexplained, "jobs_rows_differ": differs,
        "jobs_bad_checkpoints": bad_ckpt[:10],
        "reference_rows": len(soak.reference or []),
        "faults_injected": len(injected), "faults_skipped": len(soak.faults) - len(injected),
        "faults_recovered": len(recovered),
        "recover_s_p50": percentile(recovered, 0.5), "recover_s_p99": percentile(recovered, 0.99),
        "per_kind": per_kind,
        "load1_min_median_max": [min(loads), statistics.median(loads), max(loads)] if loads else None,
        "services": services, "faults": soak.faults,
    }
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=120)
    parser.add_argument("--fault-every", type=float, default=180, help="seconds between faults")
    parser.add_argument("--sample-every", type=float, default=10, help="seconds between samples")
    parser.add_argument("--warmup-minutes", type=float, default=3)
    parser.add_argument("--steps", type=int, default=12, help="RL steps per job")
    parser.add_argument("--trainers", type=int, default=1,
                        help="trainer ranks (2: every job is a data-parallel group of 2)")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 31))
    parser.add_argument("--kinds", default="",
                        help=f"comma-separated fault kinds to draw from (default: every one this "
                        f"machine allows): {','.join(ALL_KINDS)}")
    parser.add_argument("--spare-rank0", action="store_true",
                        help="no fault kills or stops trainer rank 0 (\"trainer\"): one process "
                        "for the whole run, to tell a leak from warm-up")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.minutes <= 0 or args.fault_every <= 0 or args.sample_every <= 0:
        parser.error("--minutes, --fault-every, --sample-every: must be > 0")
    if args.steps < 2 * EVERY + 1:
        parser.error(f"--steps: must be >= {2 * EVERY + 1} (two checkpoints before the end)")
    if args.trainers not in (1, 2):
        parser.error("--trainers: must be 1 or 2")
    unknown = [k for k in args.kinds.split(",") if k and k not in ALL_KINDS]
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; known: {','.join(ALL_KINDS)}")
    su.require_binaries()
    os.makedirs(args.out, exist_ok=True)
    soak = Soak(args)
    print(f"soak seed {args.seed}: {args.minutes} min, a fault every {args.fault_every} s, "
          f"{args.trainers} trainer(s){', rank 0 spared' if args.spare_rank0 else ''}, "
          f"kinds {soak.kinds}, in {soak.tmp}", flush=True)
    ok = False
    summary = None
    try:
        soak.run()
        summary = summarize(soak, args)
        soak.cluster.pids = {n: s["pid"] for n, s in read_services(soak.cluster).items()}
        soak.cluster.stop(expect_rc=0)
        ok = not (summary["jobs_lost"] or summary["jobs_unexplained"] or
                  summary["jobs_rows_differ"] or summary["jobs_bad_checkpoints"] or
                  summary["reference_rows"] != args.steps + 1)
    finally:
        soak.cluster.kill_all()
        soak.close_net()
        soak.unmount_all()
        with open(os.path.join(args.out, "samples.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, ["t", "service", "pid", "rss_mib", "fds", "threads"])
            writer.writeheader()
            writer.writerows(soak.samples)
        with open(os.path.join(args.out, "jobs.json"), "w") as f:
            json.dump({"order": soak.jobs, "ended": soak.ended}, f, indent=1)
        with open(os.path.join(args.out, "faults.json"), "w") as f:
            json.dump(soak.faults, f, indent=1)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("faults", "services")},
                     indent=1))
    print(json.dumps(summary["services"], indent=1))
    print("PASS" if ok else "FAIL: a job was lost, differs, or ended in a way no fault explains")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
