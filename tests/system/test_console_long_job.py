#!/usr/bin/env python3
"""System test: the web console on a job of 10,000 steps. A job store is written with the
coordinator's documented schema (services/coordinator/job_store.h): one finished job, 10,001
metrics rows of random non-zero values for every charted key, val_accuracy on row 0 and every
100th step. The real coordinator serves it; headless Chromium opens the job page and the test
checks that the server thinned the history (at most 400 points per series, first and last step
kept, every val_accuracy point kept), that each drawn value equals the full REST history at its
step, and that later polls are answered 304 (If-None-Match) without redrawing. The coordinator
runs with --auth-token-file: the console's files load without a token, the API answers 401, the
page asks for the token, keeps it in sessionStorage and sends it. Times are printed, not asserted
(targets live in bench/ and docs/perf.md). Skips (77) without chromium."""

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import cdp
import console_charts
import system_util as su

STEPS = 10000
MAX_POINTS = 400  # console.js MAX_POINTS
JOB_ID = "job-1764680000000-10k000"
TOKEN = "console-test-token-0123456789"


def http(url, token=None):
    """(status, parsed JSON or None) with an optional bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, None


def write_store(path, chart_keys):
    rng = random.Random(10000)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, config_json TEXT "
               "NOT NULL, step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER NOT NULL, error "
               "TEXT NOT NULL DEFAULT '', resume INTEGER NOT NULL DEFAULT 0, checkpoint TEXT NOT "
               "NULL DEFAULT '', checkpoint_step INTEGER NOT NULL DEFAULT 0, created_ms INTEGER "
               "NOT NULL, updated_ms INTEGER NOT NULL)")
    db.execute("CREATE TABLE metrics (job_id TEXT NOT NULL, step INTEGER NOT NULL, metrics_json "
               "TEXT NOT NULL, recorded_ms INTEGER NOT NULL, PRIMARY KEY (job_id, step))")
    created = 1764680000000
    config = {"name": "long", "algorithm": {"steps": STEPS}}
    db.execute("INSERT INTO jobs (id, state, config_json, step, total_steps, created_ms, "
               "updated_ms) VALUES (?, 'SUCCEEDED', ?, ?, ?, ?, ?)",
               (JOB_ID, json.dumps(config), STEPS, STEPS, created, created + STEPS * 1000))
    rows = []
    for step in range(STEPS + 1):
        values = {}
        if step > 0:
            values = {k: rng.uniform(0.05, 2.0) for k in chart_keys if k != "val_accuracy"}
        if step % 100 == 0:
            values["val_accuracy"] = rng.uniform(0.1, 0.9)
        rows.append((JOB_ID, step, json.dumps(values), created + step * 1000))
    db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", rows)
    db.commit()
    db.close()


def main():
    su.require_binaries()
    reason = cdp.available()
    if reason:
        print(f"SKIP: {reason}", flush=True)
        sys.exit(su.SKIP)
    charts = console_charts.chart_list()["charts"]
    keys = sorted({s["key"] for c in charts for s in c["series"]})
    tmp = tempfile.mkdtemp(prefix="fp8rl-system-console-long-")
    write_store(os.path.join(tmp, "jobs.db"), keys)
    token_file = os.path.join(tmp, "api.tokens")
    with open(token_file, "w") as f:
        f.write(f"# the job API's tokens\n{TOKEN}\n")
    os.chmod(token_file, 0o600)
    offset = su.free_port_offset(workers=0)
    rest = f"http://127.0.0.1:{8080 + offset}"
    log_file = open(os.path.join(tmp, "coordinator.log"), "w")
    coordinator = subprocess.Popen(
        [os.path.join(su.BIN_DIR, "fp8rl-coordinator"), "--listen-host", "127.0.0.1",
         "--http-port", str(8080 + offset), "--grpc-port", str(50051 + offset),
         "--data-dir", tmp, "--auth-token-file", token_file], stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while su.http_quiet("GET", f"{rest}/healthz")[0] != 200:
            su.check(coordinator.poll() is None and time.time() < deadline,
                     "coordinator did not come up")
            time.sleep(0.2)
        status, _ = http(f"{rest}/v1/jobs/{JOB_ID}")
        su.check(status == 401, f"job API without a token: {status}")
        status, _ = http(f"{rest}/")
        su.check(status == 200, f"console page without a token: {status}")
        status, full = http(f"{rest}/v1/jobs/{JOB_ID}/metrics", TOKEN)
        su.check(status == 200 and len(full["steps"]) == STEPS + 1, f"REST history: {status}")
        history = {row["step"]: row["metrics"] for row in full["steps"]}
        status, thin = http(f"{rest}/v1/jobs/{JOB_ID}/metrics?max_points={MAX_POINTS}", TOKEN)
        su.log(f"  REST: full history {len(json.dumps(full)) // 1024} KiB, "
               f"max_points={MAX_POINTS} {len(json.dumps(thin)) // 1024} KiB "
               f"({len(thin['steps'])} rows)")

        with cdp.Browser() as browser:
            browser.open(f"{rest}/#/jobs/{JOB_ID}")
            browser.wait_for("!document.getElementById('token-panel').hidden", what="token form")
            su.check(browser.eval("!!document.getElementById('auth-error')"), "no token message")
            browser.type_into("#token-input", TOKEN)
            start = time.time()
            browser.click("#token-save")
            browser.wait_for("document.querySelector('#chart-time circle.pt')", timeout=60,
                             what="charts drawn after the token")
            su.log(f"  token asked for on 401; job page drawn {time.time() - start:.2f} s after"
                   " entering it")
            su.check(browser.eval("sessionStorage.getItem('fp8rl_token')") == TOKEN,
                     "token not kept in sessionStorage")
            su.check(browser.eval("document.getElementById('token-panel').hidden"),
                     "token form still shown")
            info = browser.eval("document.getElementById('points-info').textContent")
            su.check(f"{STEPS + 1} steps recorded" in info, f"points info: {info}")
            points = browser.eval("""[...document.querySelectorAll('#charts circle.pt')].map(
                (c) => [c.dataset.key, Number(c.dataset.step), Number(c.dataset.value)])""")
            by_key = {}
            for key, step, value in points:
                su.check(history[step][key] == value, f"{key} at {step}: page {value}, REST "
                         f"{history[step][key]}")
                by_key.setdefault(key, []).append(step)
            for key in keys:
                steps = sorted(by_key.get(key, []))
                if key == "val_accuracy":
                    su.check(steps == list(range(0, STEPS + 1, 100)),
                             f"val_accuracy points: {len(steps)}")
                else:
                    su.check(len(steps) == MAX_POINTS and steps[0] == 1 and steps[-1] == STEPS,
                             f"{key}: {len(steps)} points from {steps[:1]} to {steps[-1:]}")
            su.log(f"  {len(points)} points drawn for {len(keys)} metrics, each equal to REST")
            # Later polls: the same ETag, answered 304, no redraw (the marker stays on the SVG).
            browser.eval("document.querySelector('#chart-reward svg').dataset.marker = 'kept'")
            time.sleep(5)
            statuses = browser.eval("""performance.getEntriesByType('resource')
                .filter((e) => e.name.includes('/metrics?max_points='))
                .map((e) => e.responseStatus)""")
            su.log(f"  metrics polls answered {statuses}")
            # 401 before the token was entered, then one 200 and only 304s.
            su.check(200 in statuses, f"poll statuses {statuses}")
            first_ok = statuses.index(200)
            su.check(all(s == 401 for s in statuses[:first_ok]) and
                     len(statuses) - first_ok >= 3 and
                     all(s == 304 for s in statuses[first_ok + 1:]), f"poll statuses {statuses}")
            su.check(browser.eval(
                "document.querySelector('#chart-reward svg').dataset.marker") == "kept",
                "charts redrawn although nothing changed")
            start = time.time()
            browser.eval("document.getElementById('nav-jobs').click()")
            browser.wait_for(f"document.querySelector(\"#jobs tr[data-id='{JOB_ID}']\")")
            # A wrong token in the tab: the form comes back.
            browser.eval("sessionStorage.setItem('fp8rl_token', 'wrong-token-0123456789')")
            browser.open(f"{rest}/#/submit")
            browser.open(f"{rest}/#/jobs")
            browser.wait_for("!document.getElementById('token-panel').hidden",
                             what="token form after a wrong token")
            su.log(f"  jobs page after a click: {time.time() - start:.2f} s")
    finally:
        coordinator.terminate()
        coordinator.wait(timeout=30)
        log_file.close()
    shutil.rmtree(tmp, ignore_errors=True)
    su.log("PASS")


if __name__ == "__main__":
    main()
