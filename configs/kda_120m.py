"""120M hybrid, Kimi Delta Attention (the gated delta rule with one decay per key channel) :
global NoPE, 3:1 (DDDG) as Kimi Linear interleaves them; the shapes and schedule of gdn_120m.

  python launch/train.py --config=configs/kda_120m.py --workdir=gs://BUCKET/kda_120m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 1.47 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 1.5e19 FLOPs; ~44 min on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  c = base.experiment(size="120m", window=None, local="D", locals_per_global=3)
  c.model.delta_gate = "channel"
  return c
