#!/usr/bin/env python3
"""System test (chaos): SIGKILL every kind of service (coordinator, weight sync, trainer, a
generation worker) at random moments while jobs run on a local cluster under `fp8rl up`, several
times each, in a random order. `fp8rl up` restarts each killed service. Every job must SUCCEED
with metrics rows 0..N exactly once whose values equal those of the same job run without kills
(sample seeds depend only on the step and resumes start from a checkpoint, so a sample lost,
counted twice or trained on twice changes a row), no job may be lost, and every checkpoint
written must be readable (safetensors parsed by the independent reader, and loaded by
`fp8rl export`).

The seed is printed; rerun one with FP8RL_CHAOS_SEED=<seed>. FP8RL_CHAOS_ROUNDS (default 2) is
how many times each kind of service is killed."""

import json
import os
import random
import signal
import sys
import time

import numpy as np

import system_util as su

sys.path.insert(0, os.path.join(su.SOURCE_DIR, "tests", "reference"))
import safetensors_reader  # noqa: E402

STEPS = 24
KINDS = ["coordinator", "weight-sync", "trainer", "generation-worker"]
WORKERS = 2
# Row keys that legitimately differ between a run with kills and one without: wall-clock times,
# the weight version counter (every publish, including a resumed step's, takes a new number) and
# the count of re-sent samples.
VOLATILE = ("time_", "weight_version", "redispatched_samples")


def volatile(key):
    return key.startswith(VOLATILE) or (key.startswith("trainer_") and key.endswith("_seconds"))


def job_config(cluster, tag):
    """The smoke job, longer, with an SFT warm start strong enough that rewards, losses and
    gradients are non-zero (a row of zeros would hide a sample trained on twice)."""
    config = su.smoke_config(os.path.join(cluster.tmp, tag), steps=STEPS)
    config["sft"]["steps"] = 80
    config["sft"]["learning_rate"] = 3e-3
    config["algorithm"]["learning_rate"] = 3e-3
    config["checkpoint"]["every_steps"] = 3
    return config


def read_pids(cluster):
    with open(os.path.join(cluster.data_dir, "cluster.json")) as f:
        return {s["name"]: s["pid"] for s in json.load(f)["services"]}


def rest_retry(cluster, method, path, body=None, timeout=90):
    """A REST call that waits through a coordinator restart; (status, reply)."""
    deadline = time.time() + timeout
    while True:
        status, reply = su.http_quiet(method, cluster.rest + path, body, timeout=10)
        if status is not None and status < 500:
            return status, reply
        if time.time() > deadline:
            su.fail(f"{method} {path}: no answer within {timeout} s ({status} {reply})")
        time.sleep(0.3)


def submit(cluster, tag):
    status, reply = rest_retry(cluster, "POST", "/v1/jobs", job_config(cluster, tag))
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    return reply["id"]


def wait_restarted(cluster, name, old_pid, timeout=90):
    """Seconds until `fp8rl up` restarted `name` under a new pid that answers /healthz."""
    start = time.time()
    while time.time() < start + timeout:
        try:
            pid = read_pids(cluster).get(name)
        except (OSError, ValueError):
            pid = None  # cluster.json being replaced
        if pid and pid != old_pid and su.pid_alive(pid):
            port = cluster.service(name)["http_port"]
            status, _ = su.http_quiet("GET", f"http://127.0.0.1:{port}/healthz")
            if status == 200:
                return time.time() - start
        time.sleep(0.1)
    su.fail(f"{name} was not restarted within {timeout} s:\n{cluster.text()}")


