#!/usr/bin/env bash
# The small-scale reproduction of docs/results.md: the resumable multi-seed sweep of
# configs/small.py (each finished run's records packed under docs/results/runs/), the swa16
# reruns with the causal test, the same sweep on English prose, then the page regenerated from
# those records alone.
#   bash launch/reproduce_small.sh [RUNS_DIR]    (hours on 2 CPU cores: docs/performance.md;
#                                                 rerun after a kill and it resumes)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-workdirs/sweep}
PY=.venv/bin/python
STDLIB=(--root="$RUNS" --records_dir=docs/results/runs)
$PY launch/sweep.py --experiments=swa16,nope --seeds=0,1,2,3,4 "${STDLIB[@]}"
$PY launch/sweep.py --experiments=swa64,swa256,nopeswa256,nopeswa64,gla --seeds=0,1,2,3,4 \
    "${STDLIB[@]}"
$PY launch/sweep.py --experiments=gdn,gdn3 --seeds=0,1,2,3,4 "${STDLIB[@]}"
$PY launch/sweep.py --experiments=swa16_flops256 --seeds=0,1,2,3,4 --init_seeds=0 "${STDLIB[@]}"
# stdlib swa16 again, with the causal test and lengths to 16x (docs/results/runs_v2).
$PY launch/sweep.py --experiments=swa16 --seeds=0,1,2 --init_seeds=0 --ablate \
    --analyze_args=--lengths=1,2,4,8,16 --root="$RUNS"_v2 --records_dir=docs/results/runs_v2
# The English prose corpus (configs/small_prose.py; docs/results/runs_prose).
make prose
PROSE=(--config_file=configs/small_prose.py --seeds=0,1,2 --ablate --root="$RUNS"_prose
       --analyze_args=--lengths=1,2,4,8,16 --records_dir=docs/results/runs_prose)
$PY launch/sweep.py --experiments=swa16,nope "${PROSE[@]}"
$PY launch/sweep.py --experiments=swa64,swa256,nopeswa64,nopeswa256,gla,gdn,swa64_deep,nope_deep \
    "${PROSE[@]}"
$PY launch/results.py
