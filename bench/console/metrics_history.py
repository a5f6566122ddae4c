#!/usr/bin/env python3
"""Benchmark: what the web console's metrics poll costs on a long job. Writes a job store with
one job of STEPS steps (every charted metric on every row, val_accuracy every 100 steps; the
same writer as tests/system/test_console_long_job.py), starts the real coordinator on it and
times GET /v1/jobs/{id}/metrics in full, with ?max_points=400 (what the console asks for), and
the console's repeat poll (If-None-Match, answered 304). Prints a markdown table for
docs/perf.md. Usage: bench/console/metrics_history.py [STEPS] (default 10000), from the
repository root after a build."""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "system"))
import console_charts  # noqa: E402
import system_util as su  # noqa: E402
import test_console_long_job as long_job  # noqa: E402


def timed_get(url, headers=None, repeats=5):
    times, size, status, etag = [], 0, 0, None
    for _ in range(repeats):
        req = urllib.request.Request(url, headers=headers or {})
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                body, status, etag = r.read(), r.status, r.headers.get("ETag")
        except urllib.error.HTTPError as e:
            body, status = e.read(), e.code
        times.append(time.perf_counter() - start)
        size = len(body)
    return statistics.median(times), size, status, etag


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    long_job.STEPS = steps
    keys = sorted({s["key"] for c in console_charts.chart_list()["charts"] for s in c["series"]})
    tmp = tempfile.mkdtemp(prefix="fp8rl-bench-console-")
    long_job.write_store(os.path.join(tmp, "jobs.db"), keys)
    port = 8080 + su.free_port_offset(workers=0)
    proc = subprocess.Popen([os.path.join(su.BIN_DIR, "fp8rl-coordinator"), "--listen-host",
                             "127.0.0.1", "--http-port", str(port), "--grpc-port",
                             str(port + 50051 - 8080), "--data-dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}/v1/jobs/{long_job.JOB_ID}/metrics"
        while su.http_quiet("GET", f"http://127.0.0.1:{port}/healthz")[0] != 200:
            time.sleep(0.2)
        full = timed_get(base)
        thin = timed_get(base + "?max_points=400")
        again = timed_get(base + "?max_points=400", {"If-None-Match": thin[3]})
        print(f"{steps} steps, {len(keys)} metrics per row; median of 5 requests each")
        print("| request | status | body | time |\n|---|---|---|---|")
        for name, (t, size, status, _) in [("full history", full),
                                            ("`?max_points=400`", thin),
                                            ("`?max_points=400` + If-None-Match", again)]:
            print(f"| {name} | {status} | {size / 1024:.0f} KiB | {t * 1000:.0f} ms |")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
