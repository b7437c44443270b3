"""350M hybrid, gated delta rule (Gated DeltaNet, one decay per head) : global NoPE, 1:1
interleaved; the same shapes and schedule as swa*_350m and gla_350m.

  python launch/train.py --config=configs/gdn_350m.py --workdir=gs://BUCKET/gdn_350m \
      --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters

Cost: 3.57 GFLOP/token × 10.5 B tokens (20000 steps × 64 × 8192) = 3.7e19 FLOPs; ~1.8 h on v5p-64
(32 chips, 459 TFLOP/s each) at an assumed 40% MFU.
"""
from configs import base


def get_config():
  return base.experiment(size="350m", window=None, local="D")
