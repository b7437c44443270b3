"""350M baseline: every layer global attention without positional encoding.

  python launch/train.py --config=configs/nope_350m.py --workdir=gs://BUCKET/nope_350m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 4.07 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 4.3e19 FLOPs; ~2.0 h on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  return base.experiment(size="350m", window=None)
