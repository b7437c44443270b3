"""350M baseline: every layer global attention without positional encoding.

  python launch/train.py --config=configs/nope_350m.py --workdir=$WORKDIR \
      --config.data.path=$PROLONG --config.eval.path=$TEXTBOOKS
"""
from configs import base


def get_config():
  return base.experiment(size="350m", window=None)
