"""Shared helpers of the fp8rl system tests: find the binaries, pick free loopback ports, start
`fp8rl up` as a real local cluster, talk REST with urllib, and check that nothing is left
running. Standard library only (plus PyYAML to turn the smoke config into JSON)."""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

SOURCE_DIR = os.environ.get(
    "FP8RL_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN_DIR = os.environ.get("FP8RL_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
FP8RL = os.path.join(BIN_DIR, "fp8rl")
SERVICES = ["fp8rl-coordinator", "fp8rl-weight-sync", "fp8rl-trainer-worker",
            "fp8rl-generation-worker"]
SKIP = 77  # ctest SKIP_RETURN_CODE

# Default ports (docs/design/services.md "Services and ports"); generation worker i adds i.
CORE_PORTS = [50051, 8080, 50052, 9402, 50053, 9403]


def log(message):
    print(message, flush=True)


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def require_binaries():
    missing = [b for b in ["fp8rl"] + SERVICES if not os.access(os.path.join(BIN_DIR, b), os.X_OK)]
    if missing:
        print(f"SKIP: not built in {BIN_DIR}: {', '.join(missing)}", flush=True)
        sys.exit(SKIP)


def port_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port_offset(workers=2, trainers=1):
    """An offset whose every cluster port is free now (fp8rl up re-checks and names a clash)."""
    rng = random.Random(os.getpid() ^ int(time.time() * 1000))
    for _ in range(500):
        offset = rng.randrange(1000, 15000)
        ports = [p + offset for p in CORE_PORTS]
        ports += [50061 + i + offset for i in range(workers)] + [9461 + i + offset for i in range(workers)]
        # Trainers beyond the first (fp8rl up --trainers): 50100 + i and 9500 + i.
        ports += [50100 + i + offset for i in range(1, trainers)]
        ports += [9500 + i + offset for i in range(1, trainers)]
        if all(port_free(p) for p in ports):
            return offset
    fail("no free port offset found")


def smoke_config(tmp_dir, steps=None):
    """configs/smoke.yaml as a dict with absolute paths and checkpoints under tmp_dir."""
    with open(os.path.join(SOURCE_DIR, "configs", "smoke.yaml")) as f:
        config = yaml.safe_load(f)
    init = config["model"]["init"]
    init["config"] = os.path.join(SOURCE_DIR, init["config"])
    config["checkpoint"]["dir"] = os.path.join(tmp_dir, "checkpoints")
    if steps is not None:
        config["algorithm"]["steps"] = steps
    return config


def write_yaml(path, config):
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


def http(method, url, body=None, timeout=30):
    """(status, parsed JSON or text) for a REST call; never raises for HTTP error statuses."""
    data = None
    headers = {}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def http_quiet(method, url, body=None, timeout=5):
    """Like http(), but (None, reason) when nothing answers (a service being restarted)."""
    try:
        return http(method, url, body, timeout)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
        return None, str(e)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def run_cli(args, timeout=60):
    """Runs `fp8rl ARGS`; returns (rc, stdout, stderr)."""
    p = subprocess.run([FP8RL] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Cluster:
    """`fp8rl up` in the background on free ports, with its output in a file."""

    def __init__(self, workers=2, extra_args=(), tmp=None, offset=None, trainers=1):
        """A new temp folder and free ports, or (restart) those of an earlier cluster. The
        coordinator's --data-root is the temp folder (checkpoints of smoke_config go there); the
        model and dataset roots stay the working directory (the source tree)."""
        self.tmp = tmp or tempfile.mkdtemp(prefix="fp8rl-system-")
        self.data_dir = os.path.join(self.tmp, "data")
        self.offset = free_port_offset(workers, trainers) if offset is None else offset
        self.workers = workers
        self.output_path = os.path.join(self.tmp, "up.out")
        self.output = open(self.output_path, "w")
        args = [FP8RL, "up", "--workers", str(workers), "--port-offset", str(self.offset),
                "--data-dir", self.data_dir, "--data-root", self.tmp] + list(extra_args)
        if trainers > 1:
            args += ["--trainers", str(trainers)]
        log("starting: " + " ".join(args))
        self.proc = subprocess.Popen(args, stdout=self.output, stderr=subprocess.STDOUT)
        self.state = None
        self.pids = {}

    def text(self):
        with open(self.output_path) as f:
            return f.read()

    def wait_up(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                fail(f"fp8rl up exited with {self.proc.returncode}:\n{self.text()}")
            if "fp8rl cluster is up" in self.text():
                with open(os.path.join(self.data_dir, "cluster.json")) as f:
                    self.state = json.load(f)
                self.pids = {s["name"]: s["pid"] for s in self.state["services"]}
                log(self.text())
                return self
            time.sleep(0.2)
        fail(f"fp8rl up not ready within {timeout} s:\n{self.text()}")

    @property
    def rest(self):
        return f"http://127.0.0.1:{8080 + self.offset}"

    @property
    def grpc(self):
        return f"127.0.0.1:{50051 + self.offset}"

    def service(self, name):
        return next(s for s in self.state["services"] if s["name"] == name)

    def log_of(self, name):
        with open(self.service(name)["log"], errors="replace") as f:
            return f.read()

    def stop(self, expect_rc=0):
        """SIGTERM to `fp8rl up`; checks its exit code and that every child is gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                fail("fp8rl up did not stop within 60 s of SIGTERM")
        self.output.close()
        text = self.text()
        log("--- fp8rl up output (tail) ---\n" + "\n".join(text.splitlines()[-15:]))
        left = [name for name, pid in self.pids.items() if pid_alive(pid)]
        check(not left, f"children still running after fp8rl up stopped: {left}")
        check(not os.path.exists(os.path.join(self.data_dir, "cluster.json")),
              "cluster.json left behind")
        if expect_rc is not None:
            check(self.proc.returncode == expect_rc,
                  f"fp8rl up exited with {self.proc.returncode}, expected {expect_rc}")
        return text

    def kill_all(self):
        """Cleanup after a failure: take the launcher down (its children die with it)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_job(cluster, job_id, timeout=150, on_poll=None):
    """Polls GET /v1/jobs/{id} until a terminal state; returns the job JSON."""
    deadline = time.time() + timeout
    last_step = None
    while time.time() < deadline:
        status, job = http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        check(status == 200, f"GET /v1/jobs/{job_id}: {status} {job}")
        if job.get("step") != last_step:
            last_step = job.get("step")
            log(f"  job {job_id}: {job['state']} step {job.get('step')}/{job.get('total_steps')}")
        if on_poll is not None:
            on_poll(job)
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        time.sleep(0.5)
    fail(f"job {job_id} not finished within {timeout} s")


def read_pids(cluster):
    """Service name -> pid as `fp8rl up` has them now (cluster.json is rewritten on a restart)."""
    with open(os.path.join(cluster.data_dir, "cluster.json")) as f:
        return {s["name"]: s["pid"] for s in json.load(f)["services"]}


def metrics_rows(cluster, job_id, total):
    """{step: metrics} of a job whose rows must be exactly 0..total, each once."""
    status, metrics = http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
    check(status == 200, f"metrics of {job_id}: {status}")
    steps = [r["step"] for r in metrics["steps"]]
    check(steps == list(range(total + 1)), f"job {job_id}: metrics rows {steps}, want 0..{total}")
    return {r["step"]: r["metrics"] for r in metrics["steps"]}


def kill_at_step(cluster, job_id, name, step, timeout=200):
    """SIGKILLs service `name` once the running job has reached `step`; returns the pid."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, job = http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        check(job["state"] in ("QUEUED", "RUNNING"), f"job ended early: {job}")
        if job["step"] >= step:
            pid = read_pids(cluster)[name]
            os.kill(pid, signal.SIGKILL)
            log(f"  SIGKILL {name} (pid {pid}) at step {job['step']}")
            return pid
        time.sleep(0.2)
    fail(f"job {job_id} never reached step {step}")


def main_guard(body):
    """Runs a test body with a list to register clusters in; whatever happens, no cluster is left
    behind (the launcher is killed, and its children die with it)."""
    clusters = []
    try:
        body(clusters)
    finally:
        for c in clusters:
            c.kill_all()
    for c in clusters:  # kept on failure for the logs
        shutil.rmtree(c.tmp, ignore_errors=True)
    log("PASS")
