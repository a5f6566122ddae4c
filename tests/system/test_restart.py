#!/usr/bin/env python3
"""System test: restart at once. (1) Each kind of service (coordinator, weight sync, trainer, a
generation worker) is SIGKILLed while a scraper holds a keep-alive connection to its HTTP port;
the launcher's restart must re-bind the same ports (the dead process's connections sit in
TIME_WAIT) and serve /metrics again within seconds. (2) A job runs, the cluster is stopped, and
`fp8rl up` is started again at once on the same ports (its pre-flight port check included) while
the old connections linger, and a second job runs to SUCCEEDED."""

import http.client
import json
import os
import signal
import time

import system_util as su

STEPS = 2
RESTART_WITHIN_S = 15  # the launcher waits 1 s before a restart; the rest is start-up


class Scraper:
    """A keep-alive HTTP/1.1 connection that scrapes /metrics."""

    def __init__(self, port):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

    def scrape(self):
        self.conn.request("GET", "/metrics", headers={"Connection": "keep-alive"})
        response = self.conn.getresponse()
        body = response.read().decode()
        return response.status, body


def metrics_ports(cluster):
    return {s["name"]: s["http_port"] for s in cluster.state["services"]}


def serves_within(port, seconds):
    """Seconds until a fresh connection gets /metrics with fp8rl_build_info, or None."""
    start = time.time()
    while time.time() - start < seconds:
        try:
            status, body = Scraper(port).scrape()
            if status == 200 and "fp8rl_build_info" in body:
                return time.time() - start
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    return None


def run_job(cluster, tag):
    config = su.smoke_config(os.path.join(cluster.tmp, tag), steps=STEPS)
    config["checkpoint"]["every_steps"] = 0
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    job = su.wait_job(cluster, reply["id"], timeout=150)
    su.check(job["state"] == "SUCCEEDED", f"{tag} ended {job['state']}: {job.get('error')}")
    su.log(f"  {tag}: SUCCEEDED")


def body(clusters):
    su.require_binaries()
    cluster = su.Cluster(workers=1)
    clusters.append(cluster)
    cluster.wait_up()
    ports = metrics_ports(cluster)

    # (1) Kill each kind of service under a keep-alive scraper.
    for name in ["weight-sync", "trainer", "generation-worker-0", "coordinator"]:
        scraper = Scraper(ports[name])
        for _ in range(2):  # the same connection twice: it is kept alive
            status, text = scraper.scrape()
            su.check(status == 200 and "fp8rl_build_info" in text, f"{name} /metrics: {status}")
        pid = cluster.pids[name]
        os.kill(pid, signal.SIGKILL)
        su.log(f"  SIGKILL {name} (pid {pid}) with a keep-alive scraper on :{ports[name]}")
        deadline = time.time() + 5
        while su.pid_alive(pid) and time.time() < deadline:
            time.sleep(0.05)
        took = serves_within(ports[name], RESTART_WITHIN_S)
        su.check(took is not None,
                 f"{name} does not serve /metrics on :{ports[name]} {RESTART_WITHIN_S} s after the "
                 f"kill; fp8rl up said:\n{cluster.text()[-3000:]}")
        su.log(f"  {name} serves again after {took:.1f} s")
        scraper.conn.close()
    # The restarted coordinator needs the restarted workers registered before a job can run.
    run_job(cluster, "job1")

    # (2) Stop with scrapers holding keep-alive connections (their server ends go to TIME_WAIT),
    # then start again at once on the same ports and data dir.
    with open(os.path.join(cluster.data_dir, "cluster.json")) as f:  # the restarted pids
        cluster.pids = {s["name"]: s["pid"] for s in json.load(f)["services"]}
    scrapers = [Scraper(port) for port in ports.values()]
    for s in scrapers:
        su.check(s.scrape()[0] == 200, f"scrape :{s.port} before stop")
    cluster.stop(expect_rc=0)
    stopped = time.time()
    again = su.Cluster(workers=1, tmp=cluster.tmp, offset=cluster.offset)
    clusters.append(again)
    again.wait_up()
    su.log(f"  cluster up again {time.time() - stopped:.1f} s after the stop")
    su.check("is not free" not in again.text(), "pre-flight refused a port")
    for s in scrapers:
        s.conn.close()
    run_job(again, "job2")
    again.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(body)
