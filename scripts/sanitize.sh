#!/usr/bin/env bash
# Builds fp8rl with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/) and with
# ThreadSanitizer (build-tsan/), both with clang, and runs the unit and system tests under each.
# A sanitizer report from any process (a test binary, or a service a system test launched) fails
# the run: every process writes its reports under <build dir>/sanitizer-logs/, which must stay
# empty.
#
#   scripts/sanitize.sh [asan|tsan|all] [extra ctest arguments, e.g. -R coordinator -LE system]
#   FP8RL_SANITIZE_TARGETS="a b" scripts/sanitize.sh tsan -R 'a|b'   (build only those targets)
#
# build-asan/ is also scripts/fuzz.sh's build (its libraries carry libFuzzer's coverage hooks,
# -fsanitize=fuzzer-no-link, which change nothing at run time but the speed): one sanitized
# build instead of two on small machines. CUDA is off (no device code is sanitized; GPU tests
# skip without a GPU). Suppressions (third-party code only, each explained) live in
# scripts/sanitizers/. Heavy: run it under `nice -n 10` on a shared machine. Needs clang and
# libclang-rt-dev (scripts/setup.sh).
#
# Slow tests (none is skipped; docs/results/history/2026-12-03-sanitizers.md has the measured
# times): the system tests bound a job at 150-170 s and ctest at 180 s, which a sanitized build
# meets at a load average up to ~12 on 2 cores (ASan kill_worker 151 s, TSan smoke_grpc 128 s) but
# not at 30-40 (2026-12-03: ASan math_job, TSan kill_worker and metrics ran out of time with no
# sanitizer report and passed alone); under TSan, worker_registration_test's 20 ms heartbeats and a
# 30 s generation wait in generation_worker_test miss under the same load. Rerun such a test alone
# (-R) before reading it as a bug. With FP8RL_SANITIZE_TARGETS, the tests of binaries not built
# appear as <name>_NOT_BUILT: pass a matching -R (or -E _NOT_BUILT).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHICH=${1:-all}
if [ $# -gt 0 ]; then shift; fi
case "$WHICH" in
  asan | tsan | all) ;;
  *) echo "sanitize.sh: first argument must be asan, tsan or all, got '$WHICH'" >&2; exit 2 ;;
esac
JOBS=${FP8RL_JOBS:-$(nproc)}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
ASAN_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
TSAN_FLAGS="-fsanitize=thread -fno-omit-frame-pointer"

configure() {  # <build dir> <flags> [cmake args]
  local dir=$1 flags=$2
  shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    # -O1 keeps sanitized tests reasonably fast; no NDEBUG, so assertions stay on. Line tables
    # only: reports keep file:line, and the build (slow under ASan/TSan) does far less work.
    CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DFP8RL_ENABLE_CUDA=OFF -DFP8RL_WERROR=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" "$@"
  fi
}

build() {  # <build dir>
  if [ -n "${FP8RL_SANITIZE_TARGETS:-}" ]; then
    # shellcheck disable=SC2086
    cmake --build "$1" -j "$JOBS" --target $FP8RL_SANITIZE_TARGETS
  else
    cmake --build "$1" -j "$JOBS"
  fi
}

run_tests() {  # <build dir> [ctest args]
  local dir=$1
  shift
  local logs=$ROOT/$dir/sanitizer-logs
  local status=0
  # Deploy checks build nothing and run no C++; fuzz targets have their own script.
  ctest --test-dir "$dir" --output-on-failure --timeout 900 -LE 'deploy|fuzz' "$@" || status=$?
  if compgen -G "$logs/*" >/dev/null; then
    echo "sanitize.sh: sanitizer reports in $logs:" >&2
    for f in "$logs"/*; do
      echo "=== $f" >&2
      head -80 "$f" >&2
    done
    status=1
  fi
  return $status
}

SUPP=$ROOT/scripts/sanitizers
overall=0
if [ "$WHICH" != tsan ]; then
  configure build-asan "$ASAN_FLAGS" -DFP8RL_FUZZ_ENGINE=libfuzzer
  build build-asan
  logs=$ROOT/build-asan/sanitizer-logs
  rm -rf "$logs" && mkdir -p "$logs"
  ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1" \
  UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1" \
  LSAN_OPTIONS="suppressions=$SUPP/lsan.supp" \
    run_tests build-asan "$@" || overall=1
fi
if [ "$WHICH" != asan ]; then
  configure build-tsan "$TSAN_FLAGS"
  build build-tsan
  logs=$ROOT/build-tsan/sanitizer-logs
  rm -rf "$logs" && mkdir -p "$logs"
  TSAN_OPTIONS="log_path=$logs/tsan:suppressions=$SUPP/tsan.supp:second_deadlock_stack=1" \
    run_tests build-tsan "$@" || overall=1
fi
if [ $overall -ne 0 ]; then
  echo "sanitize.sh: FAILED" >&2
else
  echo "sanitize.sh: clean"
fi
exit $overall
