#!/usr/bin/env python3
"""Soak run (a benchmark, not a test): a local cluster under `fp8rl up` runs jobs back to back
for a fixed time while a fault is injected every few minutes, and every service's RSS, open file
descriptors and threads plus the job store's size are sampled. At the end it prints a table and
writes a JSON summary: faults injected and recovered, time to recover (p50/p99), every job
accounted for, and per service the RSS / FD / thread slope over its longest life without a
restart (a least-squares line after a warm-up, so a leak shows as a steady rise).

Faults (seeded, printed, rerun with --seed): SIGKILL of the coordinator, weight sync, the trainer
or a generation worker (`fp8rl up` restarts it), or SIGSTOP of one of them for 8-20 s, then
SIGCONT. Time to recover: from the fault until the running job records a new metrics row (a kill
also waits for the service to answer /healthz again).

    bench/soak/soak.py --minutes 30 --fault-every 120 --out /tmp/soak   # build first, as for
                                                                          # tests/system
The JSON summary and the samples (CSV) go to --out. Exit status 1 when a job was lost or did not
end SUCCEEDED, or the cluster did not stop cleanly."""

import argparse
import csv
import json
import os
import random
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "system"))
import system_util as su  # noqa: E402

KINDS = ["coordinator", "weight-sync", "trainer", "generation-worker"]
WORKERS = 2


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


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.cluster = su.Cluster(workers=WORKERS)
        self.samples = []  # dicts
        self.jobs = []     # ids in submission order
        self.faults = []   # dicts: kind, service, start, recovered_s
        self.start = time.time()

    def config(self):
        config = su.smoke_config(os.path.join(self.cluster.tmp, f"job{len(self.jobs)}"),
                                 steps=self.args.steps)
        config["checkpoint"]["every_steps"] = 3
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
        status, reply = su.http_quiet("POST", f"{self.cluster.rest}/v1/jobs", self.config(),
                                      timeout=10)
        if status == 201:
            self.jobs.append(reply["id"])
            return reply["id"]
        return self.jobs[-1] if self.jobs else None

    def sample(self):
        now = time.time() - self.start
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

    def rows(self, job_id):
        status, metrics = su.http_quiet("GET", f"{self.cluster.rest}/v1/jobs/{job_id}/metrics",
                                        timeout=5)
        return len(metrics["steps"]) if status == 200 else None

    def wait_progress(self, job_id, since_rows, timeout=600):
        """Seconds until `job_id` has more rows than since_rows (or ended); None on timeout."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            job = self.job(job_id)
            rows = self.rows(job_id)
            if job is not None and (job["state"] not in ("QUEUED", "RUNNING") or
                                    (rows is not None and rows > since_rows)):
                return time.time() - t0
            self.sample_if_due()
            time.sleep(0.5)
        return None

    def sample_if_due(self):
        if time.time() - getattr(self, "_last_sample", 0) >= self.args.sample_every:
            self._last_sample = time.time()
            self.sample()

    def inject(self):
        kind = self.rng.choice(KINDS)
        name = kind if kind != "generation-worker" else \
            f"generation-worker-{self.rng.randrange(WORKERS)}"
        how = self.rng.choice(["kill", "stop"])
        services = read_services(self.cluster)
        if name not in services:
            return
        pid = services[name]["pid"]
        job_id = self.current()
        rows = self.rows(job_id) if job_id else None
        fault = {"t": round(time.time() - self.start, 1), "service": name, "fault": how,
                 "job": job_id}
        t0 = time.time()
        if how == "kill":
            os.kill(pid, signal.SIGKILL)
        else:
            hold = self.rng.uniform(8, 20)
            fault["hold_s"] = round(hold, 1)
            os.kill(pid, signal.SIGSTOP)
            end = time.time() + hold
            while time.time() < end:
                self.sample_if_due()
                time.sleep(0.5)
            os.kill(pid, signal.SIGCONT)
        recovered = self.wait_progress(job_id, rows or 0) if job_id else None
        fault["recovered_s"] = None if recovered is None else round(time.time() - t0, 1)
        self.faults.append(fault)
        print(f"[{fault['t']:7.1f} s] {how} {name}: job {job_id} progressing again after "
              f"{fault['recovered_s']} s", flush=True)

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
        for job_id in self.jobs:
            t0 = time.time()
            while time.time() - t0 < 900:
                job = self.job(job_id)
                if job is not None and job["state"] not in ("QUEUED", "RUNNING"):
                    break
                time.sleep(1)
        self.sample()


def summarize(soak, args):
    listed = su.http_quiet("GET", f"{soak.cluster.rest}/v1/jobs", timeout=10)[1]
    states = {j["id"]: (j["state"], j.get("error", "")) for j in (listed or {}).get("jobs", [])}
    lost = [j for j in soak.jobs if j not in states]
    not_ok = {j: states[j] for j in soak.jobs if j in states and states[j][0] != "SUCCEEDED"}
    rows_ok = sum(1 for j in soak.jobs if soak.rows(j) == args.steps + 1)
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
    recovered = [f["recovered_s"] for f in soak.faults if f["recovered_s"] is not None]
    # For "jobs.db" the rss_mib fields are the store's size on disk (MiB), fds/threads are 0.
    summary = {
        "seed": args.seed, "minutes": args.minutes, "fault_every_s": args.fault_every,
        "steps_per_job": args.steps, "jobs": len(soak.jobs), "jobs_lost": lost,
        "jobs_not_succeeded": not_ok, "jobs_with_rows_0_to_n": rows_ok,
        "faults": soak.faults, "faults_injected": len(soak.faults),
        "faults_recovered": len(recovered),
        "recover_s_p50": percentile(recovered, 0.5), "recover_s_p99": percentile(recovered, 0.99),
        "services": services,
    }
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=120)
    parser.add_argument("--fault-every", type=float, default=180, help="seconds between faults")
    parser.add_argument("--sample-every", type=float, default=10, help="seconds between samples")
    parser.add_argument("--warmup-minutes", type=float, default=3)
    parser.add_argument("--steps", type=int, default=12, help="RL steps per job")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 31))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.minutes <= 0 or args.fault_every <= 0 or args.sample_every <= 0 or args.steps < 1:
        parser.error("--minutes, --fault-every, --sample-every must be > 0 and --steps >= 1")
    su.require_binaries()
    os.makedirs(args.out, exist_ok=True)
    print(f"soak seed {args.seed}: {args.minutes} min, a fault every {args.fault_every} s",
          flush=True)
    soak = Soak(args)
    ok = False
    try:
        soak.run()
        summary = summarize(soak, args)
        soak.cluster.pids = {n: s["pid"] for n, s in read_services(soak.cluster).items()}
        soak.cluster.stop(expect_rc=0)
        ok = not summary["jobs_lost"] and not summary["jobs_not_succeeded"]
    finally:
        soak.cluster.kill_all()
        with open(os.path.join(args.out, "samples.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, ["t", "service", "pid", "rss_mib", "fds", "threads"])
            writer.writeheader()
            writer.writerows(soak.samples)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "faults"}, indent=1))
    print("PASS" if ok else "FAIL: a job was lost or did not succeed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
