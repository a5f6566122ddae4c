#!/usr/bin/env python3
"""System test: authentication and TLS on a real `fp8rl up` cluster with mutual TLS between the
services (certificates made at test time by scripts/make_certs.sh) and a job API token.

  - every gRPC method of every service (coordinator JobService and WorkerRegistry, weight sync,
    trainer, generation worker) with no token and a wrong token: UNAUTHENTICATED; with the right
    one (the API token for JobService, the cluster token `fp8rl up` generated for the rest):
    anything but UNAUTHENTICATED (empty requests, so nothing changes); grpc.health stays open;
  - every REST route under /v1/ over HTTPS without and with a wrong token: 401 with a JSON error;
    /healthz and /metrics of every service stay open;
  - a client without the CA, and a plaintext client, are refused; mutual TLS refuses a client
    without a certificate;
  - the generated cluster token file is mode 0600;
  - the trainer refuses checkpoint paths outside its --data-root (absolute, '..', a symlink);
  - the CLI without a token fails naming FP8RL_TOKEN; with it, it submits the smoke job, which
    SUCCEEDS over TLS;
  - SIGHUP makes the coordinator re-read its token file: the new token works, the old is refused.
"""

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import system_util as su
import test_python_client as tpc

API_TOKEN = "api-token-for-the-system-test-0001"
API_TOKEN_NEW = "api-token-after-the-sighup-reload-2"
WRONG_TOKEN = "this-token-is-not-configured-anywhere"
PROTO_SERVICES = {  # service full name -> cluster.json name of the process serving it
    "fp8rl.v1.JobService": "coordinator",
    "fp8rl.v1.WorkerRegistry": "coordinator",
    "fp8rl.v1.Rendezvous": "coordinator",
    "fp8rl.v1.WeightSyncService": "weight-sync",
    "fp8rl.v1.TrainerService": "trainer",
    "fp8rl.v1.GenerationService": "generation-worker-0",
}


def proto_methods():
    """(service full name, method, client streaming, server streaming) from proto/fp8rl/v1."""
    out = []
    proto_dir = os.path.join(su.SOURCE_DIR, "proto", "fp8rl", "v1")
    for name in sorted(os.listdir(proto_dir)):
        text = open(os.path.join(proto_dir, name)).read()
        for service, body in re.findall(r"service\s+(\w+)\s*\{(.*?)\n\}", text, re.S):
            for method, req, resp in re.findall(
                    r"rpc\s+(\w+)\s*\(\s*(stream\s+)?[\w.]+\s*\)\s*returns\s*\(\s*(stream\s+)?", body):
                out.append((f"fp8rl.v1.{service}", method, bool(req), bool(resp)))
    return out


