#!/usr/bin/env python3
"""System test (storage): disks that turn read-only while a job runs, on a local cluster under
`fp8rl up`.

1. checkpoint.dir is a tmpfs remounted read-only after the job's first checkpoints (between two
   saves: a remount waits for the trainer to close its files). The next SaveCheckpoint fails; the
   job must end FAILED with an error naming that step and the read-only file system, keep its rows
   0..K-1 (K: the failed checkpoint's step), leave no partial step folder, and the checkpoints
   written before stay readable. Remounted writable, the same folder takes a new job's checkpoints.

2. The coordinator's job store (<data dir>/coordinator/jobs.db) lies on a small ext4 loop device
   mounted errors=remount-ro; mid-job an ext4 error is triggered (/sys/fs/ext4/<dev>/
   trigger_fs_error), which turns the file system read-only under the open database, as a failing
   disk would. The coordinator must not hang or drop a row silently: within its store retry
   (--store-retry-seconds, 10 s) the job is reported FAILED with an error naming the job store, the
   step whose row could not be written and the read-only file system; the rows recorded before
   stay readable. Then the cluster is stopped, the file system repaired (e2fsck) and mounted
   writable again, and a cluster restarted on the same store finds the job still RUNNING there
   (its end could not be stored), resumes it from its last checkpoint and it SUCCEEDS with rows
   0..N exactly once.

Needs root (mount, losetup, mkfs.ext4, e2fsck); skipped with a message otherwise."""

import os
import re
import shutil
import subprocess
import sys
import time

import system_util as su

sys.path.insert(0, os.path.join(su.SOURCE_DIR, "tests", "reference"))
import safetensors_reader  # noqa: E402

STEPS = 40
EVERY = 2


def need(condition, why):
    if not condition:
        print(f"SKIP: {why}", flush=True)
        raise SystemExit(su.SKIP)


def sh(args, check=True):
    p = subprocess.run(args, capture_output=True, text=True)
    if check:
        su.check(p.returncode == 0, f"{' '.join(args)}: rc {p.returncode}: {p.stderr.strip()}")
    return p


def job_config(tmp, tag, checkpoint_dir=None, steps=STEPS):
    config = su.smoke_config(os.path.join(tmp, tag), steps=steps)
    config["checkpoint"]["every_steps"] = EVERY
    config["validation"]["every_steps"] = 0  # validation at the last step only: shorter steps
    if checkpoint_dir is not None:
        config["checkpoint"]["dir"] = checkpoint_dir
    return config


def submit(cluster, config):
    status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", config)
    su.check(status == 201, f"POST /v1/jobs: {status} {reply}")
    return reply["id"]


def wait_step(cluster, job_id, step, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, job = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        su.check(status == 200 and job["state"] in ("QUEUED", "RUNNING"), f"job ended early: {job}")
        if job["step"] >= step:
            return job["step"]
        time.sleep(0.1)
    su.fail(f"job {job_id} did not reach step {step} within {timeout} s")


def row_steps(cluster, job_id):
    status, metrics = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}/metrics")
    su.check(status == 200, f"metrics of {job_id}: {status} {metrics}")
    return [r["step"] for r in metrics["steps"]]


def check_readable(folder):
    """Every file of a checkpoint folder parses as safetensors."""
    for name in ("model.safetensors", "optimizer.safetensors"):
        tensors, _ = safetensors_reader.read_file(os.path.join(folder, name))
        su.check(tensors, f"{folder}/{name}: no tensors")


