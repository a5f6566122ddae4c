#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/) with clang and libFuzzer under AddressSanitizer +
# UndefinedBehaviorSanitizer in build-asan/ (the build scripts/sanitize.sh asan also uses), then fuzzes each for SECONDS (default 60) starting
# from a copy of its seed corpus. Inputs that crash land in build-asan/fuzz/work/<target>/
# artifacts/; replay one with `build-asan/bin/fuzz_<target> <file>`. Exit status 1 when any
# target found a crash, a leak, a timeout or an out-of-memory.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (TARGET: safetensors, job_config, ... ; default all)
#   FP8RL_FUZZ_PARALLEL=2 scripts/fuzz.sh 600 (targets run two at a time)
#
# Needs Debian's clang and libclang-rt-dev (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
if [ $# -gt 0 ]; then shift; fi
case "$SECONDS_EACH" in
  '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$SECONDS_EACH'" >&2; exit 2 ;;
esac
BUILD_DIR=${FP8RL_FUZZ_BUILD_DIR:-build-asan}
JOBS=${FP8RL_JOBS:-$(nproc)}
PARALLEL=${FP8RL_FUZZ_PARALLEL:-1}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
ALL_TARGETS=(safetensors job_config model_config hf_tokenizer chat_template rest_submit
             weight_sync_payload weight_sync_delta)
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then TARGETS=("${ALL_TARGETS[@]}"); fi

for tool in clang clang++; do
  command -v $tool >/dev/null || { echo "fuzz.sh: $tool not found (run scripts/setup.sh)" >&2; exit 2; }
done

# Instrument every library for coverage (fuzzer-no-link); only the targets link libFuzzer.
# The same flags as scripts/sanitize.sh asan, so the two share build-asan/.
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DFP8RL_ENABLE_CUDA=OFF -DFP8RL_WERROR=OFF -DFP8RL_FUZZ_ENGINE=libfuzzer \
    -DFP8RL_FUZZ_SECONDS="$SECONDS_EACH" \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS"
else
  cmake "$BUILD_DIR" -DFP8RL_FUZZ_SECONDS="$SECONDS_EACH" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]/#/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
regex=$(IFS='|'; echo "${TARGETS[*]}")
echo "fuzz.sh: fuzzing ${#TARGETS[@]} targets for ${SECONDS_EACH} s each, $PARALLEL at a time"
status=0
ctest --test-dir "$BUILD_DIR" -R "^fuzz\.run\.(${regex})\$" -j "$PARALLEL" --output-on-failure \
  --timeout $((SECONDS_EACH + 600)) || status=1
for t in "${TARGETS[@]}"; do
  dir=$BUILD_DIR/fuzz/work/$t
  if compgen -G "$dir/artifacts/*" >/dev/null; then
    echo "fuzz.sh: $t: findings in $dir/artifacts/:" >&2
    ls -l "$dir/artifacts/" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "fuzz.sh: no findings"
exit $status
