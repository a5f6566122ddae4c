#!/usr/bin/env bash
# One command for a GPU (sm_90) machine that reaches no package registry: builds the GPU tests and
# the GPU benchmarks (no services), runs every GPU test, one kernel's test under
# compute-sanitizer, then the GEMM benchmark, the decode/prefill benchmark (when built) and its
# PyTorch baseline (bench/decode_gpu/torch_baseline.py), the trainer's CUDA backend tests and the
# whole GRPO step benchmark (step 10, capped), and prints one table. The -dev libraries come from
# build-gpu-pack/ (made by scripts/gpu_pack.sh on a machine with a registry), extracted with
# `dpkg -x` into a private prefix in the build folder; a machine that has them installed needs no
# pack. Copies the logs to $OUT when it is set. Budget: under 8 minutes on one H200.
# Exit: 0 all passed; 1 a step failed; 2 no sm_90 GPU (everything before the GPU passed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD_DIR=${FP8RL_GPU_BUILD_DIR:-build-gpu}
PACK_DIR=${FP8RL_GPU_PACK_DIR:-build-gpu-pack}
LOG_DIR=${FP8RL_GPU_LOG_DIR:-$BUILD_DIR/gpu-check-logs}
BUDGET_S=${FP8RL_GPU_BUDGET_S:-460} # leaves headroom under 8 minutes
JOBS=$(nproc)
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} # ccache (where present) hits across checkouts
START=$(date +%s)
mkdir -p "$LOG_DIR"
: >"$LOG_DIR/summary.txt"
ROWS=() # the final table: "check|result|detail"
PACK_LD="" # library folders of the extracted pack (step 2)

remaining() { # seconds left in the budget (at least 10)
  local left=$((BUDGET_S - ($(date +%s) - START)))
  echo $((left > 10 ? left : 10))
}
with_pack() { # runs "$@" with the pack's libraries first on the loader path
  if [ -z "$PACK_LD" ]; then "$@"; else LD_LIBRARY_PATH="$PACK_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; fi
}
say() { echo "gpu_check: $*" | tee -a "$LOG_DIR/summary.txt"; }
row() { ROWS+=("$1|$2|$3"); }
finish() {
  local rc=$1
  {
    echo
    echo "| check | result | detail |"
    echo "| --- | --- | --- |"
    for r in "${ROWS[@]}"; do
      IFS='|' read -r a b c <<<"$r"
      echo "| $a | $b | $c |"
    done
    echo
  } | tee -a "$LOG_DIR/summary.txt"
  say "finished in $(($(date +%s) - START)) s, exit $rc"
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$LOG_DIR"/*.txt "$OUT"/ 2>/dev/null; fi
  exit "$rc"
}

# 1. Tools the machine must have (nothing can be installed there).
NVCC=/usr/local/cuda/bin/nvcc
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
missing=()
[ -n "$NVCC" ] || missing+=(nvcc)
# python3: the configure of tests/deploy needs it (the GPU image has it, with PyTorch).
for tool in cmake ninja c++ python3; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "missing tools: ${missing[*]}"
  row tools FAILED "missing: ${missing[*]}"
  finish 1
fi
row tools ok "$("$NVCC" --version | grep -o 'release [0-9.]*'), cmake $(cmake --version | head -1 | awk '{print $3}')"

