"""Train a hybrid model: python launch/train.py --config=configs/NAME.py --workdir=DIR [--config.a.b=v]."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For configs/.

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.analysis.measure.hook import RecencyHook  # noqa: E402
from hybrid_nope.train import distributed, loop  # noqa: E402

config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and TensorBoard logs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  distributed.initialize()
  summary = loop.train(flags.FLAGS.config, flags.FLAGS.workdir, hooks=[RecencyHook.for_run])
  logging.info("done: %s", summary)


if __name__ == "__main__":
  cli.run(main)
