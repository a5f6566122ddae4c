#!/usr/bin/env python3
"""Flag tables on the real service binaries (common/flags.h): a bad value (among them a bad
--fanout or --same-host on weight sync, a bad --weight-relay or --weight-same-host on a generation
worker, a bad --upload-streams on a trainer) prints one line naming
the flag and exits 2 before binding any port; --help exits 0 and lists the shared flag names
(--http-port, and --worker-id on the workers) with the deprecated old names. Exits 77 (skipped)
when no binary has been built."""
import os
import subprocess
import sys

BIN = os.environ.get("FP8RL_BIN_DIR", "build/bin")

# binary, bad flags, the one stderr line wanted
BAD = [
    ("fp8rl-coordinator", ["--worker-expiry-ms", "0"],
     "fp8rl-coordinator: --worker-expiry-ms: must be in [1, 3600000], got 0"),
    ("fp8rl-weight-sync", ["--keep-versions", "0"],
     "fp8rl-weight-sync: --keep-versions: must be in [1, 64], got 0"),
    ("fp8rl-trainer-worker", ["--max-step-tokens", "lots"],
     "fp8rl-trainer-worker: --max-step-tokens: expected an integer, got 'lots'"),
    ("fp8rl-generation-worker", ["--batch-wait-ms", "-1"],
     "fp8rl-generation-worker: --batch-wait-ms: must be in [0, 10000], got -1"),
    ("fp8rl-generation-worker", ["--metrics-port", "70000"],
     "fp8rl-generation-worker: --metrics-port: must be in [0, 65535], got 70000"),
    ("fp8rl-weight-sync", ["--fanout", "star"],
     "fp8rl-weight-sync: --fanout: must be direct, chain or tree:K with K in [1, 64], got 'star'"),
    ("fp8rl-weight-sync", ["--fanout", "tree:0"],
     "fp8rl-weight-sync: --fanout: must be direct, chain or tree:K with K in [1, 64], got 'tree:0'"),
    ("fp8rl-generation-worker", ["--weight-relay", "yes"],
     "fp8rl-generation-worker: --weight-relay: must be on or off, got 'yes'"),
    ("fp8rl-weight-sync", ["--same-host", "on"],
     "fp8rl-weight-sync: --same-host: must be off or auto, got 'on'"),
    ("fp8rl-generation-worker", ["--weight-same-host", "yes"],
     "fp8rl-generation-worker: --weight-same-host: must be off or auto, got 'yes'"),
    ("fp8rl-trainer-worker", ["--upload-streams", "0"],
     "fp8rl-trainer-worker: --upload-streams: must be in [1, 256], got 0"),
    ("fp8rl-trainer-worker", ["--name", "a", "--worker-id", "b"],
     "fp8rl-trainer-worker: --name: a disagrees with --worker-id b (they name the same flag; "
     "give one)"),
]
# binary, lines --help must contain
HELP = [
    ("fp8rl-coordinator", ["--http-port INT in [0, 65535] (default: 8080)",
                           "--metrics-port", "deprecated: use --http-port"]),
    ("fp8rl-weight-sync", ["--http-port INT in [0, 65535] (default: 9402)",
                           "--coordinator \"\" serves without registering."]),
    ("fp8rl-trainer-worker", ["--http-port INT in [0, 65535] (default: 9403)",
                              "--worker-id TEXT (default: trainer)", "deprecated: use --worker-id"]),
    ("fp8rl-generation-worker", ["--http-port INT in [0, 65535] (default: 9461)",
                                 "--worker-id TEXT (default: \"\")"]),
]


def main():
    ran = 0
    for binary, args, want in BAD:
        path = os.path.join(BIN, binary)
        if not os.access(path, os.X_OK):
            print(f"skip {binary}: not built")
            continue
        p = subprocess.run([path] + args, capture_output=True, text=True, timeout=30)
        lines = p.stderr.strip().splitlines()
        if p.returncode != 2 or lines != [want]:
            print(f"FAIL {binary} {args}: rc {p.returncode}, stderr {p.stderr!r}")
            return 1
        print(f"ok {binary} {' '.join(args)}")
        ran += 1
    for binary, wants in HELP:
        path = os.path.join(BIN, binary)
        if not os.access(path, os.X_OK):
            continue
        p = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
        missing = [w for w in wants if w not in p.stdout]
        if p.returncode != 0 or missing:
            print(f"FAIL {binary} --help: rc {p.returncode}, missing {missing}:\n{p.stdout}")
            return 1
        print(f"ok {binary} --help")
        ran += 1
    return 0 if ran else 77


if __name__ == "__main__":
    sys.exit(main())
