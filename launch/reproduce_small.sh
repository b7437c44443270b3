#!/usr/bin/env bash
# The small-scale reproduction of docs/results.md: trains configs/small.py's sweep, analyses
# each run, compares them, and copies the figures and table into docs/results/.
#   bash launch/reproduce_small.sh [RUNS_DIR]        (about 30 minutes on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-workdirs/small}
PY=.venv/bin/python
for e in swa16 swa64 swa256 nopeswa64 nopeswa256 gla nope; do
  [ -f "$RUNS/$e/checkpoints/160/state/_METADATA" ] || \
    $PY launch/train.py --config=configs/small.py:$e --workdir="$RUNS/$e"
  $PY launch/analyze.py --workdir="$RUNS/$e" --lengths=1,2
done
$PY launch/compare.py "$RUNS"/swa16 "$RUNS"/swa64 "$RUNS"/swa256 "$RUNS"/nopeswa64 "$RUNS"/nopeswa256 "$RUNS"/gla \
    "$RUNS"/nope --out="$RUNS/compare"
mkdir -p docs/results
cp "$RUNS"/compare/*.png "$RUNS"/compare/compare.md docs/results/
for e in swa16 nope; do
  for f in "$RUNS/$e"/analysis/step_160/*_T1024.png; do
    cp "$f" "docs/results/${e}_$(basename "$f")"
  done
done
