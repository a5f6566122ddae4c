#!/usr/bin/env python3
"""System test: after a smoke job on a local cluster, every service's /metrics passes
`promtool check metrics`, and tests/deploy/dashboard_metrics.py --scrape accepts the saved
scrapes (every metric the Grafana dashboards query is exported by some service)."""

import os
import shutil
import subprocess
import sys

import system_util as su


def body(clusters):
    su.require_binaries()
    promtool = shutil.which("promtool")
    if promtool is None:
        print("SKIP: promtool not installed (Debian package prometheus)")
        sys.exit(su.SKIP)
    cluster = su.Cluster(workers=2)
    clusters.append(cluster)
    cluster.wait_up()
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", su.smoke_config(cluster.tmp))
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    job = su.wait_job(cluster, reply["id"])
    su.check(job["state"] == "SUCCEEDED", f"job ended {job['state']}: {job.get('error')}")

    scrape_dir = os.path.join(cluster.tmp, "scrapes")
    os.makedirs(scrape_dir)
    files = []
    problems = []
    for service in cluster.state["services"]:
        url = f"http://127.0.0.1:{service['http_port']}/metrics"
        status, text = su.http("GET", url)
        su.check(status == 200 and isinstance(text, str), f"{service['name']} /metrics: {status}")
        path = os.path.join(scrape_dir, service["name"] + ".prom")
        with open(path, "w") as f:
            f.write(text)
        files.append(path)
        families = sum(1 for line in text.splitlines() if line.startswith("# TYPE fp8rl_"))
        p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)
        su.log(f"  {service['name']}: {families} fp8rl_ families, promtool exit {p.returncode}")
        if p.returncode != 0:
            problems.append(f"{service['name']}: promtool: {(p.stdout + p.stderr).strip()}")
        if families == 0:
            problems.append(f"{service['name']}: no fp8rl_ metric family")
    dashboard = os.path.join(su.SOURCE_DIR, "tests", "deploy", "dashboard_metrics.py")
    p = subprocess.run([sys.executable, dashboard, "--scrape"] + files, capture_output=True,
                       text=True, timeout=60)
    su.log(f"  dashboard_metrics.py exit {p.returncode}: {(p.stdout + p.stderr).strip()[:2000]}")
    if p.returncode != 0:
        problems.append("dashboard_metrics.py --scrape failed")
    cluster.stop(expect_rc=0)
    su.check(not problems, "; ".join(problems))


if __name__ == "__main__":
    su.main_guard(body)