def wait_done(cluster, job_id, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, job = rest_retry(cluster, "GET", f"/v1/jobs/{job_id}")
        su.check(status == 200, f"GET /v1/jobs/{job_id}: {status} {job}")
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        time.sleep(0.3)
    su.fail(f"job {job_id} not finished within {timeout} s:\n{cluster.text()}")


def rows_of(cluster, job_id):
    status, metrics = rest_retry(cluster, "GET", f"/v1/jobs/{job_id}/metrics")
    su.check(status == 200, f"GET metrics of {job_id}: {status} {metrics}")
    steps = [r["step"] for r in metrics["steps"]]
    su.check(steps == list(range(STEPS + 1)), f"job {job_id}: metrics rows {steps}, want 0..{STEPS} once")
    return metrics["steps"]


def check_same_rows(job_id, rows, reference):
    """Every deterministic value of every row equals the run without kills."""
    for row, ref in zip(rows, reference):
        got = {k: v for k, v in row["metrics"].items() if not volatile(k)}
        want = {k: v for k, v in ref["metrics"].items() if not volatile(k)}
        su.check(got.keys() == want.keys(),
                 f"job {job_id} step {row['step']}: keys {sorted(got)} != {sorted(want)}")
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        su.check(not diff, f"job {job_id} step {row['step']}: differs from the run without "
                 f"kills (got, want): {diff}")


def check_checkpoints(cluster, job_id, tag):
    """Every step-N folder the job wrote parses and loads; returns how many there are."""
    folder = os.path.join(cluster.tmp, tag, "checkpoints", job_id)
    names = sorted(os.listdir(folder))
    # Checkpoints are written atomically: no temporary or partial folder may be left.
    su.check(all(n.startswith("step-") for n in names), f"{folder}: unexpected entries {names}")
    steps = sorted(int(n[len("step-"):]) for n in names)
    want = list(range(3, STEPS + 1, 3))
    su.check(steps == want, f"{folder}: checkpoints of steps {steps}, want {want}")
    for step in steps:
        path = os.path.join(folder, f"step-{step}")
        with open(os.path.join(path, "trainer_state.json")) as f:
            state = json.load(f)
        su.check(state.get("format") == "fp8rl-trainer-checkpoint" and
                 state.get("job_id") == job_id and state.get("optimizer_state") is True,
                 f"{path}/trainer_state.json: {state}")
        for file in ("model.safetensors", "optimizer.safetensors"):
            tensors, _ = safetensors_reader.read_file(os.path.join(path, file))
            su.check(tensors, f"{path}/{file}: no tensors")
            for name, (dtype, shape, raw) in tensors.items():
                if dtype not in ("F32", "F16", "BF16", "F8_E4M3"):
                    continue  # integer tensors: their size was checked by read_file
                values = safetensors_reader.decode(dtype, shape, raw)
                su.check(bool(np.isfinite(values).all()),
                         f"{path}/{file}: {name} has non-finite values")
        os.makedirs(os.path.join(cluster.tmp, "export"), exist_ok=True)
        out = os.path.join(cluster.tmp, "export", f"{job_id}-{step}")
        rc, _, err = su.run_cli(["export", "--checkpoint", path, "--out", out, "--format", "hf"])
        su.check(rc == 0, f"fp8rl export --checkpoint {path}: rc {rc} {err}")
    return len(steps)


def body(clusters):
    su.require_binaries()
    seed = int(os.environ.get("FP8RL_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    rounds = int(os.environ.get("FP8RL_CHAOS_ROUNDS", "2"))
    su.log(f"chaos seed {seed} (rerun with FP8RL_CHAOS_SEED={seed}), {rounds} rounds")
    rng = random.Random(seed)

    cluster = su.Cluster(workers=WORKERS)
    clusters.append(cluster)
    cluster.wait_up()

    # The reference: the same job with nothing killed.
    start = time.time()
    reference_id = submit(cluster, "reference")
    job = wait_done(cluster, reference_id, timeout=300)
    su.check(job["state"] == "SUCCEEDED", f"reference job: {job['state']} {job.get('error')}")
    reference = rows_of(cluster, reference_id)
    rewards = [r["metrics"].get("reward_mean", 0.0) for r in reference[1:]]
    su.check(any(rewards) and any(r["metrics"].get("grad_norm", 0.0) for r in reference[1:]),
             f"reference job has all-zero rewards or gradients: {rewards}")
    job_seconds = time.time() - start
    check_checkpoints(cluster, reference_id, "reference")
    su.log(f"reference job {reference_id}: {job_seconds:.1f} s")

    # Every kind `rounds` times, in a random order; each kill at a random moment of a job.
    plan = KINDS * rounds
    rng.shuffle(plan)
    jobs = []  # (id, tag)
    current = None
    kills = []
    for i, kind in enumerate(plan):
        # A random moment of a running job: if the job ended while waiting, start another.
        while True:
            if current is None or wait_state(cluster, current) != "RUNNING_OR_QUEUED":
                tag = f"chaos{len(jobs)}"
                current = submit(cluster, tag)
                jobs.append((current, tag))
            delay = rng.uniform(0.0, min(0.8 * job_seconds, 6.0))
            time.sleep(delay)
            status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{current}")
            if status != 200 or job["state"] in ("QUEUED", "RUNNING"):
                break
        pids = read_pids(cluster)
        name = kind if kind != "generation-worker" else \
            f"generation-worker-{rng.randrange(WORKERS)}"
        moment = f"{job['state']} step {job['step']} phase " \
                 f"{(job.get('progress') or {}).get('phase')}" if status == 200 else "unknown"
        os.kill(pids[name], signal.SIGKILL)
        back = wait_restarted(cluster, name, pids[name])
        kills.append((name, moment, back))
        su.log(f"  kill {i + 1}/{len(plan)}: SIGKILL {name} (pid {pids[name]}) {delay:.1f} s in, "
               f"job {current} {moment}; serving again after {back:.1f} s")

    # Every job (the reference's checks) and none lost.
    for job_id, tag in jobs:
        job = wait_done(cluster, job_id, timeout=400)
        su.check(job["state"] == "SUCCEEDED",
                 f"job {job_id} ended {job['state']} under kills (seed {seed}): {job.get('error')}")
        check_same_rows(job_id, rows_of(cluster, job_id), reference)
        n = check_checkpoints(cluster, job_id, tag)
        su.log(f"job {job_id}: SUCCEEDED, rows 0..{STEPS} equal the reference, {n} checkpoints "
               "readable")
    status, listed = rest_retry(cluster, "GET", "/v1/jobs")
    ids = {j["id"] for j in listed["jobs"]}
    su.check(ids >= {reference_id} | {j for j, _ in jobs}, f"a job was lost: {listed}")
    su.check({name.rsplit("-", 1)[0] if name.startswith("generation") else name
              for name, _, _ in kills} == set(KINDS), f"not every kind was killed: {kills}")

    su.check(cluster.proc.poll() is None, "fp8rl up exited after restarting services")
    cluster.pids = read_pids(cluster)  # the restarted children must stop too
    cluster.stop(expect_rc=0)
    su.log(f"{len(kills)} kills over {len(jobs)} jobs, seed {seed}")


def wait_state(cluster, job_id):
    status, job = rest_retry(cluster, "GET", f"/v1/jobs/{job_id}")
    su.check(status == 200, f"GET /v1/jobs/{job_id}: {status} {job}")
    return "RUNNING_OR_QUEUED" if job["state"] in ("QUEUED", "RUNNING") else job["state"]


if __name__ == "__main__":
    su.main_guard(body)
