#!/usr/bin/env bash
# Prints the Debian packages that provide the shared libraries the given executables load, so the
# slim runtime image installs exactly what the binaries need (fails if a library has no package).
set -euo pipefail

# Libraries the host provides at run time (the NVIDIA driver, injected by the container toolkit)
# are neither required to resolve in the builder nor looked up in dpkg.
IGNORE=${RUNTIME_PACKAGES_IGNORE:-'^(libcuda|libnvidia-)'}

if [ $# -eq 0 ]; then
  echo "runtime_packages.sh: usage: runtime_packages.sh EXECUTABLE..." >&2
  exit 2
fi

# Library paths as the dynamic loader resolves them ("libx.so.1 => /path (0x...)").
libs=$(for exe in "$@"; do
  if [ ! -x "$exe" ]; then
    echo "runtime_packages.sh: not an executable: $exe" >&2
    exit 1
  fi
  missing=$(ldd "$exe" | awk '/not found/ {print $1}' | grep -Ev "$IGNORE" || true)
  if [ -n "$missing" ]; then
    echo "runtime_packages.sh: $exe has unresolved libraries: $(echo $missing)" >&2
    exit 1
  fi
  ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u)

# dpkg records files under the path its package shipped; with merged /usr the loader may report
# /lib/... for /usr/lib/... (or the reverse), and alternatives (OpenBLAS) hide behind symlinks.
owner() {
  local p=$1 real
  real=$(readlink -f "$p")
  for candidate in "$p" "/usr$p" "${p#/usr}" "$real" "/usr$real" "${real#/usr}"; do
    if out=$(dpkg-query -S "$candidate" 2>/dev/null); then
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}

for lib in $libs; do
  if basename "$lib" | grep -Eq "$IGNORE"; then continue; fi
  if ! owner "$lib"; then
    echo "runtime_packages.sh: no Debian package owns $lib" >&2
    exit 1
  fi
done | sed 's/, /\n/g' | sed 's/:[a-z0-9]*$//' | sort -u
