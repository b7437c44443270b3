"""120M hybrid, gated linear attention (GLA) : global NoPE, 1:1 interleaved.

  python launch/train.py --config=configs/gla_120m.py --workdir=gs://BUCKET/gla_120m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 1.57 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 1.6e19 FLOPs; ~47 min on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  return base.experiment(size="120m", window=None, local="L")
