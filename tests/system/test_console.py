#!/usr/bin/env python3
"""System test of the web console in a real browser: `fp8rl up` on free ports, the smoke job over
REST, then headless Chromium (DevTools protocol) through
  - the jobs page: the job listed newest first with its state and latest val accuracy;
  - the job page: every chart point (data-key/step/value on the SVG circles) equals the REST
    history of the same job, row 0 of val_accuracy included;
  - a second, longer job: the page updates live (no reload) and is cancelled through the button
    and its confirmation dialog ("Keep running" first, then "Cancel job");
  - the submit page: a bad YAML config shows the API's field path next to the offending line; a
    good one is accepted;
then `fp8rl report` of the finished job and a clean shutdown. Screenshots go to the test's temp
folder, or to $FP8RL_CONSOLE_SCREENSHOTS when set (docs/images/console was made that way).
Skips (77) without chromium or python3-websocket."""

import json
import os
import re
import sys
import time

import yaml

import cdp
import system_util as su


def rest_history(cluster, job_id):
    status, body = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
    su.check(status == 200, f"metrics of {job_id}: {status} {body}")
    return {row["step"]: row["metrics"] for row in body["steps"]}


def chart_points(browser):
    return browser.eval("""[...document.querySelectorAll('#charts circle.pt')].map((c) => ({
        chart: c.closest('.chart').id, key: c.dataset.key, step: Number(c.dataset.step),
        value: Number(c.dataset.value)}))""")


def check_points_match(browser, history, charts_spec):
    """Every charted (key, step) of the REST history is one point with the same value."""
    points = chart_points(browser)
    got = {}
    for p in points:
        su.check((p["key"], p["step"]) not in got or p["chart"] != got[(p["key"], p["step"])][0],
                 f"point drawn twice: {p}")
        got[(p["key"], p["step"])] = (p["chart"], p["value"])
    expected = 0
    for chart in charts_spec["charts"]:
        for series in chart["series"]:
            for step, values in history.items():
                if series["key"] not in values:
                    continue
                expected += 1
                key = (series["key"], step)
                su.check(key in got, f"chart {chart['id']}: no point for {key}")
                su.check(got[key][1] == values[series["key"]],
                         f"{key}: page shows {got[key][1]}, REST has {values[series['key']]}")
    su.check(len(points) == expected, f"{len(points)} points on the page, {expected} expected")
    return points


def jobs_page(browser, cluster, job, shots):
    browser.open(cluster.rest + "/")
    row = f"#jobs tbody tr[data-id='{job['id']}']"
    browser.wait_for(f"document.querySelector(\"{row}\")", what="the job in the jobs table")
    state = browser.eval(f"document.querySelector(\"{row} .state\").textContent")
    su.check(state == "SUCCEEDED", f"jobs page shows state {state}")
    first = browser.eval("document.querySelector('#jobs tbody tr').dataset.id")
    status, listed = su.http("GET", f"{cluster.rest}/v1/jobs")
    su.check(first == listed["jobs"][0]["id"], f"jobs page starts with {first}, REST with "
             f"{listed['jobs'][0]['id']}")
    accuracy = float(browser.eval(f"document.querySelector(\"{row} .accuracy\").textContent"))
    expected = job["latest_metrics"]["metrics"]["val_accuracy"]
    su.check(abs(accuracy - expected) <= 1e-3 * max(1, abs(expected)),
             f"jobs page accuracy {accuracy}, REST {expected}")
    # The state filter: a state with no job shows none of them.
    browser.eval("(() => { const s = document.getElementById('state-filter');"
                 " s.value = 'FAILED'; s.dispatchEvent(new Event('change')); })()")
    browser.wait_for("document.getElementById('no-jobs')", what="FAILED filter shows no jobs")
    su.check("FAILED" in browser.eval("location.hash"), "filter not in the URL")
    browser.open(cluster.rest + "/#/jobs")
    browser.wait_for(f"document.querySelector(\"{row}\")", what="the jobs table again")
    browser.screenshot(os.path.join(shots, "jobs.png"))
    su.log("  jobs page: listed newest first, state and accuracy match REST, filter works")


