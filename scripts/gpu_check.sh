#!/usr/bin/env bash
# One command for a GPU (sm_90) machine, from a bare checkout: builds the kernels, model, tests and
# benchmarks (no services), runs every GPU test and the GPU GEMM benchmark, prints a summary, and
# copies the logs to $OUT when it is set. Budget: under 8 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD_DIR=${FP8RL_GPU_BUILD_DIR:-build-gpu}
LOG_DIR=${FP8RL_GPU_LOG_DIR:-$BUILD_DIR/gpu-check-logs}
BUDGET_S=${FP8RL_GPU_BUDGET_S:-460}  # leaves headroom under 8 minutes
JOBS=$(nproc)
START=$(date +%s)
mkdir -p "$LOG_DIR"

# Seconds left in the budget (at least 10, so a late step still gets a short try).
remaining() {
  local left=$((BUDGET_S - ($(date +%s) - START)))
  echo $((left > 10 ? left : 10))
}
say() { echo "gpu_check: $*" | tee -a "$LOG_DIR/summary.txt"; }
finish() {
  local rc=$1
  say "finished in $(($(date +%s) - START)) s, exit $rc"
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cp "$LOG_DIR"/*.txt "$OUT"/ 2>/dev/null
  fi
  exit "$rc"
}
: >"$LOG_DIR/summary.txt"

# 1. Packages: only when the build tools or the needed -dev packages are missing.
need_setup=0
for tool in cmake ninja g++ pkg-config; do
  command -v "$tool" >/dev/null 2>&1 || need_setup=1
done
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in libabsl-dev libgtest-dev libopenblas-dev nlohmann-json3-dev; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need_setup=1
  done
fi
if [ "$need_setup" = 1 ]; then
  say "build tools or -dev packages missing: running scripts/setup.sh"
  if ! timeout 300 bash scripts/setup.sh >"$LOG_DIR/setup.txt" 2>&1; then
    say "scripts/setup.sh failed (see setup.txt)"
    finish 1
  fi
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
  say "no CUDA toolkit (nvcc) found"
  finish 1
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    sed 's/^/gpu_check: device: /' | tee -a "$LOG_DIR/summary.txt"
else
  say "nvidia-smi not found"
fi

# 2. Configure and build (all cores; services off so gRPC is not needed).
if ! timeout "$(remaining)" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFP8RL_BUILD_SERVICES=OFF >"$LOG_DIR/configure.txt" 2>&1; then
  say "configure failed (see configure.txt)"
  tail -20 "$LOG_DIR/configure.txt"
  finish 1
fi
if ! grep -q "CUDA ON" "$LOG_DIR/configure.txt"; then
  say "CMake did not enable CUDA (see configure.txt)"
  finish 1
fi
build_ok=1
if ! timeout "$(remaining)" cmake --build "$BUILD_DIR" -j "$JOBS" >"$LOG_DIR/build.txt" 2>&1; then
  say "full build failed; building only the GPU test and benchmark targets (see build.txt)"
  build_ok=0
  if ! timeout "$(remaining)" cmake --build "$BUILD_DIR" -j "$JOBS" --target \
    fp8rl_gpu_kernels_test fp8rl-bench-gemm-gpu >>"$LOG_DIR/build.txt" 2>&1; then
    say "GPU targets failed to build"
    tail -30 "$LOG_DIR/build.txt"
    finish 1
  fi
fi
say "build done after $(($(date +%s) - START)) s"

# 3. Every GPU test: ctest's Gpu* tests when the whole tree built, else the GPU binary itself.
tests_rc=0
if [ "$build_ok" = 1 ]; then
  timeout "$(remaining)" ctest --test-dir "$BUILD_DIR" -R 'Gpu|gpu' --output-on-failure \
    -j 4 --timeout 300 >"$LOG_DIR/gpu_tests.txt" 2>&1 || tests_rc=$?
  # The per-GEMM accuracy lines are printed by the binary; run it once more verbosely for them.
  timeout "$(remaining)" "$BUILD_DIR/bin/fp8rl_gpu_kernels_test" --gtest_brief=0 \
    >"$LOG_DIR/gpu_test_binary.txt" 2>&1 || tests_rc=$((tests_rc == 0 ? $? : tests_rc))
else
  timeout "$(remaining)" "$BUILD_DIR/bin/fp8rl_gpu_kernels_test" \
    >"$LOG_DIR/gpu_test_binary.txt" 2>&1 || tests_rc=$?
fi
skipped=$(grep -c '^\[  SKIPPED \] Gpu.*ms)$' "$LOG_DIR/gpu_test_binary.txt" 2>/dev/null || true)
say "GPU tests: exit $tests_rc"
grep -E '^(\[  PASSED  \]|\[  FAILED  \]|\[  SKIPPED \] [0-9]+ test)' "$LOG_DIR/gpu_test_binary.txt" |
  sed 's/^/gpu_check:   /' | tee -a "$LOG_DIR/summary.txt"
[ -f "$LOG_DIR/gpu_tests.txt" ] && grep -E 'tests passed|tests failed' "$LOG_DIR/gpu_tests.txt" |
  sed 's/^/gpu_check:   ctest: /' | tee -a "$LOG_DIR/summary.txt"
grep '^\[ gemm' "$LOG_DIR/gpu_test_binary.txt" | tee -a "$LOG_DIR/summary.txt"
if [ "${skipped:-0}" != 0 ]; then
  say "WARNING: $skipped GPU tests were skipped (no sm_90 device visible?)"
  tests_rc=${tests_rc:-0}
  [ "$tests_rc" = 0 ] && tests_rc=3
fi

# 4. The GPU GEMM benchmark table.
bench_rc=0
timeout "$(remaining)" "$BUILD_DIR/bin/fp8rl-bench-gemm-gpu" >"$LOG_DIR/bench_gemm_gpu.txt" 2>&1 ||
  bench_rc=$?
say "GPU GEMM benchmark: exit $bench_rc"
tee -a "$LOG_DIR/summary.txt" <"$LOG_DIR/bench_gemm_gpu.txt"

if [ "$tests_rc" != 0 ] || [ "$bench_rc" != 0 ]; then finish 1; fi
finish 0
