#!/usr/bin/env bash
# Every GPU check of fp8rl in one command, for an sm_90 machine that reaches no package registry
# (a lent H200 with about 15 minutes of device time in all, at most 10 minutes per command).
#
#   scripts/gpu_check.sh [--quick] [--prebuilt] [--dry-run] [--print-targets]
#
# Order: tools; the -dev libraries (build-gpu-pack/*.deb, from scripts/gpu_pack.sh) or prebuilt
# binaries (build-gpu-pack/prebuilt.tar.gz, from scripts/gpu_pack.sh --prebuilt); configure and
# build (skipped with --prebuilt); the shared-math test (CPU); the device probe; every GPU test
# binary (kernels, model, train, train state, train backend, NCCL); compute-sanitizer on two tests;
# then the benchmarks, sized to fit (GEMM, decode/prefill at 1 layer with its PyTorch baseline, the
# GRPO step at 2 layers).
#   --quick          tests only (no sanitizer, no benchmarks): a second try in under 4 minutes
#   --prebuilt       use the binaries and libraries in build-gpu-pack/prebuilt.tar.gz, no build
#   --dry-run        run no step: print and record the plan (each step's cap) and exercise the
#                    streaming summary and the log tarball; runs anywhere, no CUDA needed
#   --print-targets  print the CMake targets the check builds and exit
#
# Time: a hard total budget (FP8RL_GPU_BUDGET_S, default 500 s, below the device tool's 540 s
# ceiling for one command with its transfers). Each step runs under `timeout` with min(its cap,
# what is left of the budget); a step reached with less than 10 s left gets a SKIPPED row. Tests
# come first, so a slow benchmark can only cost benchmarks.
# Results stream: each row is appended, as its step ends, to summary.tsv (check, result, seconds,
# detail) in the log folder and in $OUT; an EXIT trap writes summary.txt (the table) and
# $OUT/logs.tar.gz (every log), so a run killed at the command limit still brings back every row
# that finished. Three files in $OUT in all.
# Exit: 0 all passed; 1 a step failed; 2 no sm_90 GPU (everything before the GPU passed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

QUICK=0
PREBUILT=0
DRY=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --prebuilt) PREBUILT=1 ;;
    --dry-run) DRY=1 ;;
    --print-targets) ;;
    *)
      echo "gpu_check: unknown argument '$arg' (expected --quick, --prebuilt, --dry-run, --print-targets)" >&2
      exit 1
      ;;
  esac
done

# What the check builds: the test binaries, then the benchmarks.
TEST_TARGETS=(fp8rl_device_math_test fp8rl_gpu_kernels_test fp8rl_gpu_model_test fp8rl_gpu_train_test
  fp8rl_gpu_train_state_test fp8rl_gpu_train_backend_test)
NCCL_TARGET=fp8rl_gpu_nccl_test # built only when CMake finds NCCL
BENCH_TARGETS=(fp8rl-bench-gemm-gpu fp8rl-bench-decode-gpu fp8rl-bench-grpo-step)
if [[ " $* " == *" --print-targets "* ]]; then
  echo "${TEST_TARGETS[*]} $NCCL_TARGET ${BENCH_TARGETS[*]}"
  exit 0
fi

BUILD_DIR=${FP8RL_GPU_BUILD_DIR:-build-gpu}
PACK_DIR=${FP8RL_GPU_PACK_DIR:-build-gpu-pack}
LOG_DIR=${FP8RL_GPU_LOG_DIR:-$BUILD_DIR/gpu-check-logs}
if [ "$QUICK" = 1 ]; then BUDGET_S=${FP8RL_GPU_BUDGET_S:-230}; else BUDGET_S=${FP8RL_GPU_BUDGET_S:-500}; fi
MIN_STEP_S=${FP8RL_GPU_MIN_STEP_S:-10}
DRY_SLEEP_S=${FP8RL_GPU_DRY_SLEEP_S:-0} # dry run: each step sleeps this long in its place
JOBS=$(nproc)
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} # ccache (where present) hits across checkouts
START=$(date +%s)
rm -rf "$LOG_DIR" && mkdir -p "$LOG_DIR"
TSV=$LOG_DIR/summary.tsv
printf 'check\tresult\tseconds\tdetail\n' >"$TSV"
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$TSV" "$OUT/summary.tsv"; fi
ROWS=()    # the final table: "check|result|seconds|detail"
ORIG_LD=${LD_LIBRARY_PATH:-} # what Python (PyTorch) gets: none of our library folders
PACK_LD="" # library folders put first on the loader path for our binaries (packs, NCCL, cuBLAS)
FAILED=0
STEP_S=0 # seconds the last run_step took
PLANNED_S=0 # dry run: the sum of the caps of the steps run so far (the worst case)

