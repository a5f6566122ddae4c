#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format (the repository's .clang-format)
# would write, and names each such file. Fast (seconds): scripts/test.sh runs it before building.
#   bash scripts/check_format.sh            # check
#   clang-format -i FILE...                 # fix a file it names
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  echo "check_format: clang-format is not installed (bash scripts/setup.sh installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -d '' files < <(git ls-files -z -- '*.h' '*.cc' '*.cu' '*.cuh')
else  # an exported tree (git archive): every C++ file outside build folders
  mapfile -d '' files < <(find . -path './build*' -prune -o -type f \
    \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0)
fi
# One clang-format process per 100 files (one per file takes minutes); its diagnostics name the
# files that differ ("FILE:LINE:COL: error: code should be clang-formatted").
mapfile -t bad < <(printf '%s\0' "${files[@]}" |
  xargs -0 -n 100 -P "$(nproc)" clang-format --dry-run --Werror 2>&1 >/dev/null |
  sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} file(s) differ from .clang-format (fix: clang-format -i FILE):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} C++ files formatted"
