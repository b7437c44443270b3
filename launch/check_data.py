"""Is the config's data in place? python launch/check_data.py --config=configs/NAME.py
    [--config.data.path=$PROLONG --config.eval.path=$TEXTBOOKS ...]

Prints the domains, shards and tokens found per domain, the eval set's chapters and rows, and
the tokenizer's vocabulary against model.vocab_size (for data.source=documents, e.g.
configs/small_prose.py, the prepared corpus's name, licence, documents, bytes and rows); every
problem is listed, a line each, then where the data comes from (docs/reproduce.md and the
dataset ids), exit code 2 (hybrid_nope/data/check.py).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For configs/.

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.data import check  # noqa: E402
from hybrid_nope.validate import validate  # noqa: E402

config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  # The trainer's first check, before the data is read; the data's paths are check.check's,
  # which lists every problem with them.
  validate(flags.FLAGS.config, check_paths=False)
  print(check.check(flags.FLAGS.config).text())


if __name__ == "__main__":
  cli.run(main)