elapsed() { echo $(($(date +%s) - START)); }
left_s() { echo $((BUDGET_S - $(elapsed))); }
say() { echo "gpu_check: $*" | tee -a "$LOG_DIR/notes.txt"; }
# row CHECK RESULT SECONDS DETAIL: one result, streamed to summary.tsv at once.
row() {
  local detail=${4//$'\t'/ }
  detail=${detail//$'\n'/ }
  ROWS+=("$1|$2|$3|$detail")
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$detail" >>"$TSV"
  if [ -n "${OUT:-}" ]; then
    cp "$TSV" "$OUT/summary.tsv.tmp" && mv "$OUT/summary.tsv.tmp" "$OUT/summary.tsv"
    pack_logs
  fi
  echo "gpu_check: [$2] $1 (${3}s) $detail"
  [ "$2" = FAILED ] && FAILED=1
  return 0
}
pack_logs() { # every log so far into $OUT/logs.tar.gz (replaced whole, never half-written)
  tar -czf "$OUT/logs.tar.gz.tmp" -C "$(dirname "$LOG_DIR")" "$(basename "$LOG_DIR")" 2>/dev/null &&
    mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}
with_ld() { # runs "$@" with our library folders first on the loader path
  if [ -z "$PACK_LD" ]; then "$@"; else LD_LIBRARY_PATH="$PACK_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; fi
}
finish() {
  local rc=$1
  trap - EXIT
  {
    echo "| check | result | s | detail |"
    echo "| --- | --- | --- | --- |"
    for r in "${ROWS[@]}"; do
      IFS='|' read -r a b c d <<<"$r"
      echo "| $a | $b | $c | $d |"
    done
    echo
    echo "gpu_check: finished in $(elapsed) s of a ${BUDGET_S} s budget, exit $rc"
    if [ "$DRY" = 1 ]; then
      echo "gpu_check: dry run: the caps of the steps planned sum to ${PLANNED_S} s; each step's timeout is"
      echo "gpu_check: min(cap, budget left), so the worst case is the ${BUDGET_S} s budget + 5 s (timeout -k) + the tarball"
    fi
  } >"$LOG_DIR/summary.txt"
  cat "$LOG_DIR/summary.txt"
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$LOG_DIR/summary.txt" "$OUT/summary.txt"
    pack_logs
  fi
  exit "$rc"
}
on_exit() { # killed or exited early: still write the table and the tarball
  local rc=$?
  row "gpu_check" FAILED "$(elapsed)" "stopped early (exit $rc)"
  finish 1
}
trap on_exit EXIT
trap 'exit 143' TERM INT

# run_step NAME CAP LOG CMD...: CMD under timeout min(CAP, left), stdout+stderr to LOG. Returns
# CMD's exit status (124: timed out), or 3 when too little budget is left (a SKIPPED row is written
# then). The dry run sleeps FP8RL_GPU_DRY_SLEEP_S in CMD's place, under the same timeout and budget.
run_step() {
  local name=$1 cap=$2 log=$3
  shift 3
  local left
  left=$(left_s)
  if [ "$DRY" = 1 ]; then
    PLANNED_S=$((PLANNED_S + cap))
    echo "dry run, cap ${cap} s: $*" >"$log"
    set -- sleep "$DRY_SLEEP_S"
  fi
  if [ "$left" -lt "$MIN_STEP_S" ]; then
    row "$name" SKIPPED 0 "budget: ${left} s left of ${BUDGET_S} s"
    return 3
  fi
  local t=$((cap < left ? cap : left)) t0 rc
  t0=$(date +%s)
  with_ld timeout -k 5 "$t" "$@" >>"$log" 2>&1
  rc=$?
  STEP_S=$(($(date +%s) - t0))
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "gpu_check: timed out after ${t} s" >>"$log"
  return "$rc"
}

# gtest_step NAME CAP BINARY [ARGS...]: one GoogleTest binary; one row with its counts. On a GPU
# machine a skipped test is a failure (it means the device was not used).
gtest_step() {
  local name=$1 cap=$2 bin=$3
  shift 3
  local log=$LOG_DIR/$(basename "$bin").txt rc
  run_step "$name" "$cap" "$log" "$bin" "$@"
  rc=$?
  [ "$rc" = 3 ] && return 0
  if [ "$DRY" = 1 ]; then
    row "$name" DRY "$STEP_S" "cap ${cap} s: $(basename "$bin") $*"
    return 0
  fi
  local ok failed skipped
  ok=$(grep -c '^\[       OK \]' "$log")
  failed=$(grep '^\[  FAILED  \] [A-Za-z].*(' "$log" | awk '{print $4}' | sort -u | tr '\n' ' ')
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].*(' "$log")
  # Measured accuracy/speed lines the tests print ("[gemm] ...", "[decoder] ...") go to notes.
  grep -E '^\[[a-z0-9_ ]+\] |^budget ' "$log" >>"$LOG_DIR/notes.txt"
  if [ "$rc" = 0 ] && [ -z "$failed" ] && [ "$skipped" = 0 ] && [ "$ok" -gt 0 ]; then
    row "$name" ok "$STEP_S" "$ok tests"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    row "$name" FAILED "$STEP_S" "timed out; $ok ok before; failed: ${failed:-none}"
  else
    row "$name" FAILED "$STEP_S" "exit $rc; $ok ok, $skipped skipped, failed: ${failed:-none} ($(basename "$log"))"
  fi
}

# 1. Tools the machine must have (nothing can be installed there).
NVCC=/usr/local/cuda/bin/nvcc
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
if [ "$DRY" = 1 ]; then
  row tools DRY 0 "dry run: nothing is built or run; budget ${BUDGET_S} s"
else
  missing=()
  need=(python3 tar gzip)
  [ "$PREBUILT" = 1 ] || need+=(cmake ninja c++)
  [ "$PREBUILT" = 1 ] || [ -n "$NVCC" ] || missing+=(nvcc)
  for tool in "${need[@]}"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  if [ ${#missing[@]} -gt 0 ]; then
    row tools FAILED 0 "missing: ${missing[*]}"
    finish 1
  fi
  row tools ok 0 "$([ -n "$NVCC" ] && "$NVCC" --version | grep -o 'release [0-9.]*'), $(c++ --version 2>/dev/null | head -1), cmake $(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
fi

# 2. Libraries the machine lacks. cuBLASLt, the CUDA runtime and NCCL: the toolkit's folders, the
# loader's cache, or the pip layout (site-packages/nvidia/..., as PyTorch images ship them).
PIP_NVIDIA=""
[ "$DRY" = 1 ] || PIP_NVIDIA=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null)
find_lib_dir() { # $1: file name (libnccl.so.2): prints the folder that holds it, if any
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/lib/x86_64-linux-gnu; do
    if [ -e "$d/$1" ]; then echo "$d" && return; fi
  done
  d=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}')
  if [ -n "$d" ]; then dirname "$d" && return; fi
  if [ -n "$PIP_NVIDIA" ]; then
    d=$(find "$PIP_NVIDIA" -name "$1" 2>/dev/null | head -1)
    [ -n "$d" ] && dirname "$d"
  fi
}
add_ld() { case ":$PACK_LD:" in *":$1:"*) ;; *) PACK_LD=${PACK_LD:+$PACK_LD:}$1 ;; esac; }
NCCL_LIB_DIR="" NCCL_INC_DIR=""
if [ "$DRY" = 0 ]; then
  for lib in libcudart.so.13 libcublasLt.so.13; do
    d=$(find_lib_dir "$lib")
    [ -n "$d" ] && add_ld "$d"
  done
  NCCL_LIB_DIR=$(find_lib_dir libnccl.so.2)
  if [ -n "$NCCL_LIB_DIR" ]; then
    add_ld "$NCCL_LIB_DIR"
    for d in "$NCCL_LIB_DIR/../include" /usr/local/cuda/include /usr/include; do
      if [ -f "$d/nccl.h" ]; then NCCL_INC_DIR=$(cd "$d" && pwd) && break; fi
    done
  fi
