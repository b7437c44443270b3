"""120M hybrid, Kimi Delta Attention as published (Kimi Linear, 2025; transformers'
KimiLinearDeltaAttention: a per-key-channel gate −exp(A_log_h)·softplus(x W_1 W_2 + dt_bias) of
rank head_dim, q scaled by 1/sqrt(d_k), a low-rank sigmoid output gate;
base.DELTA_PUBLISHED["kda"]) : global NoPE, 3:1 (DDDG) as Kimi Linear interleaves them; the
shapes and schedule of gdn_120m, value heads of head_dim as Kimi's.

  python launch/train.py --config=configs/kda_120m.py --workdir=gs://BUCKET/kda_120m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 1.45 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 1.5e19 FLOPs; ~43 min on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  c = base.experiment(size="120m", window=None, local="D", locals_per_global=3)
  c.model.update(base.DELTA_PUBLISHED["kda"])
  return c
