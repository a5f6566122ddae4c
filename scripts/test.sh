#!/usr/bin/env bash
# The README's test command: installs what is missing, builds (Release, ninja) and runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir "${FP8RL_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
