"""350M hybrid, SWA window 256 (NoPE inside SWA (ablation)) : global NoPE, 1:1 interleaved.

  python launch/train.py --config=configs/nopeswa256_350m.py --workdir=$WORKDIR \
      --config.data.path=$PROLONG --config.eval.path=$TEXTBOOKS
"""
from configs import base


def get_config():
  return base.experiment(size="350m", window=256, swa_pos="nope")
