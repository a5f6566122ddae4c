#!/usr/bin/env bash
# Prepares, on a machine that reaches Debian's package mirror, everything scripts/gpu_check.sh
# needs on a GPU machine that reaches no registry and has only the CUDA toolkit, CMake, ninja, a
# C++ compiler and Python: the Debian packages of the -dev libraries the kernels/model/tests build
# configures against (services off), as .deb files in one ignored folder (build-gpu-pack/, at most
# 60 MiB). gpu_check.sh extracts them with `dpkg -x` into a private prefix under its build folder,
# never into /. Carry build-gpu-pack/ with the checkout to the GPU machine.
#
# `scripts/gpu_pack.sh --prebuilt` instead builds gpu_check's targets here (CUDA toolkit needed,
# sm_90a) into build-gpu/ and packs the binaries with the shared libraries they load that a CUDA
# image does not carry (not glibc, libstdc++, the driver, cuBLAS or NCCL) into
# build-gpu-pack/prebuilt.tar.gz, for `scripts/gpu_check.sh --prebuilt`: the device then spends
# no time building. At most 60 MiB; it leaves the .deb files alone.
set -euo pipefail
cd "$(dirname "$0")/.."

PACK_DIR=${FP8RL_GPU_PACK_DIR:-build-gpu-pack}
MAX_MIB=60

if [ "${1:-}" = --prebuilt ]; then
  BUILD_DIR=${FP8RL_GPU_BUILD_DIR:-build-gpu}
  NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
  [ -x "$NVCC" ] || { echo "gpu_pack: no nvcc at $NVCC (set NVCC)" >&2; exit 1; }
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  read -r -a targets <<<"$(bash scripts/gpu_check.sh --print-targets)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP8RL_BUILD_SERVICES=OFF \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
  present=()
  known=$(cmake --build "$BUILD_DIR" --target help)
  for t in "${targets[@]}"; do
    grep -q "^$t:" <<<"$known" && present+=("$t")
  done
  echo "gpu_pack: building ${present[*]}"
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${present[@]}"
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib"
  for t in "${present[@]}"; do cp "$BUILD_DIR/bin/$t" "$stage/bin/"; done
  # The libraries to carry: everything the loader resolves except the base system, the driver,
  # cuBLAS and NCCL (the GPU machine has its own, matching its driver; the CUDA runtime travels).
  skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcublas|libnccl|libnvidia)'
  for b in "$stage"/bin/*; do
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r name path; do
    [[ "$name" =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
  done
  echo "$(git rev-parse --short HEAD)$(git diff --quiet || echo +changes) on $(date -u +%F), $(. /etc/os-release && echo "$PRETTY_NAME"), $(c++ --version | head -1)" >"$stage/BUILT"
  mkdir -p "$PACK_DIR"
  tar -czf "$PACK_DIR/prebuilt.tar.gz.tmp" -C "$stage" . && mv "$PACK_DIR/prebuilt.tar.gz.tmp" "$PACK_DIR/prebuilt.tar.gz"
  mib=$(du -sm "$PACK_DIR/prebuilt.tar.gz" | cut -f1)
  if [ "$mib" -gt "$MAX_MIB" ]; then
    echo "gpu_pack: prebuilt.tar.gz is $mib MiB, over the $MAX_MIB MiB limit" >&2
    exit 1
  fi
  echo "gpu_pack: $(ls "$stage/bin" | wc -l) binaries, $(ls "$stage/lib" | wc -l) libraries, $mib MiB in $PACK_DIR/prebuilt.tar.gz"
  exit 0
fi

# The configure-time dependencies of the non-service build (CMakeLists.txt, rl/CMakeLists.txt) and
# the shared libraries they pull in that a CUDA image does not carry. Debian 12 (bookworm) names.
PACKAGES=(
  pkgconf pkgconf-bin libpkgconf3
  libabsl-dev libabsl20220623
  nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5 libquadmath0
  libyaml-cpp-dev libyaml-cpp0.7
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libicu-dev libicu72 icu-devtools
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
)

rm -rf "$PACK_DIR"
mkdir -p "$PACK_DIR"
echo "gpu_pack: downloading ${#PACKAGES[@]} packages into $PACK_DIR/"
(cd "$PACK_DIR" && apt-get download -q "${PACKAGES[@]}" >/dev/null)
# The architecture the packages are for: gpu_check.sh refuses another one.
dpkg --print-architecture >"$PACK_DIR/ARCH"
printf '%s\n' "${PACKAGES[@]}" >"$PACK_DIR/PACKAGES"

n=$(find "$PACK_DIR" -name '*.deb' | wc -l)
if [ "$n" != "${#PACKAGES[@]}" ]; then
  echo "gpu_pack: expected ${#PACKAGES[@]} .deb files, got $n" >&2
  exit 1
fi
mib=$(du -sm "$PACK_DIR" | cut -f1)
if [ "$mib" -gt "$MAX_MIB" ]; then
  echo "gpu_pack: $PACK_DIR is $mib MiB, over the $MAX_MIB MiB limit" >&2
  exit 1
fi
echo "gpu_pack: $n packages, $mib MiB in $PACK_DIR/"
