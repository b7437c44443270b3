#!/usr/bin/env bash
# One seed of configs/lag4096.py's experiments (seq_len 8192, far lag 4096) on one lent GPU, one
# run at a time, each under a timeout, through launch/sweep.py (train, then analyze.py at 1x and
# 2x the training length); each finished run's records are packed under RECORDS_DIR.
#
#   bash benchmarks/lag4096_lease.sh SEED [EXPERIMENTS]
#   bash benchmarks/lag4096_lease.sh 1 swa64,swa256,swa1024      # one device call (<= 600 s) ...
#   bash benchmarks/lag4096_lease.sh 1 swa4096,nope,nopeswa4096   # ... and the next
#
# EXPERIMENTS defaults to all of lag4096.EXPERIMENTS (six runs: ~8 min of training on an H100 at
# the docstring's assumed 20% MFU, plus a compile and an analysis each: more than one 600 s device
# command, so split them over two calls as above). A run cut by its timeout saved its state on
# SIGTERM (train.py's preemption path) and resumes where it stopped when this script runs again.
# The script stops starting runs once DEADLINE seconds have passed, and gives the last run only the
# time left. Where $OUT is set (a device machine's return folder), the packs and each run's
# sweep log are copied there.
#
# Environment: PY (default .venv/bin/python, else python3), ROOT (run directories, default
# workdirs/lag4096), RECORDS_DIR (default docs/results/runs_lag4096), RUN_TIMEOUT (seconds per
# run, default 240), DEADLINE (seconds for the whole script, default 570), INIT_SEEDS (fresh
# initialisations for analyze.py's init null, default 0: on a lease the time goes to training).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:?usage: bash benchmarks/lag4096_lease.sh SEED [EXPERIMENTS] (e.g. 1 swa64,nope)}
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
EXPERIMENTS=${2:-$("$PY" -c 'from configs import lag4096; print(",".join(lag4096.EXPERIMENTS))')}
ROOT=${ROOT:-workdirs/lag4096}
RECORDS_DIR=${RECORDS_DIR:-docs/results/runs_lag4096}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
DEADLINE=${DEADLINE:-570}
INIT_SEEDS=${INIT_SEEDS:-0}
THREADS=$(nproc)

"$PY" -c 'import jax; print("# devices:", jax.devices(), "jax", jax.__version__)'
start=$SECONDS
status=0
IFS=, read -r -a runs <<< "$EXPERIMENTS"
for experiment in "${runs[@]}"; do
  left=$((DEADLINE - (SECONDS - start)))
  if ((left < 60)); then
    echo "# $experiment seed $SEED: not started, ${left}s of DEADLINE=${DEADLINE}s left"
    status=1
    continue
  fi
  limit=$((left < RUN_TIMEOUT ? left : RUN_TIMEOUT))
  echo "# $experiment seed $SEED: up to ${limit}s"
  t0=$SECONDS
  if timeout --kill-after=30 "$limit" "$PY" launch/sweep.py --config_file=configs/lag4096.py \
      --experiments="$experiment" --seeds="$SEED" --parallel=1 --threads="$THREADS" \
      --root="$ROOT" --records_dir="$RECORDS_DIR" --init_seeds="$INIT_SEEDS"; then
    echo "# $experiment seed $SEED: done in $((SECONDS - t0))s"
  else
    echo "# $experiment seed $SEED: exit $? after $((SECONDS - t0))s (a timeout is 124; rerun" \
         "this script to resume it)"
    status=1
  fi
  if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT/logs"
    cp "$ROOT/$experiment/seed$SEED"/*.log "$OUT/logs/" 2>/dev/null || true
    cp "$ROOT/$experiment/seed$SEED/metrics.jsonl" "$OUT/logs/$experiment.seed$SEED.metrics.jsonl" \
        2>/dev/null || true
  fi
done
if [[ -n "${OUT:-}" && -d "$RECORDS_DIR" ]]; then
  mkdir -p "$OUT/$RECORDS_DIR" && cp -r "$RECORDS_DIR"/. "$OUT/$RECORDS_DIR/"
fi
exit $status
