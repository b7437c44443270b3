"""120M hybrid, SWA window 64 (RoPE inside SWA) : global NoPE, 1:1 interleaved.

  python launch/train.py --config=configs/swa64_120m.py --workdir=$WORKDIR \
      --config.data.path=$PROLONG --config.eval.path=$TEXTBOOKS
"""
from configs import base


def get_config():
  return base.experiment(size="120m", window=64)
