#!/usr/bin/env bash
# Installs every Debian package fp8rl needs to build, test and run (idempotent: skips what is present).
# The CUDA toolkit is not installed here: it is used from /usr/local/cuda when it exists.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev
  libopenblas-dev
  libgloo-dev
  libsqlite3-dev libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev prometheus-cpp-dev
  libssl-dev zlib1g-dev libzstd-dev
  libpcre2-dev libicu-dev
  curl prometheus docker-compose iperf3
  clang libclang-rt-dev  # scripts/fuzz.sh, scripts/sanitize.sh: libFuzzer, ASan/UBSan, TSan
  clang-format clang-tidy  # scripts/check_format.sh, scripts/check_tidy.sh (CI: scripts/test.sh)
  llvm  # llvm-symbolizer: file:line in sanitizer reports
  python3 python3-numpy python3-torch python3-yaml python3-jinja2
  python3-grpcio python3-grpc-tools python3-protobuf
  chromium python3-websocket fonts-dejavu-core
  openssl  # scripts/make_certs.sh: test certificates for the TLS tests
  iproute2 nftables  # system.netfault: namespaces, tc, packet loss and partitions
)

# FP8RL_SETUP_BUILD_ONLY=1 (the Docker builder stage): only what configuring and compiling fp8rl
# need (python3 itself: tests/deploy configures with it); no Python modules, test tools, tokenizers.
if [ -n "${FP8RL_SETUP_BUILD_ONLY:-}" ]; then
  build_only=()
  for p in "${PACKAGES[@]}"; do
    case "$p" in python3-*|curl|prometheus|docker-compose|iperf3|clang|libclang-rt-dev|clang-format|clang-tidy|llvm|chromium|fonts-*|openssl|iproute2|nftables) ;; *) build_only+=("$p") ;; esac
  done
  PACKAGES=("${build_only[@]}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

# Real tokenizer files and the reference tokenizer for the hf_tokenizer tests (ignored cache).
# Not fatal: without them those tests skip with a message.
fetch_tokenizers() {
  if [ -n "${FP8RL_SETUP_BUILD_ONLY:-}" ]; then return 0; fi
  bash "$(dirname "${BASH_SOURCE[0]}")/fetch_tokenizers.sh" ||
    echo "setup: WARNING: fetch_tokenizers.sh failed; the hf_tokenizer reference tests will skip" >&2
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  fetch_tokenizers
  exit 0
fi

echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fetch_tokenizers
echo "setup: done"
