#!/usr/bin/env bash
# The small-scale reproduction of docs/results.md: the resumable multi-seed sweep of
# configs/small.py (each finished run's records packed under docs/results/runs/), then the page
# regenerated from those records alone.
#   bash launch/reproduce_small.sh [RUNS_DIR]    (hours on 2 CPU cores: docs/performance.md;
#                                                 rerun after a kill and it resumes)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-workdirs/sweep}
PY=.venv/bin/python
$PY launch/sweep.py --experiments=swa16,nope --seeds=0,1,2,3,4 --root="$RUNS"
$PY launch/sweep.py --experiments=swa64,swa256,nopeswa256,nopeswa64,gla --seeds=0,1,2,3,4 \
    --root="$RUNS"
$PY launch/sweep.py --experiments=gdn,gdn3 --seeds=0,1,2,3,4 --root="$RUNS"
$PY launch/sweep.py --experiments=swa16_flops256 --seeds=0,1,2,3,4 --init_seeds=0 --root="$RUNS"
$PY launch/results.py
