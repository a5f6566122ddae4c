#!/usr/bin/env bash
# The seed's precision table in miniature (docs/results/): the demo job in four precision setups
# (BF16; FP8 end to end; FP8 generation + BF16 training with tis; the same without IS) x 3 seeds
# on a local cluster, then a table and plots. `--quick` = 1 seed x 6 steps (a pipeline check).
# Other flags go to scripts/experiment.py (--seeds, --steps, --out, --docs DIR).
# `table run|report ...` runs scripts/experiment_fp8_table.py instead (the resumable FP8 table
# with confidence intervals, docs/results/experiment-README.md), `sweep unit|report ...`
# scripts/experiment_mismatch_sweep.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
  SUDO=""; if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    python3-matplotlib >/dev/null
fi
bash scripts/build.sh
case "${1:-}" in
  table) shift; exec "$PY" scripts/experiment_fp8_table.py "$@" ;;
  sweep) shift; exec "$PY" scripts/experiment_mismatch_sweep.py "$@" ;;
esac
exec "$PY" scripts/experiment.py --bin-dir "${FP8RL_BUILD_DIR:-build}/bin" "$@"
