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

The storage kinds need root (mount -t tmpfs); without it they are left out and the run says so.
With --trainers 2 every job is a data-parallel group of 2 (`trainer.data_parallel`).

What is expected: every job SUCCEEDS with metrics rows 0..N exactly once whose values equal the
first job's (run before any fault; test_chaos.py's comparison), except that a job whose
checkpoint falls in a ckpt-readonly / ckpt-full window may end FAILED with an error naming the
read-only or full disk. Each ended job's checkpoint folder is checked (step-K folders only, every
checkpoint.every_steps) and then removed, so the tmpfs does not fill up.

Time to recover: from the fault until a job records a new metrics row after the fault is over
(a SIGSTOP counts its hold; a storage fault counts its hold and, when the job failed, the start
of the next one).

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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "system"))
import system_util as su  # noqa: E402
import test_chaos as chaos  # noqa: E402
import test_checkpoint_fallback as fallback  # noqa: E402

WORKERS = 2
EVERY = 3  # checkpoint.every_steps
PROCESS_KINDS = ["kill", "stop"]
STORAGE_KINDS = ["ckpt-readonly", "ckpt-full", "store-full"]
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
        self.kinds = list(PROCESS_KINDS) + ["ckpt-corrupt"]
        if self.mount(self.ckpt, "256m") and self.mount(self.store, "128m"):
            self.kinds += STORAGE_KINDS
        else:
            print("storage fault kinds left out: mounting a tmpfs needs root", flush=True)
        if args.trainers > 1:
            self.kinds.append("rank-kill")
        self.cluster = su.Cluster(workers=WORKERS, tmp=self.tmp, trainers=args.trainers)
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

    def unmount_all(self):
        for path in self.mounts:
            sh(["mount", "-o", "remount,rw", path])
            sh(["umount", "-l", path])

    # --- jobs -------------------------------------------------------------------------------

    def config(self):
        tag = f"job{len(self.jobs)}"
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
        index = self.jobs.index(job_id)
        folder = os.path.join(self.ckpt, f"job{index}", job_id)
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        entry["checkpoints"] = names
        if job["state"] == "SUCCEEDED":
            want = [f"step-{s}" for s in range(EVERY, self.args.steps + 1, EVERY)]
            entry["checkpoints_ok"] = sorted(names, key=lambda n: (len(n), n)) == want
        shutil.rmtree(os.path.join(self.ckpt, f"job{index}"), ignore_errors=True)
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

    def inject(self):
        kind = self.rng.choice(self.kinds)
        fault = {"t": round(time.time() - self.start, 1), "kind": kind}
        if kind in PROCESS_KINDS:
            name = self.rng.choice(["coordinator", "weight-sync"] + self.trainer_names() +
                                   [f"generation-worker-{i}" for i in range(WORKERS)])
            fault["service"] = name
            if kind == "stop":
                fault["hold_s"] = round(self.rng.uniform(8, 20), 1)
        elif kind == "ckpt-corrupt":
            fault["how_seed"] = self.rng.randrange(1 << 31)
        elif kind == "rank-kill":
            fault["service"] = self.rng.choice(self.trainer_names())
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
            fault["events"] = [e["kind"] for e in self.events(job_id)
                               if e["recorded_unix_ms"] >= since]

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
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
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
    for job_id, e in soak.ended.items():
        if e["state"] == "SUCCEEDED":
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
        services[name] = {
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
    for k in per_kind.values():
        k["recover_s_p50"] = percentile(k["recover_s"], 0.5)
        k["recover_s_p99"] = percentile(k["recover_s"], 0.99)
        del k["recover_s"]
    recovered = [f["recovered_s"] for f in injected if f.get("recovered_s") is not None]
    loads = [v for _, v in soak.loads]
    # For "jobs.db" the rss_mib fields are the store's size on disk (MiB), fds/threads are 0.
    summary = {
        "seed": args.seed, "minutes": args.minutes, "fault_every_s": args.fault_every,
        "trainers": args.trainers, "steps_per_job": args.steps, "kinds": soak.kinds,
        "jobs": len(soak.jobs),
        "jobs_succeeded": sum(1 for e in soak.ended.values() if e["state"] == "SUCCEEDED"),
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
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.minutes <= 0 or args.fault_every <= 0 or args.sample_every <= 0:
        parser.error("--minutes, --fault-every, --sample-every: must be > 0")
    if args.steps < 2 * EVERY + 1:
        parser.error(f"--steps: must be >= {2 * EVERY + 1} (two checkpoints before the end)")
    if args.trainers not in (1, 2):
        parser.error("--trainers: must be 1 or 2")
    su.require_binaries()
    os.makedirs(args.out, exist_ok=True)
    soak = Soak(args)
    print(f"soak seed {args.seed}: {args.minutes} min, a fault every {args.fault_every} s, "
          f"{args.trainers} trainer(s), kinds {soak.kinds}, in {soak.tmp}", flush=True)
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
