#!/usr/bin/env bash
# Weight-sync benchmark (docs/perf.md "Weight sync"): iperf3 loopback throughput, then
# fp8rl-bench-weight-sync for each model and worker count, in one run on one machine.
# Usage: bench/weight_sync/run.sh [models...]   (default: small llama-10m llama-100m)
# Env: WORKERS="1 4", VERSIONS=3, BATCH=4, PROMPT=16, RESPONSE=48, BUILD_DIR=build, DELTA=1 to
# pass --delta (weight sync pushes deltas to workers that hold the base), COMPARE_KV=0 to skip timing the old
# extra calibration pass (oldcal_s, kv_diff columns), GENERATE=1 to start each step with rollouts on
# the workers (--generate: the share is then that of a whole GRPO step), NO_TRAIN=1 for the push
# path alone (--no-train), AB=N to alternate the previous and the current push path every N versions
# (--ab N, medians per path), AB_WHAT=service to switch only the weight-sync service's message copies (AB_WHAT=cut-through: only cut-through; same-host, upload-copy, publish: the same-host file, the zero-copy upload, both)
# (--ab-what service), UPLOAD_PARTS=1,2,4 to upload versions in that many parts in turn (parallel
# upload, --upload-parts; medians per part count).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
BENCH="$BUILD_DIR/bench/weight_sync/fp8rl-bench-weight-sync"
[ -x "$BENCH" ] || BENCH="$BUILD_DIR/bin/fp8rl-bench-weight-sync"
if [ ! -x "$BENCH" ]; then
  echo "run.sh: fp8rl-bench-weight-sync not built (cmake --build $BUILD_DIR --target fp8rl-bench-weight-sync)" >&2
  exit 1
fi
if ! command -v iperf3 >/dev/null; then
  echo "run.sh: iperf3 not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(small llama-10m llama-100m)

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs, $(uname -r), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
# Loopback TCP throughput, one stream, 3 s.
PORT=$((20000 + RANDOM % 20000))
iperf3 -s -1 -p "$PORT" >/dev/null 2>&1 &
IPERF_PID=$!
sleep 0.5
iperf3 -c 127.0.0.1 -p "$PORT" -t 3 -f M | awk '/receiver/ {print "iperf3 loopback: " $7 " " $8}'
wait "$IPERF_PID" 2>/dev/null || true

FLAGS=()
[ "${DELTA:-0}" = 1 ] && FLAGS+=(--delta)
[ "${COMPARE_KV:-1}" = 1 ] && FLAGS+=(--compare-kv)
[ "${GENERATE:-0}" = 1 ] && FLAGS+=(--generate)
[ "${NO_TRAIN:-0}" = 1 ] && FLAGS+=(--no-train)
[ -n "${AB:-}" ] && FLAGS+=(--ab "$AB")
[ -n "${AB_WHAT:-}" ] && FLAGS+=(--ab-what "$AB_WHAT")
[ -n "${UPLOAD_PARTS:-}" ] && FLAGS+=(--upload-parts "$UPLOAD_PARTS")
for m in "${MODELS[@]}"; do
  for w in ${WORKERS:-1 4}; do
    "$BENCH" --model "configs/models/$m.json" --workers "$w" --versions "${VERSIONS:-3}" \
      --batch "${BATCH:-4}" --prompt "${PROMPT:-16}" --response "${RESPONSE:-48}" "${FLAGS[@]}"
    echo
  done
done
