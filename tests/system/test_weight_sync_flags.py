#!/usr/bin/env python3
"""Fan-out flags on the real binaries: a bad --fanout on fp8rl-weight-sync and a bad --weight-relay
on fp8rl-generation-worker each print one line naming the flag and exit 2, before binding any
port. Exits 77 (skipped) when a binary has not been built."""
import os
import subprocess
import sys

BIN = os.environ.get("FP8RL_BIN_DIR", "build/bin")

CASES = [
    ("fp8rl-weight-sync", ["--fanout", "star"],
     "fp8rl-weight-sync: --fanout: must be direct, chain or tree:K with K in [1, 64], got 'star'"),
    ("fp8rl-weight-sync", ["--fanout", "tree:0"],
     "fp8rl-weight-sync: --fanout: must be direct, chain or tree:K with K in [1, 64], got 'tree:0'"),
    ("fp8rl-generation-worker", ["--weight-relay", "yes"],
     "fp8rl-generation-worker: --weight-relay: must be on or off, got 'yes'"),
]


def main():
    ran = 0
    for binary, args, want in CASES:
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
    return 0 if ran else 77


if __name__ == "__main__":
    sys.exit(main())
