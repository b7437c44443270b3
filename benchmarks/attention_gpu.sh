#!/usr/bin/env bash
# Attention kernels on one GPU: Pallas (our Triton kernel) vs cuDNN vs dense masked XLA,
# bfloat16, T = 4096 .. 32768, windows 256 / 1024 / 4096 and global, 12 heads x 64.
# Prepared for a lent H200; expect ~5-10 min, most of it compiling. Extra flags go to
# benchmarks/attention.py (e.g. --T 8192,32768 --windows 256 to shorten it).
#
#   bash benchmarks/attention_gpu.sh 2>&1 | tee /tmp/attention_gpu.txt
#
# --check first runs every impl against impl="xla" in float32 on the device (forward and
# dq, dk, dv, with a window and with packed segments): the compiled Triton kernels have only
# been tested in interpret mode on CPU, so read those lines before trusting the table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -c 'import jax; print("# devices:", jax.devices())'
exec "$PY" benchmarks/attention.py --preset gpu --check "$@"