def checkpoint_dir_readonly(cluster):
    ckpt = os.path.join(cluster.tmp, "ro-ckpt")
    os.makedirs(ckpt)
    p = sh(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", ckpt], check=False)
    need(p.returncode == 0, f"mount -t tmpfs not permitted here: {p.stderr.strip()}")
    try:
        job_id = submit(cluster, job_config(cluster.tmp, "ro", os.path.join(ckpt, "c")))
        wait_step(cluster, job_id, EVERY + 1)
        # A remount read-only is refused (EBUSY) while the trainer has a checkpoint file open.
        deadline = time.time() + 60
        while sh(["mount", "-o", "remount,ro", ckpt], check=False).returncode != 0:
            su.check(time.time() < deadline, "checkpoint tmpfs could not be remounted read-only")
            time.sleep(0.02)
        _, job = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        su.log(f"  checkpoint.dir read-only from step {job['step']}")
        job = su.wait_job(cluster, job_id, timeout=120)
        su.log(f"  job: {job['state']}: {job['error']}")
        su.check(job["state"] == "FAILED", f"expected FAILED, got {job['state']}")
        m = re.search(r"checkpoint at step (\d+)", job["error"])
        su.check(m is not None and "Read-only file system" in job["error"],
                 f"the error does not name the step and the read-only disk: {job['error']}")
        failed = int(m.group(1))
        su.check(failed % EVERY == 0 and failed > EVERY, f"checkpoint step {failed}")
        steps = row_steps(cluster, job_id)
        su.check(steps == list(range(failed)), f"rows {steps}, want 0..{failed - 1}")
        folder = os.path.join(ckpt, "c", job_id)
        names = sorted(os.listdir(folder), key=lambda n: (len(n), n))
        final = [n for n in names if re.fullmatch(r"step-\d+", n)]
        want = [f"step-{s}" for s in range(EVERY, failed, EVERY)]
        su.check(final == want, f"checkpoint folders {names}, want {want} (no step-{failed})")
        # A save cut off between two files leaves its temporary folder: the trainer cannot remove
        # it from a read-only disk. It never carries a step's final name, so no resume reads it.
        left = [n for n in names if n not in final]
        su.check(all(re.fullmatch(rf"step-{failed}\.tmp\.\d+", n) for n in left),
                 f"unexpected entries {left}")
        for name in final:
            check_readable(os.path.join(folder, name))
        su.log(f"  {len(final)} checkpoints before step {failed} readable, no step-{failed}; "
               f"temporary folders left on the read-only disk: {left or 'none'}")
        # Writable again: nothing was lost, and the folder takes checkpoints again. The new job
        # starts from the failed job's last checkpoint (what docs/guide.md tells a user to do);
        # loading it removes the temporary folders the cut-off save left beside it.
        sh(["mount", "-o", "remount,rw", ckpt])
        su.check(sorted(os.listdir(folder), key=lambda n: (len(n), n)) == names,
                 "checkpoints changed by the remount")
        # Whether or not the remount cut a save between two files, plant the leftovers such a
        # cut leaves: one of a trainer that has since died, one of the live trainer itself.
        dead = subprocess.Popen(["true"])
        dead.wait()
        trainer_pid = su.read_pids(cluster)["trainer"]
        planted = [f"step-{failed + EVERY}.tmp.{dead.pid}", f"step-{failed}.tmp.{trainer_pid}"]
        for name in planted:
            # The live trainer's cut-off save may already have left exactly this folder.
            os.makedirs(os.path.join(folder, name), exist_ok=True)
            with open(os.path.join(folder, name, "model.safetensors.tmp.1"), "wb") as f:
                f.write(b"cut off")
        left = sorted(set(left) | set(planted))
        config = job_config(cluster.tmp, "rw", os.path.join(ckpt, "c"), steps=4)
        config["model"] = {"checkpoint": os.path.join(folder, final[-1])}
        again = submit(cluster, config)
        job = su.wait_job(cluster, again, timeout=120)
        su.check(job["state"] == "SUCCEEDED", f"job after the remount: {job}")
        check_readable(os.path.join(ckpt, "c", again, "step-4"))
        after = sorted(os.listdir(folder), key=lambda n: (len(n), n))
        su.check(after == final, f"after resuming from {final[-1]}: {after}, want {final}")
        logged = cluster.log_of("trainer").count("removed the temporary folder of a cut-off")
        su.check(logged == len(left), f"{logged} trainer log lines for {len(left)} folders removed")
        su.log(f"  resumed from {final[-1]}: temporary folders removed ({len(left)}), each logged")
    finally:
        sh(["umount", "-l", ckpt], check=False)


def job_store_readonly(tmp):
    need(all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "e2fsck")),
         "losetup, mkfs.ext4 or e2fsck missing")
    image = os.path.join(tmp, "store.img")
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    sh(["mkfs.ext4", "-q", "-F", image])
    p = sh(["losetup", "-f", "--show", image], check=False)
    need(p.returncode == 0, f"no loop device: {p.stderr.strip()}")
    loop = p.stdout.strip()
    store = os.path.join(tmp, "store-cluster", "data", "coordinator")
    os.makedirs(store)
    cluster = None
    try:
        sh(["mount", "-o", "errors=remount-ro", loop, store])
        trigger = f"/sys/fs/ext4/{os.path.basename(loop)}/trigger_fs_error"
        need(os.path.exists(trigger), f"{trigger} missing (kernel without it)")
        cluster = su.Cluster(workers=1, tmp=os.path.join(tmp, "store-cluster"))
        cluster.wait_up()
        job_id = submit(cluster, job_config(cluster.tmp, "store"))
        wait_step(cluster, job_id, EVERY + 1)
        with open(trigger, "w") as f:
            f.write("1")
        broke = time.time()
        _, job = su.http("GET", f"{cluster.rest}/v1/jobs/{job_id}")
        su.log(f"  job store read-only from step {job['step']}")
        job = su.wait_job(cluster, job_id, timeout=60)
        took = time.time() - broke
        su.log(f"  job: {job['state']} after {took:.1f} s: {job['error']}")
        su.check(job["state"] == "FAILED", f"expected FAILED, got {job['state']}")
        su.check(took < 10 + 30, f"the job took {took:.0f} s to end (store retry 10 s)")
        m = re.search(r"job store: cannot record (?:the metrics row|the progress|the checkpoint) "
                      r"of step (\d+)", job["error"])
        su.check(m is not None and "read-only" in job["error"].lower(),
                 f"the error does not name the job store, the step and the read-only disk: "
                 f"{job['error']}")
        failed = int(m.group(1))
        steps = row_steps(cluster, job_id)
        su.check(steps == list(range(len(steps))) and len(steps) <= failed + 1,
                 f"rows {steps} around the failed write of step {failed}")
        log = cluster.log_of("coordinator")
        su.check("job store refused a write; retrying" in log, "no retry log line")
        status, text = su.http_quiet("GET", f"{cluster.rest}/metrics")
        su.check(status == 200 and re.search(
            r'^fp8rl_coordinator_store_write_failures_total\{write="\w+"\} [1-9]', text, re.M),
            "fp8rl_coordinator_store_write_failures_total not counted")
        # The service stays up and answers: a submission is refused as unavailable, not a crash.
        status, reply = su.http("POST", f"{cluster.rest}/v1/jobs", job_config(cluster.tmp, "x"))
        su.check(status == 503 and "job store" in reply["error"], f"submit: {status} {reply}")
        cluster.stop(expect_rc=None)
        # Repair and remount writable; a restarted coordinator resumes the job.
        sh(["umount", store])
        p = sh(["e2fsck", "-fy", loop], check=False)
        su.check(p.returncode in (0, 1), f"e2fsck: rc {p.returncode} {p.stdout} {p.stderr}")
        sh(["mount", "-o", "errors=remount-ro", loop, store])
        again = su.Cluster(workers=1, tmp=cluster.tmp, offset=cluster.offset)
        cluster = again
        again.wait_up()
        job = su.wait_job(again, job_id, timeout=120)
        su.check(job["state"] == "SUCCEEDED", f"resumed job: {job['state']}: {job['error']}")
        steps = row_steps(again, job_id)
        su.check(steps == list(range(STEPS + 1)), f"rows {steps}, want 0..{STEPS} once")
        su.log(f"  after the repair the job resumed and SUCCEEDED, rows 0..{STEPS} once")
        again.stop()
        cluster = None
    finally:
        if cluster is not None:
            cluster.kill_all()
        sh(["umount", "-l", store], check=False)
        sh(["losetup", "-d", loop], check=False)


def body(clusters):
    su.require_binaries()
    need(os.geteuid() == 0, "mounting file systems needs root")
    # Models lie in the source tree (the smoke model's config) and in the temp folder (the second
    # job starts from a checkpoint there).
    cluster = su.Cluster(workers=1, extra_args=("--models-root", "/"))
    clusters.append(cluster)
    cluster.wait_up()
    checkpoint_dir_readonly(cluster)
    cluster.stop()
    job_store_readonly(cluster.tmp)


if __name__ == "__main__":
    su.main_guard(body)
