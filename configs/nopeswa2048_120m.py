"""120M hybrid, SWA window 2048 (NoPE inside SWA (ablation)) : global NoPE, 1:1 interleaved.

  python launch/train.py --config=configs/nopeswa2048_120m.py --workdir=$WORKDIR \
      --config.data.path=$PROLONG --config.eval.path=$TEXTBOOKS
"""
from configs import base


def get_config():
  return base.experiment(size="120m", window=2048, swa_pos="nope")
