#!/usr/bin/env python3
"""System test (chaos, trainer groups): a rank of a data-parallel trainer group of 2 (Gloo over
loopback, `fp8rl up --trainers 2`) is SIGKILLed twice in one job, at moments the test makes sure
of, and the job must come through as if nothing happened.

  (a) During a group training step: when the job's phase is "train" at a step the seed picks, the
      rank the seed picks is stopped (SIGSTOP); if the phase is still that step's "train" 0.3 s
      later, the TrainStep call is in flight (no rank can finish it without the stopped one) and
      the rank is SIGKILLed; else it is continued and a later step is tried.
  (b) During a weight push: when the phase is "publish" at a later seeded step, rank 0 (the rank
      that uploads the new version to weight sync) is stopped; if weight sync's newest complete
      version (fp8rl_weight_sync_latest_version) is still the previous step's while the phase is
      unchanged, the version is being received and rank 0 is SIGKILLed.

`fp8rl up` restarts the killed rank; the coordinator forms the group again and resumes the job
from its last checkpoint. Checked: the job SUCCEEDS; its metrics rows are 0..N exactly once and
every deterministic value equals that of the same job run undisturbed first (test_chaos.py's
comparison); the coordinator's trainer_lost events name the train step and the publish call the
kills hit; every checkpoint loads (safetensors reader and `fp8rl export`).

The seed is printed; rerun one with FP8RL_CHAOS_SEED=<seed> (it picks the steps and the rank of
(a); when a kill lands is measured, not seeded)."""

import os
import random
import re
import signal
import time

import system_util as su
import test_chaos as chaos

chaos.STEPS = 15  # its job_config, rows_of and check_checkpoints read the module's STEPS


def job_config(cluster, tag):
    config = chaos.job_config(cluster, tag)
    config["trainer"] = {"data_parallel": 2}
    return config


def submit(cluster, tag):
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", job_config(cluster, tag))
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    return reply["id"]


def progress(cluster, job_id):
    """(state, phase detail, step in progress) of the job now."""
    status, job = su.http_quiet("GET", f"{cluster.rest}/v1/jobs/{job_id}")
    su.check(status == 200, f"GET job: {status} {job}")
    p = job.get("progress") or {}
    step = p.get("done", -1) + 1 if p.get("phase") == "rl" else -1
    return job["state"], p.get("detail") if p.get("phase") == "rl" else p.get("phase"), step


def weight_sync_version(cluster):
    port = cluster.service("weight-sync")["http_port"]
    status, text = su.http_quiet("GET", f"http://127.0.0.1:{port}/metrics")
    su.check(status == 200, f"weight sync /metrics: {status}")
    m = re.search(r"^fp8rl_weight_sync_latest_version (\S+)$", text, re.M)
    su.check(m is not None, "no fp8rl_weight_sync_latest_version")
    return int(float(m.group(1)))


def kill_during(cluster, job_id, detail, name, from_step, in_flight, timeout=150):
    """SIGKILLs service `name` while the job's `detail` call of a step >= from_step is held in
    flight by it (see the module text); returns the step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        state, now, step = progress(cluster, job_id)
        su.check(state in ("QUEUED", "RUNNING"), f"job ended before the kill: {state}")
        if now != detail or step < from_step:
            time.sleep(0.01)
            continue
        pid = su.read_pids(cluster)[name]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.3)
        state, later, later_step = progress(cluster, job_id)
        if later == detail and later_step == step and in_flight(step):
            os.kill(pid, signal.SIGKILL)
            su.log(f"  SIGKILL {name} (pid {pid}) during '{detail}' of step {step}")
            return step
        os.kill(pid, signal.SIGCONT)
        su.log(f"  '{detail}' of step {step} ended before {name} was stopped; trying a later step")
        from_step = step + 1
    su.fail(f"no '{detail}' call caught in flight within {timeout} s")


def main_body(clusters):
    su.require_binaries()
    seed = int(os.environ.get("FP8RL_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    su.log(f"chaos seed {seed} (rerun with FP8RL_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    train_step = rng.randrange(3, 7)
    train_rank = rng.choice(["trainer", "trainer-1"])
    push_step = rng.randrange(9, chaos.STEPS - 1)

    cluster = su.Cluster(workers=1, trainers=2)
    clusters.append(cluster)
    cluster.wait_up()

    reference_id = submit(cluster, "reference")
    job = su.wait_job(cluster, reference_id, timeout=150)
    su.check(job["state"] == "SUCCEEDED", f"reference job: {job['state']} {job.get('error')}")
    reference = chaos.rows_of(cluster, reference_id)
    su.check(any(r["metrics"].get("grad_norm", 0.0) for r in reference[1:]),
             "reference job has all-zero gradients")

    job_id = submit(cluster, "chaos")
    # (a) a rank killed inside TrainStep.
    hit_train = kill_during(cluster, job_id, "train", train_rank, train_step, lambda step: True)
    # (b) rank 0 killed while weight sync receives the version it uploads: the phase is "publish"
    # and weight sync's newest complete version is still the one of the step before.
    def pushing(step):
        status, metrics = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
        rows = metrics["steps"] if status == 200 else []
        before = [r for r in rows if r["step"] == step - 1]
        return bool(before) and weight_sync_version(cluster) <= \
            before[0]["metrics"]["weight_version"]
    hit_push = kill_during(cluster, job_id, "publish", "trainer", max(push_step, hit_train + 3),
                           pushing)

    job = su.wait_job(cluster, job_id, timeout=200)
    su.check(job["state"] == "SUCCEEDED",
             f"job ended {job['state']} after rank kills (seed {seed}): {job.get('error')}")
    chaos.check_same_rows(job_id, chaos.rows_of(cluster, job_id), reference)
    su.log(f"  rows 0..{chaos.STEPS} once, equal to the undisturbed run's")
    status, events = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/events")
    lost = [e["message"] for e in events["events"] if e["kind"] == "trainer_lost"]
    su.log(f"  trainer_lost events: {lost}")
    su.check(any(m.startswith(f"train step {hit_train}:") for m in lost),
             f"no trainer_lost event for the train step {hit_train}: {lost}")
    su.check(any(m.startswith("publish:") for m in lost),
             f"no trainer_lost event for the publish of step {hit_push}: {lost}")
    su.check(cluster.log_of("coordinator").count("resuming job after trainer loss") >= 2,
             "the coordinator log does not show two resumes")
    for job_tag in ((reference_id, "reference"), (job_id, "chaos")):
        n = chaos.check_checkpoints(cluster, *job_tag)
        su.log(f"  {job_tag[1]}: {n} checkpoints readable")
    cluster.pids = su.read_pids(cluster)  # the restarted ranks must stop too
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(main_body)
