"""350M hybrid, Gated DeltaNet as published (Yang, Kautz & Hatamizadeh 2024; fla's GatedDeltaNet:
Mamba2's gate −exp(A_log)·softplus(x W_a + dt_bias) per head, value heads of 2 × head_dim, q
scaled by 1/sqrt(d_k); base.DELTA_PUBLISHED["gdn"]) : global NoPE, 1:1 interleaved; the layer
count, width, heads and schedule of swa*_350m and gla_350m (expand_v 2 makes the D layers
larger). D's first form (GLA's gate): --config.model.delta_gate_form=gla
--config.model.delta_expand_v=1 --config.model.delta_qk_scale=1.

  python launch/train.py --config=configs/gdn_350m.py --workdir=gs://BUCKET/gdn_350m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 3.81 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 4.0e19 FLOPs; ~1.9 h on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  c = base.experiment(size="350m", window=None, local="D")
  c.model.update(base.DELTA_PUBLISHED["gdn"])
  return c
