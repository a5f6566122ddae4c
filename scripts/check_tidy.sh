#!/usr/bin/env bash
# Runs clang-tidy (the repository's .clang-tidy) on the C++ sources this branch changed, reporting
# only the changed lines that are not comments, so a branch is held to the checks without having
# to clean up code it did not touch. Compares with the merge base of origin/main (else main);
# FP8RL_TIDY_BASE=<commit> overrides it. Needs a configured build (compile_commands.json).
# Skips (exit 0) when clang-tidy is not installed, there is nothing to compare with, or more
# than FP8RL_TIDY_MAX_FILES (8) files changed (it says so).
#   bash scripts/check_tidy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FP8RL_BUILD_DIR:-build}
if ! command -v clang-tidy >/dev/null 2>&1; then
  echo "check_tidy: clang-tidy not installed, skipped"
  exit 0
fi
if [ ! -f "$BUILD_DIR/compile_commands.json" ]; then
  echo "check_tidy: $BUILD_DIR/compile_commands.json is missing: configure the build first" >&2
  exit 1
fi
base=${FP8RL_TIDY_BASE:-}
if [ -z "$base" ]; then
  for ref in origin/main main; do
    if git rev-parse -q --verify "$ref^{commit}" >/dev/null 2>&1; then
      base=$(git merge-base HEAD "$ref")
      break
    fi
  done
fi
if [ -z "$base" ]; then
  echo "check_tidy: no origin/main or main to compare with, skipped"
  exit 0
fi
# Per changed .cc file, the line ranges of added lines that are not blank or comment-only.
git diff -U0 --no-color "$base" -- '*.cc' | python3 -c '
import json, re, sys
files, cur = {}, None
for line in sys.stdin:
    if line.startswith("+++ "):
        cur = line[6:].rstrip("\n") if line.startswith("+++ b/") else None
        continue
    m = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)
    if m:
        n = int(m.group(1))
        continue
    if cur and line.startswith("+"):
        text = line[1:].strip()
        if text and not text.startswith("//"):
            files.setdefault(cur, []).append(n)
        n += 1
for f, lines in sorted(files.items()):
    ranges = []
    for l in lines:
        if ranges and ranges[-1][1] == l - 1: ranges[-1][1] = l
        else: ranges.append([l, l])
    print(f + "\t" + json.dumps([{"name": f, "lines": ranges}]))
' >"$BUILD_DIR/tidy-lines.tsv"
count=$(wc -l <"$BUILD_DIR/tidy-lines.tsv")
if [ "$count" -eq 0 ]; then
  echo "check_tidy: no changed C++ code lines since ${base:0:10}"
  exit 0
fi
# clang-tidy takes up to a minute a file on a 2-core machine: a change set larger than
# FP8RL_TIDY_MAX_FILES (default 8; 0 = no limit) is not checked here, and says so, so that the
# test command stays bounded; run it with FP8RL_TIDY_MAX_FILES=0 to check them all.
max_files=${FP8RL_TIDY_MAX_FILES:-8}
if [ "$max_files" -gt 0 ] && [ "$count" -gt "$max_files" ]; then
  echo "check_tidy: $count changed .cc files since ${base:0:10}, over FP8RL_TIDY_MAX_FILES=$max_files: NOT checked (FP8RL_TIDY_MAX_FILES=0 checks them all)"
  exit 0
fi
failed=0
while IFS=$'\t' read -r file filter; do
  [ -f "$file" ] || continue
  if ! clang-tidy -p "$BUILD_DIR" --quiet --line-filter="$filter" "$file" 2>/dev/null; then
    echo "check_tidy: $file has findings on changed lines (above)" >&2
    failed=1
  fi
done <"$BUILD_DIR/tidy-lines.tsv"
if [ "$failed" -ne 0 ]; then exit 1; fi
echo "check_tidy: $count changed file(s) clean since ${base:0:10}"
