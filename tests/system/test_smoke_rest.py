#!/usr/bin/env python3
"""System test: `fp8rl up` on free ports, the smoke job over REST (POST /v1/jobs, poll, metrics
with row 0 + one row per step, the mismatch metrics recomputed from the trainer's logprob log),
bad requests answered 400 naming the field while the service keeps serving, unknown job 404, the
gRPC CLI commands (list/status/watch/cancel/submit) against the same coordinator, then a clean
SIGTERM shutdown with no child left."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import system_util as su


def smoke_config(tmp, steps=None):
    """su.smoke_config with the model's config.json copied under tmp (this test's --models-root)."""
    config = su.smoke_config(tmp, steps)
    model_config = os.path.join(tmp, "models", "tiny.json")
    if not os.path.exists(model_config):
        os.makedirs(os.path.dirname(model_config), exist_ok=True)
        shutil.copyfile(config["model"]["init"]["config"], model_config)
    config["model"]["init"]["config"] = model_config
    return config


def bad_requests(cluster, good):
    url = f"{cluster.rest}/v1/jobs"
    wrong_type = copy.deepcopy(good)
    wrong_type["algorithm"]["steps"] = "three"
    unknown = copy.deepcopy(good)
    unknown["algorithm"]["bogus_knob"] = 1
    out_of_range = copy.deepcopy(good)
    out_of_range["algorithm"]["samples_per_prompt"] = 1
    bad_checkpoint = copy.deepcopy(good)
    bad_checkpoint["model"] = {"checkpoint": os.path.join(cluster.tmp, "no-such-model")}
    outside_checkpoint = copy.deepcopy(good)
    outside_checkpoint["model"] = {"checkpoint": "/nonexistent/fp8rl-model"}
    cases = [
        ("malformed JSON", b'{"name": "x", "model": ', None),
        ("unknown field", unknown, "algorithm.bogus_knob"),
        ("wrong type", wrong_type, "algorithm.steps"),
        ("out of range", out_of_range, "algorithm.samples_per_prompt"),
        ("missing checkpoint folder", bad_checkpoint, "model.checkpoint"),
        ("checkpoint outside --models-root", outside_checkpoint, "model.checkpoint"),
        ("oversized body", b'{"name": "' + b"x" * (2 << 20) + b'"}', "body"),
        ("not an object", b"[1, 2]", "body"),
    ]
    for what, body, field in cases:
        status, reply = su.http("POST", url, body)
        su.log(f"  {what}: {status} {str(reply)[:160]}")
        su.check(status == 400, f"{what}: expected 400, got {status} {reply}")
        su.check(isinstance(reply, dict) and "error" in reply, f"{what}: no JSON error: {reply}")
        if field is not None:
            su.check(field in reply["error"], f"{what}: error does not name {field}: {reply}")
        status, _ = su.http("GET", f"{cluster.rest}/healthz")
        su.check(status == 200, f"coordinator unhealthy after {what}")
    status, reply = su.http("GET", f"{cluster.rest}/v1/jobs/job-does-not-exist")
    su.check(status == 404, f"unknown job: expected 404, got {status} {reply}")
    status, reply = su.http("GET", f"{cluster.rest}/v1/jobs/job-does-not-exist/metrics")
    su.check(status == 404, f"unknown job metrics: expected 404, got {status} {reply}")


def cli_commands(cluster, job_id, tmp):
    coord = ["--coordinator", cluster.grpc]
    rc, out, err = su.run_cli(["list"] + coord)
    su.check(rc == 0 and job_id in out and "SUCCEEDED" in out, f"fp8rl list: {rc} {out} {err}")
    rc, out, err = su.run_cli(["status", job_id] + coord)
    su.check(rc == 0 and "state:    SUCCEEDED" in out and "val_accuracy" in out,
             f"fp8rl status: {rc} {out} {err}")
    rc, out, err = su.run_cli(["status"] + coord)  # newest job
    su.check(rc == 0 and job_id in out, f"fp8rl status (newest): {rc} {out} {err}")
    rc, out, err = su.run_cli(["watch", job_id] + coord)
    su.check(rc == 0 and "SUCCEEDED" in out and "val accuracy before" in out,
             f"fp8rl watch (finished job): {rc} {out} {err}")
    rc, out, err = su.run_cli(["status", "job-nope"] + coord)
    su.check(rc == 1 and err.count("\n") == 1 and "job-nope" in err,
             f"fp8rl status unknown: {rc} {out!r} {err!r}")
    rc, out, err = su.run_cli(["cancel", job_id] + coord)
    su.check(rc == 1 and err.count("\n") == 1, f"fp8rl cancel finished job: {rc} {out} {err}")
    # A bad config is rejected before anything is sent, naming the field.
    bad = smoke_config(tmp)
    bad["algorithm"]["samples_per_prompt"] = 1
    path = su.write_yaml(os.path.join(tmp, "bad.yaml"), bad)
    rc, out, err = su.run_cli(["submit", path] + coord)
    su.check(rc == 1 and "algorithm.samples_per_prompt" in err and err.count("\n") == 1,
             f"fp8rl submit bad: {rc} {out} {err}")
    rc, out, err = su.run_cli(["list", "--state", "finished"] + coord)
    su.check(rc == 2 and "--state" in err, f"fp8rl list --state finished: {rc} {err}")
    # Submit + cancel a real job over gRPC.
    good = su.write_yaml(os.path.join(tmp, "cancel-me.yaml"), smoke_config(tmp, steps=50))
    rc, out, err = su.run_cli(["submit", good, "--quiet"] + coord)
    su.check(rc == 0 and out.startswith("job-"), f"fp8rl submit: {rc} {out} {err}")
    new_id = out.strip()
    rc, out, err = su.run_cli(["cancel", new_id] + coord)
    su.check(rc == 0 and new_id in out, f"fp8rl cancel: {rc} {out} {err}")
    job = su.wait_job(cluster, new_id, timeout=90)
    su.check(job["state"] == "CANCELLED", f"cancelled job ended {job['state']}: {job}")
    # The job's newest checkpoint (step 3) exported as a Hugging Face folder, read back with the
    # independent reader: every tensor the BF16 rounding of the trainer's F32 checkpoint.
    sys.path.insert(0, os.path.join(su.SOURCE_DIR, "tests", "reference"))
    import safetensors_reader as st
    export_dir = os.path.join(tmp, "export-hf")
    rc, out, err = su.run_cli(["export", "--job", job_id, "--out", export_dir, "--format", "hf"]
                              + coord)
    su.check(rc == 0 and "step-3" in out, f"fp8rl export --job: {rc} {out} {err}")
    su.log("  " + out.strip())
    if rc == 0:
        source = os.path.join(tmp, "checkpoints", job_id, "step-3")
        src, _, _ = st.read_checkpoint(source)
        got, _, _ = st.read_checkpoint(export_dir)
        su.check(set(got) == {n for n in src if not n.endswith(("k_scale", "v_scale"))},
                 f"export --job: tensors {sorted(set(got) ^ set(src))}")
        for name, (dtype, shape, raw) in got.items():
            want = st.round_bf16(st.decode(*src[name]))
            su.check(dtype == "BF16" and (st.decode(dtype, shape, raw) == want).all(),
                     f"export --job: {name} is not the BF16 rounding of the checkpoint")
        # A job starts from the export (sharded BF16 this time, no tokenizer files: the byte
        # tokenizer) and runs to the end.
        sharded = os.path.join(tmp, "export-hf-sharded")
        rc, out, err = su.run_cli(["export", "--checkpoint", export_dir, "--out", sharded,
                                   "--format", "hf", "--max-shard-bytes", "200000"])
        su.check(rc == 0 and os.path.exists(os.path.join(sharded, "model.safetensors.index.json")),
                 f"fp8rl export sharded: {rc} {out} {err}")
        again = smoke_config(tmp, steps=1)
        again["model"] = {"checkpoint": sharded}
        again.pop("sft", None)
        status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", again)
        su.check(status == 201, f"POST job from the export: {status} {reply}")
        if status == 201:
            job = su.wait_job(cluster, reply["id"], timeout=90)
            su.check(job["state"] == "SUCCEEDED",
                     f"job from the export ended {job['state']}: {job.get('error')}")
    rc, out, err = su.run_cli(["export", "--job", "job-nope", "--out", export_dir + "-2",
                               "--format", "hf"] + coord)
    su.check(rc == 1 and err.count("\n") == 1 and "job-nope" in err and
             not os.path.exists(export_dir + "-2"), f"fp8rl export unknown job: {rc} {err!r}")
    # Unreachable coordinator: one line, non-zero.
    closed = f"127.0.0.1:{su.free_port_offset(1) + 50051}"
    rc, out, err = su.run_cli(["list", "--coordinator", closed, "--connect-timeout", "1"])
    su.check(rc == 1 and err.count("\n") == 1 and "cannot reach the coordinator" in err,
             f"unreachable: {rc} {err!r}")


def body(clusters):
    su.require_binaries()
    # The models root is the temp folder, so the job started from an export below (written
    # there) is inside it; the smoke model's config.json is copied there too.
    tmp = tempfile.mkdtemp(prefix="fp8rl-system-")
    cluster = su.Cluster(workers=2, tmp=tmp, extra_args=["--models-root", tmp])
    clusters.append(cluster)
    cluster.wait_up()
    good = smoke_config(tmp)
    # FP8 generation with BF16 training: a real sampler/learner mismatch, so the recomputation
    # of the mismatch metrics below compares values other than exactly 1 and 0.
    good["precision"]["training"] = "bf16"
    steps = good["algorithm"]["steps"]

    bad_requests(cluster, good)

    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", good)
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    su.check(reply["state"] in ("QUEUED", "RUNNING"), f"new job state {reply}")
    job_id = reply["id"]
    job = su.wait_job(cluster, job_id)
    su.check(job["state"] == "SUCCEEDED", f"job ended {job['state']}: {job.get('error')}")
    su.check(job["step"] == steps, f"job step {job['step']} != {steps}")

    status, metrics = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
    su.check(status == 200, f"metrics: {status} {metrics}")
    rows = metrics["steps"]
    su.check([r["step"] for r in rows] == list(range(steps + 1)),
             f"metrics rows {[r['step'] for r in rows]} != 0..{steps}")
    su.check("val_accuracy" in rows[0]["metrics"], "row 0 lacks val_accuracy")
    su.check("val_accuracy" in rows[-1]["metrics"], "last row lacks val_accuracy")
    for r in rows[1:]:
        for key in ("reward_mean", "token_mult_prob_error", "time_generate_seconds",
                    "time_train_seconds"):
            su.check(key in r["metrics"], f"row {r['step']} lacks {key}")
    su.log(f"  metrics rows: {len(rows)}; row {steps}: " + json.dumps(rows[-1]["metrics"])[:300])
    # The mismatch metrics of every step, recomputed from the trainer's per-token logprob log by
    # an independent implementation of their definitions.
    recompute = subprocess.run(
        [sys.executable, os.path.join(su.SOURCE_DIR, "scripts", "recompute_mismatch.py"),
         "--log-dir", os.path.join(cluster.data_dir, "trainer", "logprobs"), "--job", job_id,
         "--coordinator", cluster.rest], capture_output=True, text=True, timeout=60)
    su.check(recompute.returncode == 0,
             f"recompute_mismatch failed ({recompute.returncode}): {recompute.stdout[-800:]} "
             f"{recompute.stderr[-800:]}")
    su.log("  " + recompute.stdout.strip().splitlines()[-1])
    status, listing = su.http("GET", f"{cluster.rest}/v1/jobs")
    su.check(status == 200 and job_id in json.dumps(listing), f"GET /v1/jobs: {status}")

    cli_commands(cluster, job_id, tmp)

    text = cluster.stop(expect_rc=0)
    su.check("cluster stopped" in text, "fp8rl up did not report the shutdown")
    for name in cluster.pids:
        log = cluster.log_of(name)
        su.check(re.search(r"fatal|segmentation|core dumped|terminate called", log, re.I) is None,
                 f"{name} log shows a crash")


if __name__ == "__main__":
    su.main_guard(body)
