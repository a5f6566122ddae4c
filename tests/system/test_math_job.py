#!/usr/bin/env python3
"""System test: the `math` task end to end. scripts/make_math_dataset.py writes a small GSM8K-shaped
set, `fp8rl run configs/examples/toy-math.yaml` (tiny model, byte tokenizer, plain prompts) runs
SFT on the canonical reference answers, GRPO steps and validation on it and succeeds; a config
with a bad math param is rejected before anything starts, naming the field, and a malformed data
line fails the job naming file:line."""

import os
import re
import shutil
import subprocess
import tempfile
import time

import yaml

import system_util as su


def toy_config(data_dir):
    with open(os.path.join(su.SOURCE_DIR, "configs", "examples", "toy-math.yaml")) as f:
        config = yaml.safe_load(f)
    config["task"]["params"]["train_path"] = os.path.join(data_dir, "train.jsonl")
    config["task"]["params"]["val_path"] = os.path.join(data_dir, "val.jsonl")
    return config


def main():
    su.require_binaries()
    tmp = tempfile.mkdtemp(prefix="fp8rl-system-math-")
    data = os.path.join(tmp, "math")
    subprocess.run(["/usr/bin/python3", os.path.join(su.SOURCE_DIR, "scripts",
                                                      "make_math_dataset.py"),
                    "--out", data, "--train", "300", "--val", "40", "--seed", "2"],
                   check=True, timeout=60)

    # A bad param is refused by the CLI before any service starts.
    bad = toy_config(data)
    bad["task"]["params"]["extraction"] = ["last_number", "regex"]
    path = su.write_yaml(os.path.join(tmp, "bad.yaml"), bad)
    rc, out, err = su.run_cli(["run", path, "--data-dir", os.path.join(tmp, "bad-data")])
    su.check(rc != 0 and "task.params.extraction[1]" in err,
             f"bad extraction accepted or not named: {rc} {out} {err}")

    config = toy_config(data)
    path = su.write_yaml(os.path.join(tmp, "toy-math.yaml"), config)
    steps = config["algorithm"]["steps"]
    args = [su.FP8RL, "run", path, "--port-offset", str(su.free_port_offset(2)),
            "--data-dir", os.path.join(tmp, "data"), "--datasets-root", tmp, "--data-root", tmp]
    su.log("running: " + " ".join(args))
    start = time.time()
    p = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=su.SOURCE_DIR)
    su.log(p.stdout)
    su.log(p.stderr)
    su.log(f"fp8rl run took {time.time() - start:.1f} s, exit {p.returncode}")
    su.check(p.returncode == 0, f"fp8rl run exited with {p.returncode}")
    su.check(re.search(rf"=== job job-\S+: SUCCEEDED after {steps}/{steps} steps ===", p.stdout),
             "the math job did not succeed")
    su.check(re.search(r"^step +0/\d+  before RL:.*val_acc \d\.\d{3}", p.stdout, re.M),
             "row 0 has no validation accuracy")

    # A malformed line in the data fails the job, naming the file and line.
    with open(os.path.join(data, "val.jsonl"), "a") as f:
        f.write('{"question": "q", "answer": "no hash line"}\n')
    args[args.index("--data-dir") + 1] = os.path.join(tmp, "data2")
    args[args.index("--port-offset") + 1] = str(su.free_port_offset(2))
    p = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=su.SOURCE_DIR)
    su.log(p.stdout[-2000:])
    su.log(p.stderr[-2000:])
    su.check(p.returncode != 0, "a job on a malformed dataset succeeded")
    su.check("val.jsonl:41" in p.stdout + p.stderr, "the error does not name val.jsonl:41")
    shutil.rmtree(tmp, ignore_errors=True)  # kept on failure for the logs
    su.log("PASS")


if __name__ == "__main__":
    main()