# 2. The packed -dev libraries, extracted once into a private prefix (never into /).
cmake_extra=()
if compgen -G "$PACK_DIR/*.deb" >/dev/null; then
  arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
  if [ -f "$PACK_DIR/ARCH" ] && [ "$(cat "$PACK_DIR/ARCH")" != "$arch" ]; then
    say "$PACK_DIR holds $(cat "$PACK_DIR/ARCH") packages, this machine is $arch"
    row packages FAILED "wrong architecture"
    finish 1
  fi
  PREFIX=$PWD/$BUILD_DIR/prefix
  if [ ! -f "$PREFIX/.extracted" ]; then
    rm -rf "$PREFIX" && mkdir -p "$PREFIX"
    for deb in "$PACK_DIR"/*.deb; do
      if command -v dpkg-deb >/dev/null 2>&1; then
        dpkg-deb -x "$deb" "$PREFIX" || { say "cannot extract $deb"; row packages FAILED "$deb"; finish 1; }
      else # no dpkg: a .deb is an ar archive holding data.tar.*
        (cd "$PREFIX" && ar p "$OLDPWD/$deb" "$(ar t "$OLDPWD/$deb" | grep '^data.tar')" | tar -x -a -f - 2>/dev/null ||
          ar p "$OLDPWD/$deb" data.tar.xz | tar -xJ) || { say "cannot extract $deb"; row packages FAILED "$deb"; finish 1; }
      fi
    done
    # Debian's GlooTargets names its library by absolute path (/usr/lib/libgloo.so.0.5.0), which
    # CMake checks at configure time; point it at the extracted copy.
    for f in "$PREFIX"/usr/share/cmake/Gloo/GlooTargets-*.cmake; do
      [ -f "$f" ] && sed -i "s|\"/usr/lib/libgloo|\"$PREFIX/usr/lib/libgloo|g" "$f"
    done
    touch "$PREFIX/.extracted"
  fi
  LIB=$PREFIX/usr/lib/x86_64-linux-gnu
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_LIBDIR="$LIB/pkgconfig:$LIB/openblas-pthread/pkgconfig:$PREFIX/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  # Only for what needs the packed libraries (pkgconf at configure time, the build, which runs the
  # test binaries to list their tests, our binaries), not for the script's own tools (grep, awk),
  # which keep the machine's versions of libraries such as pcre2.
  PACK_LD="$LIB:$LIB/openblas-pthread"
  cmake_extra+=("-DPKG_CONFIG_EXECUTABLE=$PREFIX/usr/bin/pkgconf")
  row packages ok "$(find "$PACK_DIR" -name '*.deb' | wc -l) packages from $PACK_DIR into $BUILD_DIR/prefix"
else
  row packages ok "none packed: using the system's"
fi

# 3. Configure and build only what the check runs.
if ! with_pack timeout "$(remaining)" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFP8RL_BUILD_SERVICES=OFF -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90a \
  "${cmake_extra[@]}" >"$LOG_DIR/configure.txt" 2>&1; then
  say "configure failed (see configure.txt; without a pack run scripts/gpu_pack.sh where a registry is reachable)"
  tail -20 "$LOG_DIR/configure.txt"
  row configure FAILED "see configure.txt"
  finish 1
fi
if ! grep -q "CUDA ON" "$LOG_DIR/configure.txt"; then
  say "CMake did not enable CUDA (see configure.txt)"
  row configure FAILED "CUDA not enabled"
  finish 1
fi
row configure ok "sm_90a (-gencode arch=compute_90a,code=sm_90a)"
TARGETS=(fp8rl_device_math_test fp8rl_gpu_kernels_test fp8rl_gpu_model_test fp8rl-bench-gemm-gpu
  fp8rl-bench-decode-gpu)
TARGETS+=(fp8rl_gpu_train_test)  # the training step on the device (model/cuda/cuda_train_ops.h)
TARGETS+=(fp8rl_gpu_train_state_test)  # the trainer's device state (model/cuda/train_state.h)
# Step 10's test and benchmark, built here with the rest so a machine without a GPU proves they
# build from the pack too.
TARGETS+=(fp8rl_gpu_train_backend_test fp8rl-bench-grpo-step)
# with_pack: gtest_discover_tests runs each test binary right after linking it.
with_pack timeout "$(remaining)" cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}" \
  >"$LOG_DIR/build.txt" 2>&1
build_rc=$?
if [ "$build_rc" = 124 ]; then
  say "build ran past the ${BUDGET_S} s budget (FP8RL_GPU_BUDGET_S; a rerun continues it)"
  row build FAILED "timed out after $(($(date +%s) - START)) s"
  finish 1
elif [ "$build_rc" != 0 ]; then
  say "build failed (see build.txt)"
  grep -E 'error|FAILED' "$LOG_DIR/build.txt" | head -20
  row build FAILED "see build.txt"
  finish 1
fi
row build ok "${TARGETS[*]} in $(($(date +%s) - START)) s"
BIN=$BUILD_DIR/bin

# 4. The shared-math test needs no GPU: it ties the kernels' CPU reference to the model's.
if with_pack timeout "$(remaining)" "$BIN/fp8rl_device_math_test" >"$LOG_DIR/device_math_test.txt" 2>&1; then
  row "device math (CPU)" ok "$(grep -o '[0-9]* tests\? from [0-9]* test suites\? ran' "$LOG_DIR/device_math_test.txt")"
else
  row "device math (CPU)" FAILED "see device_math_test.txt"
  finish 1
fi

# 5. Is there an sm_90 device? Without one, stop here: everything before this point passed.
probe=$(with_pack timeout 60 "$BIN/fp8rl-bench-gemm-gpu" --probe 2>&1)
probe_rc=$?
if [ "$probe_rc" != 0 ]; then
  say "no GPU"
  echo "$probe" >"$LOG_DIR/probe.txt"
  row device "no GPU" "$probe"
  finish 2
fi
row device ok "$probe"
command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$LOG_DIR/nvidia_smi.txt" 2>&1

# 6. Every GPU test; on a GPU machine a skipped test is a failure.
failed=0
with_pack timeout "$(remaining)" "$BIN/fp8rl_gpu_kernels_test" >"$LOG_DIR/gpu_tests.txt" 2>&1 || failed=1
# The model-level CUDA backend vs the CPU engine (model/cuda/); its measured numbers next to the
# derived bars go to the summary.
with_pack timeout "$(remaining)" "$BIN/fp8rl_gpu_model_test" >"$LOG_DIR/gpu_model_test.txt" 2>&1 || failed=1
cat "$LOG_DIR/gpu_model_test.txt" >>"$LOG_DIR/gpu_tests.txt"
# The trainer's optimizer, re-quantization, calibration and export on the device vs the CPU trainer.
with_pack timeout "$(remaining)" "$BIN/fp8rl_gpu_train_state_test" >>"$LOG_DIR/gpu_tests.txt" 2>&1 || failed=1
grep -E '^\[[a-z0-9_]+\] |^budget ' "$LOG_DIR/gpu_model_test.txt" >>"$LOG_DIR/summary.txt"
# The training step's kernels, GEMMs and a whole forward + backward vs the CPU; measured calc_diff
# next to each derived bar goes to train_test.txt.
with_pack timeout "$(remaining)" "$BIN/fp8rl_gpu_train_test" >"$LOG_DIR/train_test.txt" 2>&1 || failed=1
cat "$LOG_DIR/train_test.txt" >>"$LOG_DIR/gpu_tests.txt"
while read -r status name ms; do
  row "$name" "$status" "$ms"
  [ "$status" = ok ] || failed=1
done < <(awk '/^\[       OK \]/ {print "ok", $4, $5 $6}
              /^\[  FAILED  \] [A-Za-z].*\(/ {print "FAILED", $4, $5 $6}
              /^\[  SKIPPED \] [A-Za-z].*\(/ {print "SKIPPED", $4, $5 $6}' "$LOG_DIR/gpu_tests.txt")
grep -E '^\[ (gemm|decoder)' "$LOG_DIR/gpu_tests.txt" >>"$LOG_DIR/summary.txt"
# 6b. The NCCL backend of trainer groups on one GPU (init, all-reduce, teardown): built only when
# CMake found NCCL, and a GPU machine without it fails this row.
if cmake --build "$BUILD_DIR" --target help 2>/dev/null | grep -q '^fp8rl_gpu_nccl_test:'; then
  with_pack timeout "$(remaining)" cmake --build "$BUILD_DIR" --target fp8rl_gpu_nccl_test \
    >"$LOG_DIR/nccl_build.txt" 2>&1 &&
    with_pack timeout "$(remaining)" "$BIN/fp8rl_gpu_nccl_test" >"$LOG_DIR/nccl_test.txt" 2>&1
  nccl_rc=$?
  n=$(grep -c '^\[       OK \]' "$LOG_DIR/nccl_test.txt" 2>/dev/null)
  if [ "$nccl_rc" = 0 ] && [ "${n:-0}" -gt 0 ] && ! grep -q '^\[  SKIPPED \]' "$LOG_DIR/nccl_test.txt"; then
    row "NCCL collectives" ok "$n tests"
  else
    row "NCCL collectives" FAILED "see nccl_build.txt / nccl_test.txt"
    failed=1
  fi
else
  row "NCCL collectives" FAILED "not built: CMake found no nccl.h / libnccl (see configure.txt)"
  failed=1
fi

# 7. One kernel under compute-sanitizer (memcheck): the paged KV write + attention.
SAN=/usr/local/cuda/bin/compute-sanitizer
[ -x "$SAN" ] || SAN=$(command -v compute-sanitizer || true)
if [ -n "$SAN" ]; then
  if with_pack timeout "$(remaining)" "$SAN" --tool memcheck --error-exitcode 9 "$BIN/fp8rl_gpu_kernels_test" \
    --gtest_filter='GpuDecoderTest.PagedKvWriteAndAttentionMatchCpu' >"$LOG_DIR/sanitizer.txt" 2>&1; then
    row "compute-sanitizer memcheck" ok "$(grep -o 'ERROR SUMMARY: [0-9]* errors\?' "$LOG_DIR/sanitizer.txt" | tail -1)"
  else
    row "compute-sanitizer memcheck" FAILED "$(grep -o 'ERROR SUMMARY: [0-9]* errors\?' "$LOG_DIR/sanitizer.txt" | tail -1) (see sanitizer.txt)"
    failed=1
  fi
  # The whole model step once (FP8 linears + FP8 KV: quantize, cuBLASLt, paged KV, sampling).
  if with_pack timeout "$(remaining)" "$SAN" --tool memcheck --error-exitcode 9 "$BIN/fp8rl_gpu_model_test" \
    --gtest_filter='Policies/ModelCudaTest.GenerationVsScoringOnTheDevice/fp8_kv_fp8_llama' >"$LOG_DIR/sanitizer_model.txt" 2>&1; then
    row "compute-sanitizer memcheck (model)" ok "$(grep -o 'ERROR SUMMARY: [0-9]* errors\?' "$LOG_DIR/sanitizer_model.txt" | tail -1)"
  else
    row "compute-sanitizer memcheck (model)" FAILED "$(grep -o 'ERROR SUMMARY: [0-9]* errors\?' "$LOG_DIR/sanitizer_model.txt" | tail -1) (see sanitizer_model.txt)"
    failed=1
  fi
else
  row "compute-sanitizer memcheck" FAILED "compute-sanitizer not found"
  failed=1
fi

# 8. The GEMM benchmark: one table row per shape.
if with_pack timeout "$(remaining)" "$BIN/fp8rl-bench-gemm-gpu" >"$LOG_DIR/bench_gemm_gpu.txt" 2>&1; then
  while IFS='|' read -r _ name shape fp8 bf16 ratio _; do
    row "bench gemm $(echo $name) $(echo $shape)" ok "fp8 $(echo $fp8) / bf16 $(echo $bf16) TFLOP/s, x$(echo $ratio)"
  done < <(grep -E '^\| [A-Za-z_]' "$LOG_DIR/bench_gemm_gpu.txt" | grep -v '^| shape')
else
  row "bench gemm" FAILED "see bench_gemm_gpu.txt"
  failed=1
fi

# 9. Decode and prefill tokens/s (Llama-3.1-8B shapes, a few layers): ours in BF16, FP8 linears
# and FP8 linears + FP8 KV cache, then PyTorch BF16 with SDPA on the same cells. One row per cell.
bench_rows() { # $1: log; table rows "| engine | precision | phase | batch | context | seqs | tok/s | x |"
  grep -E '^\| [a-z]' "$1" | grep -v '^| engine' | while IFS='|' read -r _ eng prec phase b ctx seqs tps ratio _; do
    echo "bench $(echo $phase) $(echo $eng) $(echo $prec) b$(echo $b) ctx$(echo $ctx)|ok|$(echo $tps) tok/s (seqs $(echo $seqs)), x$(echo $ratio) vs bf16"
  done
}
# Ours gets what is left minus 150 s (its host-side random model, about 2e9 parameters, and the
# baseline) for its cells, at most 120 s; cells that would not fit are printed as skipped by the
# benchmark itself.
decode_budget=$(($(remaining) - 150))
[ "$decode_budget" -gt 120 ] && decode_budget=120
[ "$decode_budget" -lt 20 ] && decode_budget=20
if with_pack timeout "$((decode_budget + 90))" "$BIN/fp8rl-bench-decode-gpu" --budget-seconds "$decode_budget" \
  >"$LOG_DIR/bench_decode_gpu.txt" 2>&1; then
  while IFS='|' read -r a b c; do row "$a" "$b" "$c"; done < <(bench_rows "$LOG_DIR/bench_decode_gpu.txt")
  # Weight install on the device, 1 and 2 weight slots (issue 19).
  while read -r line; do row "bench weight install" ok "${line#install: }"; done \
    < <(grep '^install: ' "$LOG_DIR/bench_decode_gpu.txt")
else
  row "bench decode (ours)" FAILED "exit $? (see bench_decode_gpu.txt)"
  failed=1
fi
if PYTHONUNBUFFERED=1 timeout "$(remaining)" python3 bench/decode_gpu/torch_baseline.py \
  >"$LOG_DIR/bench_decode_torch.txt" 2>&1; then
  while IFS='|' read -r a b c; do row "$a" "$b" "$c"; done < <(bench_rows "$LOG_DIR/bench_decode_torch.txt")
else
  row "bench decode torch baseline" FAILED "see bench_decode_torch.txt"
  failed=1
fi

# 10. Training through the learner's backend on the device (train/train_backend.h): the CUDA vs
# CPU backend tests (checkpoint interop, optimizer steps, the in-process GRPO step) and the whole
# GRPO step benchmark (BF16, FP8, FP8 + FP8 KV), capped at 90 s (the cap is checked between
# steps). The shape is Llama-3.2-1B's widths and vocabulary at 2 of its 16 layers: the host-side
# setup of the full depth (random master, the CPU engine's working copies the CUDA backend
# uploads) measured about 9 minutes on the 2-core development VM, over this script's budget
# (docs/perf.md); the full depth is `fp8rl-bench-grpo-step --shape llama-3.2-1b` on its own. Skipped
# with a row when less than 240 s of the budget is left. The targets were built in step 3 (the
# cmake call below only checks they are up to date).
if with_pack timeout "$(remaining)" cmake --build "$BUILD_DIR" -j "$JOBS" \
  --target fp8rl_gpu_train_backend_test fp8rl-bench-grpo-step >"$LOG_DIR/train_backend_build.txt" 2>&1; then
  with_pack timeout "$(remaining)" "$BIN/fp8rl_gpu_train_backend_test" >"$LOG_DIR/train_backend_test.txt" 2>&1 || failed=1
  while read -r status name ms; do
    row "$name" "$status" "$ms"
    [ "$status" = ok ] || failed=1
  done < <(awk '/^\[       OK \]/ {print "ok", $4, $5 $6}
                /^\[  FAILED  \] [A-Za-z].*\(/ {print "FAILED", $4, $5 $6}
                /^\[  SKIPPED \] [A-Za-z].*\(/ {print "SKIPPED", $4, $5 $6}' "$LOG_DIR/train_backend_test.txt")
  grpo_cap=$(($(remaining) - 150))
  [ "$grpo_cap" -gt 90 ] && grpo_cap=90
  [ "$grpo_cap" -lt 10 ] && grpo_cap=10
  if [ "$(remaining)" -lt 240 ]; then
    row "bench grpo step" SKIPPED "budget: $(remaining) s left (FP8RL_GPU_BUDGET_S; run the bench alone)"
    grpo_rc=skip
  else
    with_pack timeout "$((grpo_cap + 150))" "$BIN/fp8rl-bench-grpo-step" --shape llama-3.2-1b --layers 2 \
      --device cuda --prompts 8 --samples 8 --prompt-tokens 128 --new-tokens 256 --steps 2 \
      --time-cap-seconds "$grpo_cap" >"$LOG_DIR/bench_grpo_step.txt" 2>&1
    grpo_rc=$?
  fi
  if [ "$grpo_rc" = skip ]; then
    :
  elif [ "$grpo_rc" = 0 ]; then
    while IFS='|' read -r _ prec steps _ _ _ _ _ _ _ _ step ratio share setup _; do
      row "bench grpo step $(echo $prec)" ok "$(echo $step) s/step ($(echo $steps) steps), x$(echo $ratio) vs bf16, requant+calibrate $(echo $share), setup $(echo $setup) s"
    done < <(grep -E '^\| (bf16|fp8)' "$LOG_DIR/bench_grpo_step.txt")
  else
    row "bench grpo step" FAILED "exit $grpo_rc: $(tail -1 "$LOG_DIR/bench_grpo_step.txt")"
    failed=1
  fi
else
  row "train backend build" FAILED "see train_backend_build.txt"
  failed=1
fi

finish "$failed"