def job_page(browser, cluster, job, charts_spec, shots):
    browser.open(f"{cluster.rest}/#/jobs/{job['id']}")
    browser.wait_for("document.querySelector('#chart-val_accuracy circle.pt')",
                     what="held-out accuracy points")
    browser.wait_for("document.getElementById('job-state').textContent === 'SUCCEEDED'")
    history = rest_history(cluster, job["id"])
    points = check_points_match(browser, history, charts_spec)
    val_steps = sorted(p["step"] for p in points if p["key"] == "val_accuracy")
    su.check(val_steps and val_steps[0] == 0, f"val_accuracy points {val_steps}: no row 0")
    su.check(browser.eval("document.getElementById('cancel-btn').hidden"),
             "cancel button shown for a finished job")
    config = json.loads(browser.eval("document.getElementById('job-config').textContent"))
    su.check(config["algorithm"]["steps"] == job["total_steps"], f"config shown: {config}")
    browser.screenshot(os.path.join(shots, "job.png"))
    su.log(f"  job page: {len(points)} chart points equal the REST history "
           f"(val_accuracy at steps {val_steps})")


def live_and_cancel(browser, cluster, tmp, shots):
    config = su.smoke_config(tmp, steps=60)
    config["checkpoint"]["every_steps"] = 60
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST long job: {status} {reply}")
    job_id = reply["id"]
    browser.open(f"{cluster.rest}/#/jobs/{job_id}")
    browser.wait_for("document.getElementById('job-state')", what="the long job's page")
    browser.eval("window.__loaded_once = true")
    # Live: RL rows appear without a reload (the marker survives).
    browser.wait_for("document.querySelectorAll('#chart-reward circle.pt').length >= 2",
                     timeout=150, what="two reward points drawn live")
    su.check(browser.eval("window.__loaded_once === true"), "the page reloaded")
    su.check(browser.eval("document.getElementById('job-state').textContent") == "RUNNING",
             "long job not RUNNING")
    browser.screenshot(os.path.join(shots, "job-running.png"))
    # Cancel: the dialog first, "Keep running" changes nothing.
    browser.click("#cancel-btn")
    browser.wait_for("!document.getElementById('confirm').hidden", what="confirmation dialog")
    su.check(job_id in browser.eval("document.getElementById('confirm-text').textContent"),
             "confirmation does not name the job")
    browser.screenshot(os.path.join(shots, "cancel-confirm.png"))
    browser.click("#confirm-no")
    browser.wait_for("document.getElementById('confirm').hidden", what="dialog closed")
    time.sleep(1)
    status, job = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
    su.check(job["state"] == "RUNNING", f"'Keep running' changed the job: {job['state']}")
    browser.click("#cancel-btn")
    browser.wait_for("!document.getElementById('confirm').hidden", what="dialog again")
    browser.click("#confirm-yes")
    browser.wait_for("document.getElementById('cancel-result')", what="cancel answer")
    browser.wait_for("document.getElementById('job-state').textContent === 'CANCELLED'",
                     timeout=120, what="job page shows CANCELLED")
    status, job = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
    su.check(job["state"] == "CANCELLED", f"REST says {job['state']} after the cancel")
    su.check(job["step"] < 60, f"cancelled job ran to the end: {job['step']}")
    su.check(browser.eval("document.getElementById('cancel-btn').hidden"), "cancel button left")
    su.log(f"  live updates without reload; cancelled through the dialog at step {job['step']}")


