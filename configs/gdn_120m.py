"""120M hybrid, gated delta rule (Gated DeltaNet, one decay per head) : global NoPE, 1:1
interleaved; the same shapes and schedule as swa*_120m and gla_120m.

  python launch/train.py --config=configs/gdn_120m.py --workdir=gs://BUCKET/gdn_120m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 1.57 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 1.6e19 FLOPs; ~47 min on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  return base.experiment(size="120m", window=None, local="D")