def call_code(channel, service, method, client_stream, server_stream, token, request=b""):
    """The status code of one call (OK when it answered) with an empty or given request."""
    import grpc
    path = f"/{service}/{method}"
    ident = lambda b: b  # noqa: E731: raw bytes in and out
    metadata = [("authorization", f"Bearer {token}")] if token else None
    try:
        if client_stream:
            channel.stream_unary(path, ident, ident)(iter([]), timeout=10, metadata=metadata)
        elif server_stream:
            for _ in channel.unary_stream(path, ident, ident)(request, timeout=3,
                                                              metadata=metadata):
                break  # one message is enough: the call was let in
        else:
            channel.unary_unary(path, ident, ident)(request, timeout=10, metadata=metadata)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def https(method, url, ca, token=None, body=None):
    context = ssl.create_default_context(cafile=ca)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def body(clusters):
    su.require_binaries()
    tpc.import_grpc_or_skip()
    import grpc
    gen_dir = tempfile.mkdtemp(prefix="fp8rl-auth-py-")
    tpc.generate(gen_dir)

    tmp = tempfile.mkdtemp(prefix="fp8rl-auth-")
    pki = os.path.join(tmp, "pki")
    other = os.path.join(tmp, "other")
    for d in (pki, other):
        p = subprocess.run(["bash", os.path.join(su.SOURCE_DIR, "scripts", "make_certs.sh"), d],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(f"SKIP: cannot make certificates: {p.stderr}", flush=True)
            sys.exit(su.SKIP)
    ca, cert, key = (os.path.join(pki, f) for f in ("ca.pem", "service.pem", "service.key"))
    token_file = os.path.join(tmp, "api.tokens")
    with open(token_file, "w") as f:
        f.write(f"# job API tokens\n{API_TOKEN}\n")

    cluster = su.Cluster(workers=1, extra_args=["--auth-token-file", token_file, "--tls-cert",
                                                cert, "--tls-key", key, "--tls-ca", ca])
    clusters.append(cluster)
    cluster.wait_up(timeout=150)
    token_path = os.path.join(cluster.data_dir, "cluster.token")
    su.check(os.stat(token_path).st_mode & 0o777 == 0o600,
             f"cluster token mode {oct(os.stat(token_path).st_mode & 0o777)}")
    cluster_token = open(token_path).read().strip()
    su.check(len(cluster_token) == 64, "cluster token is not 64 hex digits")

    def read(path):
        with open(path, "rb") as f:
            return f.read()
    mtls = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
    channels = {}
    for svc in cluster.state["services"]:
        channels[svc["name"]] = grpc.secure_channel(f"127.0.0.1:{svc['grpc_port']}", mtls)

    # 1. Every gRPC method: no token, wrong token, right token.
    methods = proto_methods()
    su.check(len(methods) >= 23, f"found only {len(methods)} gRPC methods in the protos")
    for service, method, cs, ss in methods:
        channel = channels[PROTO_SERVICES[service]]
        right = API_TOKEN if service == "fp8rl.v1.JobService" else cluster_token
        for label, token in (("no token", None), ("wrong token", WRONG_TOKEN),
                             ("API token on an internal service" if right != API_TOKEN
                              else "cluster token on the job API",
                              API_TOKEN if right != API_TOKEN else cluster_token)):
            code, details = call_code(channel, service, method, cs, ss, token)
            su.check(code == grpc.StatusCode.UNAUTHENTICATED,
                     f"{service}/{method} with {label}: {code.name} {details}")
            su.check(WRONG_TOKEN not in details, f"{service}/{method}: token echoed")
        code, details = call_code(channel, service, method, cs, ss, right)
        su.check(code != grpc.StatusCode.UNAUTHENTICATED,
                 f"{service}/{method} with the right token: {code.name} {details}")
        su.log(f"  {service}/{method}: refused without/with a wrong token; right token -> "
               f"{code.name}")

    # grpc.health stays open on every service (no token): HealthCheckResponse{status: SERVING}
    # is the two bytes 08 01.
    ident = lambda b: b  # noqa: E731
    for name, channel in channels.items():
        reply = channel.unary_unary("/grpc.health.v1.Health/Check", ident, ident)(b"", timeout=10)
        su.check(reply == b"\x08\x01", f"{name}: health without a token answered {reply!r}")

    # 2. A client without the CA, a plaintext client, and (mutual TLS) a client without a
    #    certificate are refused before any handler runs.
    coordinator = channels["coordinator"]
    address = cluster.grpc
    refused = {
        "a client trusting another CA": grpc.secure_channel(
            address, grpc.ssl_channel_credentials(read(os.path.join(other, "ca.pem")),
                                                  read(key), read(cert))),
        "a client without a certificate": grpc.secure_channel(
            address, grpc.ssl_channel_credentials(read(ca))),
        "a plaintext client": grpc.insecure_channel(address),
    }
    for label, channel in refused.items():
        code, details = call_code(channel, "fp8rl.v1.JobService", "ListJobs", False, False,
                                  API_TOKEN)
        su.check(code == grpc.StatusCode.UNAVAILABLE, f"{label}: {code.name} {details}")
        su.log(f"  {label}: refused ({code.name})")
        channel.close()

    # 3. REST over HTTPS: every /v1 route needs the token; health and metrics stay open.
    rest = cluster.rest.replace("http://", "https://")
    routes = [("POST", "/v1/jobs", {}), ("GET", "/v1/jobs", None), ("GET", "/v1/jobs/nope", None),
              ("POST", "/v1/jobs/nope:cancel", None), ("GET", "/v1/jobs/nope/metrics", None)]
    for method, path, payload in routes:
        for label, token in (("no token", None), ("wrong token", WRONG_TOKEN),
                             ("cluster token", cluster_token)):
            status, answer = https(method, rest + path, ca, token, payload)
            su.check(status == 401 and isinstance(answer, dict) and "error" in answer,
                     f"{method} {path} with {label}: {status} {answer}")
        status, answer = https(method, rest + path, ca, API_TOKEN, payload)
        su.check(status in (200, 400, 404), f"{method} {path} with the token: {status} {answer}")
        su.log(f"  {method} {path}: 401 without/with a wrong token; {status} with the token")
    for svc in cluster.state["services"]:
        for path in ("/healthz", "/metrics"):
            status, _ = https("GET", f"https://127.0.0.1:{svc['http_port']}{path}", ca)
            su.check(status == 200, f"{svc['name']} {path} without a token: {status}")
    try:
        https("GET", rest + "/healthz", os.path.join(other, "ca.pem"))
        su.fail("HTTPS with another CA was not refused")
    except urllib.error.URLError as e:
        su.log(f"  HTTPS client with another CA refused: {e.reason}")

    # 4. The trainer confines checkpoint paths to its --data-root (the test's temp folder), even
    #    for a caller with the cluster token that skipped the coordinator's checks.
    sys.path.insert(0, gen_dir)
    from fp8rl.v1 import trainer_pb2
    os.symlink("/etc", os.path.join(cluster.tmp, "etc-link"))
    for label, path in (("absolute", "/etc"), ("..", os.path.join(cluster.tmp, "..", "x")),
                        ("symlink", os.path.join(cluster.tmp, "etc-link", "ckpt"))):
        request = trainer_pb2.LoadCheckpointRequest(path=path).SerializeToString()
        code, details = call_code(channels["trainer"], "fp8rl.v1.TrainerService",
                                  "LoadCheckpoint", False, False, cluster_token, request)
        su.check(code == grpc.StatusCode.INVALID_ARGUMENT and "--data-root" in details,
                 f"LoadCheckpoint {label} path: {code.name} {details}")
        su.log(f"  trainer LoadCheckpoint with a {label} escape: {details}")

    # 5. The CLI: no token -> a clear error; FP8RL_TOKEN + TLS flags -> the smoke job SUCCEEDS.
    tls_flags = ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", key]
    env = dict(os.environ)
    env.pop("FP8RL_TOKEN", None)
    p = subprocess.run([su.FP8RL, "list", "--coordinator", cluster.grpc] + tls_flags,
                       capture_output=True, text=True, env=env, timeout=60)
    su.check(p.returncode != 0 and "FP8RL_TOKEN" in p.stderr,
             f"fp8rl list without a token: rc {p.returncode} {p.stderr}")
    su.log(f"  fp8rl list without a token: {p.stderr.strip()}")
    config_path = su.write_yaml(os.path.join(cluster.tmp, "smoke.yaml"),
                                su.smoke_config(cluster.tmp))
    env["FP8RL_TOKEN"] = API_TOKEN
    p = subprocess.run([su.FP8RL, "submit", config_path, "--coordinator", cluster.grpc, "--quiet"]
                       + tls_flags, capture_output=True, text=True, env=env, timeout=60)
    su.check(p.returncode == 0, f"fp8rl submit: rc {p.returncode} {p.stdout} {p.stderr}")
    job_id = p.stdout.strip()  # --quiet prints the id alone
    su.log(f"  submitted {job_id!r} over TLS")
    deadline = time.time() + 200
    job = None
    while time.time() < deadline:
        status, job = https("GET", f"{rest}/v1/jobs/{job_id}", ca, API_TOKEN)
        su.check(status == 200, f"GET job: {status} {job}")
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(1)
    su.check(job is not None and job["state"] == "SUCCEEDED", f"smoke job over TLS: {job}")
    su.log(f"  smoke job {job_id} SUCCEEDED over mutual TLS with tokens")

    # 6. SIGHUP: the coordinator re-reads its token file.
    with open(token_file, "w") as f:
        f.write(f"{API_TOKEN_NEW}\n")
    os.kill(cluster.pids["coordinator"], signal.SIGHUP)
    deadline = time.time() + 20
    while time.time() < deadline:
        if https("GET", rest + "/v1/jobs", ca, API_TOKEN_NEW)[0] == 200:
            break
        time.sleep(0.2)
    su.check(https("GET", rest + "/v1/jobs", ca, API_TOKEN_NEW)[0] == 200,
             "the new token is not accepted after SIGHUP")
    su.check(https("GET", rest + "/v1/jobs", ca, API_TOKEN)[0] == 401,
             "the old token is still accepted after SIGHUP")
    code, _ = call_code(coordinator, "fp8rl.v1.JobService", "ListJobs", False, False,
                        API_TOKEN_NEW)
    su.check(code == grpc.StatusCode.OK, f"gRPC ListJobs with the reloaded token: {code.name}")
    su.check("token file reloaded" in cluster.log_of("coordinator"), "no reload log line")
    su.check(API_TOKEN not in cluster.log_of("coordinator") and
             cluster_token not in cluster.log_of("coordinator"), "a token appears in the log")
    su.log("  SIGHUP: new token accepted, old one refused")

    for channel in channels.values():
        channel.close()
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(body)
