#!/usr/bin/env python3
"""System test: a job's fault events reach every front end. A real coordinator (no workers) stores
a submitted job; the test then adds one event of every kind the coordinator records
(trainer_lost, checkpoint_fallback, token_quota, group_reformed; docs/design/faults.md "Job
events") to its job store, with random messages that include HTML metacharacters, in the
documented schema (services/coordinator/job_store.h). Checked, each against the events as added:
  - REST GET /v1/jobs/{id}/events: kinds, messages, times, order;
  - gRPC JobService.GetJobEvents through `fp8rl status ID`: one line per event, in order;
  - the web console's job page (headless Chromium, cdp.py): one table row per event, kind and
    message as text (not markup), in order; skipped with a message without chromium.
A job without events shows none in all three, and an unknown id is NOT_FOUND / 404 / one error
line."""

import os
import random
import shutil
import sqlite3
import subprocess
import tempfile
import time

import cdp
import system_util as su

KINDS = ["trainer_lost", "checkpoint_fallback", "token_quota", "group_reformed"]


def random_message(rng, kind):
    words = ["rank", "step", "checkpoint", "trainer-1", "weight", "<b>sync</b>", "a & b", "'q'"]
    return f"{kind} #{rng.randrange(1, 10**6)}: " + " ".join(rng.choice(words) for _ in range(8))


def add_events(db_path, job_id, rng):
    events = []
    at = 1764860000000 + rng.randrange(10**6)
    for kind in KINDS:
        at += rng.randrange(1, 60000)
        events.append({"kind": kind, "message": random_message(rng, kind), "recorded_unix_ms": at})
    with sqlite3.connect(db_path, timeout=10) as db:
        db.executemany("INSERT INTO events (job_id, kind, message, recorded_ms) VALUES (?,?,?,?)",
                       [(job_id, e["kind"], e["message"], e["recorded_unix_ms"]) for e in events])
    return events


def cli_events(grpc, job_id):
    rc, out, err = su.run_cli(["status", job_id, "--coordinator", grpc])
    su.check(rc == 0, f"fp8rl status {job_id}: rc {rc}: {err}")
    lines = out.splitlines()
    if "events:" not in lines:
        return []
    return [line.strip() for line in lines[lines.index("events:") + 1:] if line.startswith("  ")]


def body(clusters):
    su.require_binaries()
    rng = random.Random(int(os.environ.get("FP8RL_TEST_SEED", "32")))
    tmp = tempfile.mkdtemp(prefix="fp8rl-system-events-")
    offset = su.free_port_offset(workers=0)
    rest = f"http://127.0.0.1:{8080 + offset}"
    grpc = f"127.0.0.1:{50051 + offset}"
    log = open(os.path.join(tmp, "coordinator.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(su.BIN_DIR, "fp8rl-coordinator"), "--listen-host", "127.0.0.1",
         "--http-port", str(8080 + offset), "--grpc-port", str(50051 + offset),
         "--data-dir", tmp, "--data-root", tmp, "--worker-wait-seconds", "600"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while su.http_quiet("GET", f"{rest}/healthz")[0] != 200:
            su.check(proc.poll() is None and time.time() < deadline, "coordinator not up")
            time.sleep(0.2)
        ids = []
        for _ in range(2):
            status, reply = su.http("POST", f"{rest}/v1/jobs", su.smoke_config(tmp))
            su.check(status == 201, f"submit: {status} {reply}")
            ids.append(reply["id"])
        with_events, without = ids
        events = add_events(os.path.join(tmp, "jobs.db"), with_events, rng)

        status, reply = su.http("GET", f"{rest}/v1/jobs/{with_events}/events")
        su.check(status == 200 and reply["events"] == events,
                 f"REST events: {status} {reply}, want {events}")
        status, reply = su.http("GET", f"{rest}/v1/jobs/{without}/events")
        su.check(status == 200 and reply["events"] == [], f"REST, no events: {status} {reply}")
        status, reply = su.http("GET", f"{rest}/v1/jobs/job-nope/events")
        su.check(status == 404, f"REST, unknown job: {status} {reply}")
        su.log(f"  REST: {len(events)} events, in order")

        lines = cli_events(grpc, with_events)
        su.check(len(lines) == len(events), f"fp8rl status shows {lines}, want {len(events)}")
        for line, e in zip(lines, events):
            su.check(line.endswith(f"  {e['kind']}: {e['message']}"), f"line {line!r} for {e}")
        su.check(cli_events(grpc, without) == [], "fp8rl status shows events of a job without")
        rc, out, err = su.run_cli(["status", "job-nope", "--coordinator", grpc])
        su.check(rc != 0 and len(err.strip().splitlines()) == 1 and "job-nope" in err,
                 f"unknown job: rc {rc} {err!r}")
        su.log("  gRPC GetJobEvents (fp8rl status): one line per event, in order")

        reason = cdp.available()
        if reason:
            su.log(f"  console not checked: {reason}")
            return
        with cdp.Browser() as browser:
            browser.open(f"{rest}/#/jobs/{with_events}")
            browser.wait_for("document.querySelectorAll('#job-events tr.event').length === "
                             f"{len(events)}", what="the events table")
            shown = browser.eval("""[...document.querySelectorAll('#job-events tr.event')].map(
                (r) => [r.querySelector('.event-kind').textContent,
                        r.querySelector('.event-message').textContent])""")
            su.check(shown == [[e["kind"], e["message"]] for e in events],
                     f"console shows {shown}")
            su.check(not browser.eval("!!document.querySelector('#job-events b')"),
                     "a message was rendered as markup")
            browser.open(f"{rest}/#/jobs/{without}")
            browser.wait_for("document.getElementById('job-state')", what="the job page")
            su.check(browser.eval("document.querySelectorAll('#job-events tr.event').length") == 0,
                     "the console shows events for a job without")
        su.log("  console: one row per event, text as sent, in order")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    shutil.rmtree(tmp, ignore_errors=True)  # kept on failure for the log


if __name__ == "__main__":
    su.main_guard(body)
