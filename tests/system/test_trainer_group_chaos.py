#!/usr/bin/env python3
"""System test (chaos, trainer groups): a rank of a data-parallel trainer group of 2 (Gloo over
loopback, `fp8rl up --trainers 2`) is SIGKILLed twice in one job, at moments the test makes sure
of, and the job must come through as if nothing happened.

  (a) During a group training step: when the job's phase is "train" at a step the seed picks, the
      rank the seed picks is stopped (SIGSTOP); if the phase is still that step's "train" 0.3 s
      later, the TrainStep call is in flight (no rank can finish it without the stopped one) and
      the rank is SIGKILLed; else it is continued and a later step is tried.
  (b) During a weight push: weight sync is stopped (SIGSTOP) while the job is in the "train"
      phase of a later seeded step, before the step's upload begins; when the job reaches that
      step's "publish" phase, rank 0 (the rank that uploads the version to weight sync) is
      SIGKILLed with its upload in flight, and weight sync is continued.

`fp8rl up` restarts the killed rank; the coordinator forms the group again and resumes the job
from its last checkpoint. Checked: the job SUCCEEDS; its metrics rows are 0..N exactly once and
every deterministic value equals that of the same job run undisturbed first (test_chaos.py's
comparison); the coordinator's trainer_lost events name the train step and the publish call the
kills hit; every checkpoint loads (safetensors reader and `fp8rl export`); each loss shows a
group_reformed event, and the group formed again well within the group timeout (60 s).

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


def wait_detail(cluster, job_id, detail, from_step, deadline):
    """The step whose `detail` phase the job is in, once it is in one of a step >= from_step."""
    while time.time() < deadline:
        state, now, step = progress(cluster, job_id)
        su.check(state in ("QUEUED", "RUNNING"), f"job ended before the kill: {state}")
        if now == detail and step >= from_step:
            return step
        time.sleep(0.01)
    su.fail(f"the job reached no '{detail}' of a step >= {from_step} in time")


def kill_in_train_step(cluster, job_id, name, from_step, timeout=150):
    """(a) SIGKILLs rank `name` while a TrainStep of a step >= from_step is in flight; returns
    the step. The rank is stopped first: if the job is still in that step's "train" phase 0.3 s
    later, no rank can have finished the call (the others wait for the stopped one)."""
    deadline = time.time() + timeout
    while True:
        step = wait_detail(cluster, job_id, "train", from_step, deadline)
        pid = su.read_pids(cluster)[name]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.3)
        _, later, later_step = progress(cluster, job_id)
        if (later, later_step) == ("train", step):
            os.kill(pid, signal.SIGKILL)
            su.log(f"  SIGKILL {name} (pid {pid}) inside TrainStep of step {step}")
            return step
        os.kill(pid, signal.SIGCONT)
        su.log(f"  TrainStep of step {step} ended before {name} was stopped; trying a later step")
        from_step = step + 1


def kill_in_weight_push(cluster, job_id, from_step, timeout=150):
    """(b) SIGKILLs rank 0 ("trainer", the rank that uploads) while weight sync receives the
    version of a step >= from_step; returns the step. Weight sync is stopped during the step's
    TrainStep, before the upload starts, so the version cannot be stored; once the job is in that
    step's "publish" phase the upload is in flight, rank 0 is killed and weight sync continued."""
    deadline = time.time() + timeout
    sync = su.read_pids(cluster)["weight-sync"]
    while True:
        step = wait_detail(cluster, job_id, "train", from_step, deadline)
        os.kill(sync, signal.SIGSTOP)
        # Still in that TrainStep after the stop: the upload after it has not begun.
        if progress(cluster, job_id)[1:] == ("train", step):
            break
        os.kill(sync, signal.SIGCONT)
        su.log(f"  TrainStep of step {step} ended before weight sync was stopped; a later step")
        from_step = step + 1
    try:
        while time.time() < deadline:
            _, now, now_step = progress(cluster, job_id)
            if (now, now_step) == ("publish", step):
                break
            su.check(now_step == step and now == "train",
                     f"the job left step {step}'s train phase for {now} of {now_step}")
            time.sleep(0.01)
        time.sleep(0.2)  # the upload is on its way; weight sync cannot finish receiving it
        pid = su.read_pids(cluster)["trainer"]
        os.kill(pid, signal.SIGKILL)
        su.log(f"  SIGKILL trainer (rank 0, pid {pid}) while weight sync receives the version of "
               f"step {step}")
    finally:
        os.kill(sync, signal.SIGCONT)
    return step


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
    hit_train = kill_in_train_step(cluster, job_id, train_rank, train_step)
    # (b) rank 0 killed while weight sync receives the version it uploads.
    hit_push = kill_in_weight_push(cluster, job_id, max(push_step, hit_train + 3))

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
    # Each loss re-formed the group, without waiting out the group timeout (60 s) for the lost
    # rank's stale registry entry: a rank that cannot join abandons the group at the rendezvous.
    reformed = [e["message"] for e in events["events"] if e["kind"] == "group_reformed"]
    waits = [float(re.search(r"formed again after ([0-9.]+) s", m).group(1)) for m in reformed]
    su.log(f"  group_reformed after {waits} s")
    su.check(len(waits) >= 2 and max(waits) < 30, f"group_reformed events: {reformed}")
    port = cluster.service("weight-sync")["http_port"]
    _, text = su.http_quiet("GET", f"http://127.0.0.1:{port}/metrics")
    su.log("  weight sync: " + "; ".join(
        line for line in str(text).splitlines() if line.startswith("fp8rl_weight_sync_uploads")))
    su.check(cluster.log_of("coordinator").count("resuming job after trainer loss") >= 2,
             "the coordinator log does not show two resumes")
    for job_tag in ((reference_id, "reference"), (job_id, "chaos")):
        n = chaos.check_checkpoints(cluster, *job_tag)
        su.log(f"  {job_tag[1]}: {n} checkpoints readable")
    cluster.pids = su.read_pids(cluster)  # the restarted ranks must stop too
    cluster.stop(expect_rc=0)


if __name__ == "__main__":
    su.main_guard(main_body)
