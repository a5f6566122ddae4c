#!/usr/bin/env bash
# Configures (Release, ninja) and builds fp8rl into build/ (all executables in build/bin/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FP8RL_BUILD_DIR:-build}
JOBS=${FP8RL_JOBS:-$(nproc)}
# ccache: hash paths relative to the checkout, so another clone of the same tree hits the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake "$BUILD_DIR" "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
