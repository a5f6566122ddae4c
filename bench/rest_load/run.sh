#!/usr/bin/env bash
# The REST load run of docs/perf.md: 200 concurrent clients for 60 s against a local cluster
# (`fp8rl up`, 2 generation workers) on loopback, through tests/system/test_rest_load.py. Prints
# the machine and its load next to the table. Build first: cmake --build build --target
# fp8rl-bench-rest-load fp8rl fp8rl-coordinator fp8rl-weight-sync fp8rl-trainer-worker
# fp8rl-generation-worker
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "$(date -u +%F) $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
FP8RL_LOAD_CLIENTS=${FP8RL_LOAD_CLIENTS:-200} FP8RL_LOAD_SECONDS=${FP8RL_LOAD_SECONDS:-60} \
  FP8RL_BIN_DIR=${FP8RL_BIN_DIR:-$PWD/build/bin} FP8RL_SOURCE_DIR=$PWD \
  /usr/bin/python3 tests/system/test_rest_load.py
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