def submit_page(browser, cluster, tmp, shots):
    config = su.smoke_config(tmp)
    config["algorithm"]["samples_per_prompt"] = 1
    text = yaml.safe_dump(config, sort_keys=False)
    browser.open(f"{cluster.rest}/#/submit")
    browser.wait_for("document.getElementById('config-text')")
    browser.type_into("#config-text", text)
    browser.click("#submit-btn")
    browser.wait_for("document.getElementById('submit-error')", what="submit error")
    path = browser.eval("document.getElementById('error-path').textContent")
    su.check(path == "algorithm.samples_per_prompt", f"error path shown: {path}")
    line = browser.eval("document.getElementById('error-line').textContent")
    su.check("samples_per_prompt: 1" in line and ">= 2" in line,
             f"error not shown on the offending line: {line}")
    browser.screenshot(os.path.join(shots, "submit-error.png"))
    # A good config is accepted and linked.
    config["algorithm"]["samples_per_prompt"] = 4
    browser.type_into("#config-text", yaml.safe_dump(config, sort_keys=False))
    browser.click("#submit-btn")
    browser.wait_for("document.getElementById('submit-ok')", what="submit accepted")
    job_id = browser.eval("document.querySelector('#submit-ok a').textContent")
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs/{job_id}:cancel")
    su.check(status == 200, f"cancel of the submitted job: {status} {reply}")
    su.wait_job(cluster, job_id, timeout=120)
    su.log(f"  submit page: field path {path} on its line; good config accepted as {job_id}")


def report(cluster, job, tmp):
    out = os.path.join(tmp, "report")
    rc, stdout, stderr = su.run_cli(["report", job["id"], "--out", out,
                                     "--coordinator", cluster.grpc])
    su.check(rc == 0, f"fp8rl report: {rc} {stdout} {stderr}")
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    su.check(job["id"] in summary and "SUCCEEDED" in summary, f"summary.md:\n{summary}")
    with open(os.path.join(out, "val_accuracy.svg")) as f:
        svg = f.read()
    history = rest_history(cluster, job["id"])
    points = re.findall(r'data-key="val_accuracy" data-step="(\d+)" data-value="([^"]+)"', svg)
    expected = [(s, v["val_accuracy"]) for s, v in sorted(history.items()) if "val_accuracy" in v]
    su.check([(int(s), float(v)) for s, v in points] == expected,
             f"report points {points} != REST {expected}")
    rc, _, stderr = su.run_cli(["report", "job-nope", "--out", os.path.join(tmp, "r2"),
                                "--coordinator", cluster.grpc])
    su.check(rc != 0 and "job-nope" in stderr and len(stderr.strip().splitlines()) == 1,
             f"report of an unknown job: {rc} {stderr}")
    su.check(not os.path.exists(os.path.join(tmp, "r2")), "report of an unknown job wrote files")
    su.log(f"  fp8rl report: {len(os.listdir(out))} files, val_accuracy points equal REST")


def body(clusters):
    su.require_binaries()
    reason = cdp.available()
    if reason:
        print(f"SKIP: {reason}", flush=True)
        sys.exit(su.SKIP)
    cluster = su.Cluster(workers=2)
    clusters.append(cluster)
    cluster.wait_up()
    shots = os.environ.get("FP8RL_CONSOLE_SCREENSHOTS") or os.path.join(cluster.tmp, "shots")
    status, charts_spec = su.http("GET", f"{cluster.rest}/console/charts.json")
    su.check(status == 200 and isinstance(charts_spec, dict),
             f"GET /console/charts.json: {status} {charts_spec}")

    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", su.smoke_config(cluster.tmp))
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    job = su.wait_job(cluster, reply["id"])
    su.check(job["state"] == "SUCCEEDED", f"smoke job ended {job['state']}: {job.get('error')}")

    with cdp.Browser() as browser:
        jobs_page(browser, cluster, job, shots)
        job_page(browser, cluster, job, charts_spec, shots)
        live_and_cancel(browser, cluster, cluster.tmp, shots)
        submit_page(browser, cluster, cluster.tmp, shots)
        errors = [m for m in browser.console if m.startswith("exception")]
        su.check(not errors, f"uncaught exceptions in the page: {errors}")
    report(cluster, job, cluster.tmp)
    su.log(f"  screenshots in {shots}: {sorted(os.listdir(shots))}")
    cluster.stop()


if __name__ == "__main__":
    su.main_guard(body)
