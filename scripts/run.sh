#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, and runs the demo job on a local
# cluster (coordinator, weight sync, trainer, two generation workers on loopback), showing live
# progress and a summary. Another job config can be given as the first argument.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec "${FP8RL_BUILD_DIR:-build}/bin/fp8rl" run "${1:-configs/demo.yaml}" --data-dir "${FP8RL_DATA_DIR:-runs/demo}"
