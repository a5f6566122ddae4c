#!/usr/bin/env python3
"""System test: `fp8rl run configs/smoke.yaml` (local cluster on free ports, job over gRPC) ends
with exit 0, one progress line per step, a summary with accuracy, mismatch metrics and the time
split, and no process left running."""

import os
import re
import shutil
import subprocess
import tempfile
import time

import system_util as su


def main():
    su.require_binaries()
    tmp = tempfile.mkdtemp(prefix="fp8rl-system-grpc-")
    config = su.smoke_config(tmp)
    # A relative model path: `fp8rl run` resolves it (against the working directory, here the
    # source tree) before submitting.
    config["model"]["init"]["config"] = "configs/models/tiny.json"
    path = su.write_yaml(os.path.join(tmp, "smoke.yaml"), config)
    steps = config["algorithm"]["steps"]
    offset = su.free_port_offset(2)
    args = [su.FP8RL, "run", path, "--port-offset", str(offset),
            "--data-dir", os.path.join(tmp, "data"), "--data-root", tmp]
    su.log("running: " + " ".join(args))
    start = time.time()
    p = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=su.SOURCE_DIR)
    su.log(p.stdout)
    su.log(p.stderr)
    su.log(f"fp8rl run took {time.time() - start:.1f} s, exit {p.returncode}")
    su.check(p.returncode == 0, f"fp8rl run exited with {p.returncode}")
    out = p.stdout
    for s in range(0, steps + 1):
        su.check(re.search(rf"^step +{s}/{steps}\b", out, re.M), f"no progress line for step {s}")
    su.check(re.search(r"^step +0/\d+  before RL:.*val_acc \d\.\d{3}", out, re.M),
             "row 0 has no validation accuracy")
    su.check(re.search(rf"^step +{steps}/{steps}  reward \d\.\d{{3}}.*mult_prob_err", out, re.M),
             "last step line lacks reward / mismatch metrics")
    su.check(re.search(r"=== job job-\S+: SUCCEEDED after (\d+)/\1 steps ===", out),
             "summary header missing")
    for needle in ["val accuracy before: 0.", "val accuracy after:  0.", "val accuracy best:",
                   "token_mult_prob_error", "sampling_importance_ratio", "time by phase:",
                   "generate ", "train ", f"({steps + 1} metric rows)", "cluster stopped"]:
        su.check(needle in out, f"summary lacks {needle!r}")
    # Every child the launcher reported ready is gone.
    pids = [int(x) for x in re.findall(r"ready +\(pid (\d+)", out)]
    su.check(len(pids) == 5, f"expected 5 services ready, saw {len(pids)}")
    su.check(not [pid for pid in pids if su.pid_alive(pid)], "a service outlived fp8rl run")
    su.check(not os.path.exists(os.path.join(tmp, "data", "cluster.json")), "cluster.json left")
    shutil.rmtree(tmp, ignore_errors=True)  # kept on failure for the logs
    su.log("PASS")


if __name__ == "__main__":
    main()
