#!/usr/bin/env python3
"""System test: back-pressure of the coordinator's job API (services/coordinator/admission.h) on
a real fp8rl-coordinator (no workers: the first job stays RUNNING, waiting for them, and the
rest stay QUEUED). With --max-queued-jobs 2:
  * REST: a submission beyond the queue answers 429 with Retry-After naming the flag; a job over
    --max-job-tokens answers 400 naming the fields; both counted in
    fp8rl_coordinator_requests_refused_total and logged once each;
  * gRPC: RESOURCE_EXHAUSTED with grpc-retry-pushback-ms; tools/python/fp8rl_retry.py gives up
    with a clear error, and gets through once a queued job is cancelled during its back-off;
  * the CLI: `fp8rl submit` retries, prints a line per retry, and either gets through when a slot
    frees or exits non-zero with one line that says it gave up.
The gRPC part needs python3-grpcio and a code generator (as system.python_client) and is skipped
with a message without them."""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import system_util as su

sys.path.insert(0, os.path.join(su.SOURCE_DIR, "tools", "python"))
import fp8rl_retry  # noqa: E402

MAX_QUEUED = 2
RETRY_AFTER_MS = 700
MAX_JOB_TOKENS = 1000  # the smoke job: 3 x 4 x 4 x 4 = 192 tokens


