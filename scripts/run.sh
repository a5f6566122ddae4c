#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, and runs the demo job on a local
# cluster (coordinator, weight sync, trainer, two generation workers on loopback).
# Until the services are built, it runs the FP8 kernel benchmark instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BIN=${FP8RL_BUILD_DIR:-build}/bin
if [ -x "$BIN/fp8rl-coordinator" ] && "$BIN/fp8rl" --help | grep -q '^  fp8rl run '; then
  exec "$BIN/fp8rl" run "${1:-configs/demo.yaml}"
fi
echo "run: the services are not built yet; running the FP8 kernel benchmarks"
for b in fp8rl-bench-gemm-cpu fp8rl-bench-gemm-gpu; do
  if [ -x "$BIN/$b" ]; then "$BIN/$b"; fi
done