fi

cmake_extra=(-DFP8RL_WERROR=OFF) # a newer compiler's new warning must not stop the check
if [ "$PREBUILT" = 1 ]; then
  BIN=$BUILD_DIR/prebuilt/bin
  if [ "$DRY" = 1 ]; then
    row prebuilt DRY 0 "would extract $PACK_DIR/prebuilt.tar.gz into $BUILD_DIR/prebuilt"
  elif [ ! -f "$PACK_DIR/prebuilt.tar.gz" ]; then
    row prebuilt FAILED 0 "no $PACK_DIR/prebuilt.tar.gz (make it with scripts/gpu_pack.sh --prebuilt)"
    finish 1
  else
    rm -rf "$BUILD_DIR/prebuilt" && mkdir -p "$BUILD_DIR/prebuilt"
    tar -xzf "$PACK_DIR/prebuilt.tar.gz" -C "$BUILD_DIR/prebuilt" || { row prebuilt FAILED 0 "cannot extract"; finish 1; }
    PACK_LD="$PWD/$BUILD_DIR/prebuilt/lib${PACK_LD:+:$PACK_LD}"
    # Every binary must load here: list what the loader cannot find.
    unresolved=$(for b in "$BIN"/*; do [ "$(basename "$b")" = "$NCCL_TARGET" ] || with_ld ldd "$b" 2>/dev/null | grep 'not found'; done | awk '{print $1}' | sort -u | tr '\n' ' ')
    if [ -n "$unresolved" ]; then
      row prebuilt FAILED 0 "unresolved libraries: $unresolved"
      finish 1
    fi
    row prebuilt ok 0 "$(ls "$BIN" | wc -l) binaries built $(cat "$BUILD_DIR/prebuilt/BUILT" 2>/dev/null)"
  fi
else
  BIN=$BUILD_DIR/bin
  if [ "$DRY" = 0 ] && compgen -G "$PACK_DIR/*.deb" >/dev/null; then
    arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
    if [ -f "$PACK_DIR/ARCH" ] && [ "$(cat "$PACK_DIR/ARCH")" != "$arch" ]; then
      row packages FAILED 0 "$PACK_DIR holds $(cat "$PACK_DIR/ARCH") packages, this machine is $arch"
      finish 1
    fi
    PREFIX=$PWD/$BUILD_DIR/prefix
    if [ ! -f "$PREFIX/.extracted" ]; then
      rm -rf "$PREFIX" && mkdir -p "$PREFIX"
      for deb in "$PACK_DIR"/*.deb; do
        if command -v dpkg-deb >/dev/null 2>&1; then
          dpkg-deb -x "$deb" "$PREFIX" || { row packages FAILED 0 "cannot extract $deb"; finish 1; }
        else # no dpkg: a .deb is an ar archive holding data.tar.*
          (cd "$PREFIX" && ar p "$OLDPWD/$deb" "$(ar t "$OLDPWD/$deb" | grep '^data.tar')" | tar -x -a -f - 2>/dev/null ||
            ar p "$OLDPWD/$deb" data.tar.xz | tar -xJ) || { row packages FAILED 0 "cannot extract $deb"; finish 1; }
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
    # Only for what needs the packed libraries (configure, the build, which runs the test binaries
    # to list their tests, our binaries), not for the script's own tools.
    PACK_LD="$LIB:$LIB/openblas-pthread${PACK_LD:+:$PACK_LD}"
    cmake_extra+=("-DPKG_CONFIG_EXECUTABLE=$PREFIX/usr/bin/pkgconf")
    row packages ok 0 "$(find "$PACK_DIR" -name '*.deb' | wc -l) packages from $PACK_DIR"
  elif [ "$DRY" = 0 ]; then
    row packages ok 0 "none packed: using the system's"
  fi
  if [ -n "$NCCL_INC_DIR" ] && [ "$NCCL_INC_DIR" != /usr/local/cuda/include ]; then
    cmake_extra+=("-DFP8RL_NCCL_INCLUDE=$NCCL_INC_DIR" "-DFP8RL_NCCL_LIBRARY=$NCCL_LIB_DIR/libnccl.so.2")
  fi

  # 3. Configure and build only what the check runs.
  run_step configure 90 "$LOG_DIR/configure.txt" cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DFP8RL_BUILD_SERVICES=OFF -DCMAKE_CUDA_COMPILER="${NVCC:-nvcc}" \
    -DCMAKE_CUDA_ARCHITECTURES=90a "${cmake_extra[@]}"
  rc=$?
  if [ "$rc" = 3 ]; then
    [ "$DRY" = 1 ] || finish 1
  elif [ "$DRY" = 1 ]; then
    row configure DRY 0 "cap 90 s: sm_90a, services off, FP8RL_WERROR=OFF"
  elif [ "$rc" != 0 ]; then
    tail -20 "$LOG_DIR/configure.txt"
    row configure FAILED "$STEP_S" "exit $rc (configure.txt; without a pack run scripts/gpu_pack.sh where a registry is reachable)"
    finish 1
  elif ! grep -q "CUDA ON" "$LOG_DIR/configure.txt"; then
    row configure FAILED "$STEP_S" "CMake did not enable CUDA (configure.txt)"
    finish 1
  else
    row configure ok "$STEP_S" "sm_90a, services off, FP8RL_WERROR=OFF"
  fi
  targets=("${TEST_TARGETS[@]}")
  [ "$QUICK" = 1 ] || targets+=("${BENCH_TARGETS[@]}")
  if [ "$DRY" = 0 ] && grep -q "^$NCCL_TARGET:" <<<"$(cmake --build "$BUILD_DIR" --target help 2>/dev/null)"; then
    targets+=("$NCCL_TARGET")
  fi
  run_step build 300 "$LOG_DIR/build.txt" cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
  rc=$?
  if [ "$rc" = 3 ]; then
    [ "$DRY" = 1 ] || finish 1
  elif [ "$DRY" = 1 ]; then
    row build DRY 0 "cap 300 s: ${targets[*]}"
  elif [ "$rc" != 0 ]; then
    grep -E 'error|FAILED' "$LOG_DIR/build.txt" | head -20
    row build FAILED "$STEP_S" "exit $rc (build.txt; a rerun continues a timed-out build)"
    finish 1
  else
    row build ok "$STEP_S" "${#targets[@]} targets"
  fi
fi

# 4. The shared-math test needs no GPU: it ties the kernels' CPU reference to the model's.
gtest_step "device math (CPU)" 60 "$BIN/fp8rl_device_math_test"

# 5. Is there an sm_90 device? Without one, stop here: everything before this point passed.
run_step device 30 "$LOG_DIR/probe.txt" "$BIN/fp8rl-bench-gemm-gpu" --probe
rc=$?
if [ "$rc" = 3 ]; then
  [ "$DRY" = 1 ] || finish 1
elif [ "$DRY" = 1 ]; then
  row device DRY 0 "cap 30 s: fp8rl-bench-gemm-gpu --probe"
elif [ "$rc" != 0 ]; then
  row device "no GPU" "$STEP_S" "$(head -c 300 "$LOG_DIR/probe.txt")"
  [ "$FAILED" = 0 ] && finish 2
  finish 1
else
  row device ok "$STEP_S" "$(head -1 "$LOG_DIR/probe.txt")"
  command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$LOG_DIR/nvidia_smi.txt" 2>&1
fi

# 6. Every GPU test binary.
gtest_step "gpu kernels" 90 "$BIN/fp8rl_gpu_kernels_test"
gtest_step "gpu model" 120 "$BIN/fp8rl_gpu_model_test"
gtest_step "gpu train ops" 90 "$BIN/fp8rl_gpu_train_test"
gtest_step "gpu train state" 60 "$BIN/fp8rl_gpu_train_state_test"
gtest_step "gpu train backend" 90 "$BIN/fp8rl_gpu_train_backend_test"
if [ -x "$BIN/$NCCL_TARGET" ] || [ "$DRY" = 1 ]; then
  if [ -z "$NCCL_LIB_DIR" ] && [ "$DRY" = 0 ] && with_ld ldd "$BIN/$NCCL_TARGET" | grep -q 'libnccl.*not found'; then
    row "NCCL collectives" SKIPPED 0 "no libnccl.so.2 on this machine (toolkit folders, ldconfig, pip nvidia.nccl)"
  else
    gtest_step "NCCL collectives" 60 "$BIN/$NCCL_TARGET"
  fi
else
  row "NCCL collectives" SKIPPED 0 "not built: no nccl.h / libnccl at configure time (configure.txt)"
fi
if [ "$QUICK" = 1 ]; then finish "$FAILED"; fi

# 7. compute-sanitizer memcheck: the paged KV write + attention, and one whole model step (FP8
# linears + FP8 KV: quantize, cuBLASLt, paged KV, sampling).
SAN=/usr/local/cuda/bin/compute-sanitizer
[ -x "$SAN" ] || SAN=$(command -v compute-sanitizer || true)
san_step() { # NAME CAP LOG BINARY FILTER
  if [ -z "$SAN" ] && [ "$DRY" = 0 ]; then
    row "$1" SKIPPED 0 "compute-sanitizer not found"
    return
  fi
  run_step "$1" "$2" "$3" "${SAN:-compute-sanitizer}" --tool memcheck --error-exitcode 9 "$4" --gtest_filter="$5"
  local rc=$? summary
  [ "$rc" = 3 ] && return
  summary=$(grep -o 'ERROR SUMMARY: [0-9]* errors\?' "$3" | tail -1)
  if [ "$DRY" = 1 ]; then
    row "$1" DRY 0 "cap $2 s: $5"
  elif [ "$rc" = 0 ] && ! grep -q '^\[  SKIPPED \]' "$3"; then
    row "$1" ok "$STEP_S" "$summary"
  else
    row "$1" FAILED "$STEP_S" "exit $rc; ${summary:-no summary} ($(basename "$3"))"
  fi
}
san_step "memcheck paged attention" 60 "$LOG_DIR/sanitizer.txt" "$BIN/fp8rl_gpu_kernels_test" \
  'GpuDecoderTest.PagedKvWriteAndAttentionMatchCpu'
san_step "memcheck model step" 90 "$LOG_DIR/sanitizer_model.txt" "$BIN/fp8rl_gpu_model_test" \
  'Policies/ModelCudaTest.GenerationVsScoringOnTheDevice/fp8_kv_fp8_llama'

# 8. GEMM: one row per shape (FP8 block-scaled vs BF16 TFLOP/s).
run_step "bench gemm" 60 "$LOG_DIR/bench_gemm_gpu.txt" "$BIN/fp8rl-bench-gemm-gpu"
rc=$?
if [ "$rc" = 3 ]; then
  :
elif [ "$DRY" = 1 ]; then
  row "bench gemm" DRY 0 "cap 60 s"
elif [ "$rc" = 0 ]; then
  while IFS='|' read -r _ name shape fp8 bf16 ratio _; do
    row "bench gemm $(echo $name) $(echo $shape)" ok "$STEP_S" "fp8 $(echo $fp8) / bf16 $(echo $bf16) TFLOP/s, x$(echo $ratio)"
  done < <(grep -E '^\| [A-Za-z_]' "$LOG_DIR/bench_gemm_gpu.txt" | grep -v '^| shape')
else
  row "bench gemm" FAILED "$STEP_S" "exit $rc (bench_gemm_gpu.txt)"
fi

# 9. Decode and prefill tokens/s at Llama-3.1-8B widths, 1 of its 32 layers and a 32768-token
# vocabulary (the full 128256 makes the single-threaded host set-up of the random model alone
# outlast the cap: run it on its own): ours in BF16, FP8 linears, FP8 linears + FP8 KV cache, then
# PyTorch BF16 + SDPA on the same cells. The cap covers the host-side set-up and the cells' own
# --budget-seconds; rows stream, so a timeout keeps the cells that finished.
DECODE_ARGS=(--layers 1 --vocab 32768 --batches 1,32,256 --contexts 1024,4096 --decode-steps 8)
bench_rows() { # $1: log with rows "| engine | precision | phase | batch | context | seqs | tok/s | x |"
  grep -E '^\| [a-z]' "$1" | grep -v '^| engine' | while IFS='|' read -r _ eng prec phase b ctx seqs tps ratio _; do
    echo "bench $(echo $phase) $(echo $eng) $(echo $prec) b$(echo $b) ctx$(echo $ctx)|$(echo $tps) tok/s (seqs $(echo $seqs)), x$(echo $ratio) vs bf16"
  done
}
run_step "bench decode" 150 "$LOG_DIR/bench_decode_gpu.txt" "$BIN/fp8rl-bench-decode-gpu" \
  "${DECODE_ARGS[@]}" --budget-seconds 60
rc=$?
if [ "$rc" = 3 ]; then
  :
elif [ "$DRY" = 1 ]; then
  row "bench decode" DRY 0 "cap 150 s: ${DECODE_ARGS[*]} --budget-seconds 60"
else # the rows that finished, also after a timeout
  while IFS='|' read -r a c; do row "$a" ok "$STEP_S" "$c"; done < <(bench_rows "$LOG_DIR/bench_decode_gpu.txt")
  while read -r line; do row "bench weight install" ok "$STEP_S" "${line#install: }"; done \
    < <(grep '^install: ' "$LOG_DIR/bench_decode_gpu.txt")
  [ "$rc" = 0 ] || row "bench decode" FAILED "$STEP_S" "exit $rc: $(tail -1 "$LOG_DIR/bench_decode_gpu.txt")"
fi
run_step "bench decode torch" 60 "$LOG_DIR/bench_decode_torch.txt" \
  env PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="$ORIG_LD" python3 bench/decode_gpu/torch_baseline.py "${DECODE_ARGS[@]}"
rc=$?
if [ "$rc" = 3 ]; then
  :
elif [ "$DRY" = 1 ]; then
  row "bench decode torch" DRY 0 "cap 60 s: torch_baseline.py ${DECODE_ARGS[*]}"
else
  while IFS='|' read -r a c; do row "$a" ok "$STEP_S" "$c"; done < <(bench_rows "$LOG_DIR/bench_decode_torch.txt")
  [ "$rc" = 0 ] || row "bench decode torch" FAILED "$STEP_S" "exit $rc: $(tail -1 "$LOG_DIR/bench_decode_torch.txt")"
fi

# 10. The whole GRPO step on the device (BF16, FP8, FP8 + FP8 KV) at Llama-3.2-1B widths, 2 of its
# 16 layers (the full depth's host-side set-up takes minutes: run it on its own), time-capped.
GRPO_ARGS=(--shape llama-3.2-1b --layers 2 --device cuda --prompts 8 --samples 8 --prompt-tokens 128
  --new-tokens 128 --steps 1 --time-cap-seconds 100)
run_step "bench grpo step" 170 "$LOG_DIR/bench_grpo_step.txt" "$BIN/fp8rl-bench-grpo-step" "${GRPO_ARGS[@]}"
rc=$?
if [ "$rc" = 3 ]; then
  :
elif [ "$DRY" = 1 ]; then
  row "bench grpo step" DRY 0 "cap 170 s: ${GRPO_ARGS[*]}"
else
  while IFS='|' read -r _ prec steps _ _ _ _ _ _ _ _ step ratio share setup _; do
    if [[ "$steps" == " 0 "* ]]; then
      row "bench grpo step $(echo $prec)" SKIPPED "$STEP_S" "past --time-cap-seconds before it was set up"
    else
      row "bench grpo step $(echo $prec)" ok "$STEP_S" "$(echo $step) s/step ($(echo $steps) steps), x$(echo $ratio) vs bf16, requant+calibrate $(echo $share), setup $(echo $setup) s"
    fi
  done < <(grep -E '^\| (bf16|fp8)' "$LOG_DIR/bench_grpo_step.txt")
  [ "$rc" = 0 ] || row "bench grpo step" FAILED "$STEP_S" "exit $rc: $(tail -1 "$LOG_DIR/bench_grpo_step.txt")"
fi

finish "$FAILED"
