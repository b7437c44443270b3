"""120M hybrid, SWA window 64 (RoPE inside SWA) : global NoPE, 1:1 interleaved.

  python launch/train.py --config=configs/swa64_120m.py --workdir=gs://BUCKET/swa64_120m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 1.54 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 1.6e19 FLOPs; ~46 min on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  return base.experiment(size="120m", window=64)
