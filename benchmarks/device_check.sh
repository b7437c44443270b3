#!/usr/bin/env bash
# One lent GPU's whole check, sized for one 600 s device call (one H100 or H200): numerics of
# every Pallas kernel against XLA, mixer timings by implementation, fla's kernels beside ours,
# and the 120m / 350m train steps (benchmarks/device_check.py says what each row means).
#
#   bash benchmarks/device_check.sh            # on the GPU; the table lands in $OUT (or /tmp)
#   bash benchmarks/device_check.sh --dry      # on this CPU: tiny shapes, interpret mode
#
# Before a lease, put the fla wheels in wheels/ (git-ignored) and carry that path:
#   .venv/bin/python -m pip download --no-deps -d wheels fla-core==0.6.0 einops
# The GPU image has no network: they are installed from there, without dependencies, into a
# scratch directory on PYTHONPATH. jax must not take the whole GPU, since fla's torch shares it.
# Output: device_check.md (the table) and device_check.log (everything) in $OUT, else /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
DEST=${OUT:-/tmp}
shopt -s nullglob
wheels=(wheels/*.whl)
if [[ ${#wheels[@]} -gt 0 && "${1:-}" != "--dry" ]]; then
  "$PY" -m pip install --quiet --no-deps --no-index --target /tmp/device_check_wheels "${wheels[@]}"
  export PYTHONPATH="/tmp/device_check_wheels${PYTHONPATH:+:$PYTHONPATH}"
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false
"$PY" benchmarks/device_check.py --out "$DEST/device_check.md" "$@" 2>&1 | tee "$DEST/device_check.log"
