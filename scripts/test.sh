#!/usr/bin/env bash
# The README's test command: installs what is missing, checks formatting, builds (Release, ninja),
# runs clang-tidy on the lines this branch changed (when clang-tidy is installed) and runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/check_format.sh
bash scripts/build.sh
bash scripts/check_tidy.sh
ctest --test-dir "${FP8RL_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
