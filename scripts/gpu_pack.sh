#!/usr/bin/env bash
# Prepares, on a machine that reaches Debian's package mirror, everything scripts/gpu_check.sh
# needs on a GPU machine that reaches no registry and has only the CUDA toolkit, CMake, ninja, a
# C++ compiler and Python: the Debian packages of the -dev libraries the kernels/model/tests build
# configures against (services off), as .deb files in one ignored folder (build-gpu-pack/, at most
# 60 MiB). gpu_check.sh extracts them with `dpkg -x` into a private prefix under its build folder,
# never into /. Carry build-gpu-pack/ with the checkout to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."

PACK_DIR=${FP8RL_GPU_PACK_DIR:-build-gpu-pack}
MAX_MIB=60

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