def start_coordinator(tmp):
    offset = su.free_port_offset(workers=0)
    rest = f"http://127.0.0.1:{8080 + offset}"
    grpc_address = f"127.0.0.1:{50051 + offset}"
    log_path = os.path.join(tmp, "coordinator.log")
    proc = subprocess.Popen(
        [os.path.join(su.BIN_DIR, "fp8rl-coordinator"), "--listen-host", "127.0.0.1",
         "--http-port", str(8080 + offset), "--grpc-port", str(50051 + offset),
         "--data-dir", os.path.join(tmp, "coordinator"), "--data-root", tmp,
         "--worker-wait-seconds", "600", "--max-queued-jobs", str(MAX_QUEUED),
         "--retry-after-ms", str(RETRY_AFTER_MS), "--max-job-tokens", str(MAX_JOB_TOKENS)],
        stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while su.http_quiet("GET", f"{rest}/healthz")[0] != 200:
        su.check(proc.poll() is None and time.time() < deadline,
                 f"coordinator did not come up:\n{open(log_path).read()}")
        time.sleep(0.2)
    return proc, rest, grpc_address, log_path


def refused_count(rest, reason):
    status, text = su.http_quiet("GET", f"{rest}/metrics")
    su.check(status == 200, f"/metrics: {status}")
    m = re.search(r'^fp8rl_coordinator_requests_refused_total\{reason="%s"\} (\S+)$' % reason,
                  text, re.M)
    su.check(m is not None, f"no refused counter for {reason} in /metrics")
    return float(m.group(1))


def queued_ids(rest):
    status, body = su.http("GET", f"{rest}/v1/jobs?state=QUEUED")
    su.check(status == 200, f"list queued: {status} {body}")
    return [j["id"] for j in body["jobs"]]


def cancel_later(rest, job_id, seconds):
    def run():
        time.sleep(seconds)
        status, body = su.http("POST", f"{rest}/v1/jobs/{job_id}:cancel")
        su.log(f"  cancelled {job_id} after {seconds} s: {status}")
    t = threading.Thread(target=run)
    t.start()
    return t


def fill_queue(rest, config):
    """One job RUNNING (waiting for workers), then MAX_QUEUED jobs QUEUED behind it."""
    status, body = su.http("POST", f"{rest}/v1/jobs", config)
    su.check(status == 201, f"first submit: {status} {body}")
    deadline = time.time() + 30
    while su.http("GET", f"{rest}/v1/jobs/{body['id']}")[1]["state"] != "RUNNING":
        su.check(time.time() < deadline, "the first job did not start")
        time.sleep(0.1)
    for _ in range(MAX_QUEUED):
        status, body = su.http("POST", f"{rest}/v1/jobs", config)
        su.check(status == 201, f"submit while filling the queue: {status} {body}")
    su.check(len(queued_ids(rest)) == MAX_QUEUED, "queue not filled")


def check_rest(rest, log_path, config):
    big = dict(config, algorithm=dict(config["algorithm"], steps=100))
    status, body = su.http("POST", f"{rest}/v1/jobs", big)
    su.log(f"  over the token cap: {status} {body}")
    su.check(status == 400, f"job over the token cap: expected 400, got {status} {body}")
    su.check("algorithm.steps x prompts_per_step x samples_per_prompt x max_new_tokens" in
             body["error"] and "6400 tokens" in body["error"] and "--max-job-tokens" in
             body["error"], f"token cap error does not name the fields and flag: {body}")
    su.check(refused_count(rest, "token_quota") == 1, "token_quota refusal not counted")

    fill_queue(rest, config)
    data = json.dumps(config).encode()
    request = urllib.request.Request(f"{rest}/v1/jobs", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30)
        su.fail("submit beyond the queue was accepted")
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        su.log(f"  beyond the queue: {e.code} Retry-After={e.headers.get('Retry-After')} {text}")
        su.check(e.code == 429, f"expected 429, got {e.code} {text}")
        su.check(e.headers.get("Retry-After") == "1", f"Retry-After: {e.headers}")
        su.check(f"{MAX_QUEUED} jobs queued (limit {MAX_QUEUED}, --max-queued-jobs)" in text,
                 f"429 body does not name the limit: {text}")
    su.check(refused_count(rest, "queue_full") == 1, "queue_full refusal not counted")
    with open(log_path) as f:
        lines = [l for l in f if "request refused" in l]
    su.check(len(lines) == 2 and "reason=queue_full" in lines[1] and
             "reason=token_quota" in lines[0], f"one log line per refusal expected: {lines}")


def check_cli(rest, grpc_address, tmp, config):
    path = su.write_yaml(os.path.join(tmp, "job.yaml"), config)
    cmd = [su.FP8RL, "submit", "--coordinator", grpc_address, path]
    # Gets through when a queued job is cancelled during the back-off.
    before = refused_count(rest, "queue_full")
    canceller = cancel_later(rest, queued_ids(rest)[0], 1.5)
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    canceller.join()
    su.log(f"  fp8rl submit with a slot freed after 1.5 s: rc {p.returncode} in "
           f"{time.time() - start:.1f} s\n{p.stderr}{p.stdout}")
    su.check(p.returncode == 0 and p.stdout.startswith("submitted "),
             f"fp8rl submit did not get through: {p.returncode}")
    su.check("coordinator overloaded" in p.stderr and "retrying in" in p.stderr,
             "fp8rl submit printed no retry line")
    su.check(refused_count(rest, "queue_full") > before, "the CLI's refusals were not counted")
    # Gives up while the queue stays full: non-zero exit, the last line says so.
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    took = time.time() - start
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    su.log(f"  fp8rl submit on a full queue: rc {p.returncode} in {took:.1f} s; last line: {last}")
    su.check(p.returncode != 0, "fp8rl submit on a full queue exited 0")
    su.check("gave up after 8 tries" in last and "--max-queued-jobs" in last and
             last.startswith("fp8rl submit:"), f"unclear give-up line: {last!r}")
    su.check(len([l for l in p.stderr.splitlines() if "retrying in" in l]) == 7,
             f"expected 7 retry lines:\n{p.stderr}")
    # Seven waits, each at least the 0.7 s hint and at least half its back-off step.
    su.check(took >= 7 * RETRY_AFTER_MS / 1000, f"gave up after only {took:.1f} s")


def check_grpc(rest, grpc_address, tmp, config):
    try:
        import grpc
        import test_python_client as tpc
    except ImportError as e:
        su.log(f"SKIP part: Python gRPC modules missing ({e}); gRPC checks not run")
        return
    out = os.path.join(tmp, "py")
    os.makedirs(out)
    tpc.generate(out)
    sys.path.insert(0, out)
    from fp8rl.v1 import job_service_pb2 as pb, job_service_pb2_grpc
    stub = job_service_pb2_grpc.JobServiceStub(grpc.insecure_channel(grpc_address))
    text = open(su.write_yaml(os.path.join(tmp, "grpc.yaml"), config)).read()
    request = pb.SubmitJobRequest(config=text)
    try:
        stub.SubmitJob(request, timeout=30)
        su.fail("SubmitJob beyond the queue was accepted")
    except grpc.RpcError as e:
        trailers = dict(e.trailing_metadata() or ())
        su.log(f"  gRPC beyond the queue: {e.code().name} {e.details()!r} trailers {trailers}")
        su.check(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f"got {e.code().name}")
        su.check(trailers.get("grpc-retry-pushback-ms") == str(RETRY_AFTER_MS),
                 f"no retry hint in the trailers: {trailers}")
    policy = fp8rl_retry.RetryPolicy(max_tries=3)
    try:
        fp8rl_retry.grpc_call(stub.SubmitJob, request, idempotent=False, policy=policy,
                              timeout=30)
        su.fail("fp8rl_retry.grpc_call got through a full queue")
    except fp8rl_retry.RetryGaveUp as e:
        su.log(f"  fp8rl_retry on a full queue: {e}")
        su.check(e.tries == 3 and "RESOURCE_EXHAUSTED" in str(e) and "--max-queued-jobs" in str(e),
                 f"unclear give-up: {e}")
    canceller = cancel_later(rest, queued_ids(rest)[0], 1.0)
    reply = fp8rl_retry.grpc_call(stub.SubmitJob, request, idempotent=False, timeout=30)
    canceller.join()
    su.log(f"  fp8rl_retry with a slot freed after 1 s: submitted {reply.job.id}")
    su.check(reply.job.id.startswith("job-"), f"no job id in {reply}")


def body(clusters):
    su.require_binaries()
    tmp = tempfile.mkdtemp(prefix="fp8rl-overload-")
    config = su.smoke_config(tmp)
    proc, rest, grpc_address, log_path = start_coordinator(tmp)
    try:
        check_rest(rest, log_path, config)
        check_cli(rest, grpc_address, tmp, config)
        check_grpc(rest, grpc_address, tmp, config)
        # Nothing refused was stored: one running, the rest queued or cancelled.
        status, listing = su.http("GET", f"{rest}/v1/jobs")
        states = [j["state"] for j in listing["jobs"]]
        su.log(f"  jobs at the end: {states}")
        su.check(states.count("QUEUED") == MAX_QUEUED, f"queue not at its limit: {states}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    su.check(proc.returncode == 0, f"coordinator exited {proc.returncode}")


if __name__ == "__main__":
    su.main_guard(body)
