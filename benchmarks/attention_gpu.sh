#!/usr/bin/env bash
# Everything GPU-specific, in one run on one GPU (sized for an H200: under 8 minutes):
#  1. numerics: pallas (our Triton kernel) and cudnn against xla in float32, forward and dq, dk,
#     dv, float32 and bfloat16, windows 64 / 256 / 1024 / global, with and without packed
#     segments (lines "# check ... PASS|FAIL"; cuDNN takes no float32 and says so);
#  2. attention timings: bfloat16 fwd and fwd+bwd at T = 2048 .. 32768, 12 heads x 64, useful
#     TFLOP/s and % of the datasheet peak (989 TFLOP/s bf16 on H100/H200), against dense XLA;
#  3. the 120m and 350m train steps at seq_len 8192 (bfloat16, Llama-3 vocabulary): tokens/s
#     and MFU, hybrid SG and global-only G.
#
#   bash benchmarks/attention_gpu.sh 2>&1 | tee /tmp/attention_gpu.txt
#
# Extra flags go to benchmarks/attention.py (e.g. --T 8192,32768 to shorten step 2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -c 'import jax; print("# devices:", jax.devices(), "jax", jax.__version__)'
"$PY" benchmarks/attention.py --preset gpu --check "$@"
echo
"$PY" benchmarks/train_step.py --sizes=120m,350m --seq_lens=8192 --patterns=SG,G \
    --dtype=bfloat16 --vocab=128256 --batch_size=8 --steps=3 --remat=350m@8192
