"""Train a hybrid model: python launch/train.py --config=configs/NAME.py --workdir=DIR [--config.a.b=v].

Without training: --help_config lists every key with its value and meaning, --print_config
prints the resolved config, --dry_run validates it and prints parameters, FLOPs per token,
memory per device against the device's (and the keys that would make it fit) and the mesh,
after launch/check_data.py's checks of the data where its paths exist.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For configs/.

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from hybrid_nope import cli, config_help  # noqa: E402
from hybrid_nope.analysis.measure.hook import RecencyHook  # noqa: E402
from hybrid_nope.errors import UserError  # noqa: E402
from hybrid_nope.train import distributed, dry_run, loop  # noqa: E402

config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and TensorBoard logs.")
flags.DEFINE_bool("help_config", False, "Print every config key with its value and meaning "
                  "(from configs/base.py's comments), then exit.")
flags.DEFINE_bool("print_config", False, "Print the resolved config, then exit.")
flags.DEFINE_bool("dry_run", False, "Validate the config and check its data (as "
                  "launch/check_data.py), build the model abstractly, print parameters, FLOPs "
                  "per token, memory per device against the device's and the mesh, then exit.")
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  f = flags.FLAGS
  if f.help_config or f.print_config or f.dry_run:
    for wanted, text in ((f.help_config, lambda: config_help.help_text(f.config)),
                         (f.print_config, lambda: str(f.config)),
                         (f.dry_run, lambda: dry_run.report_text(f.config))):
      if wanted:
        print(text(), flush=True)
    return
  if not f.workdir:
    raise UserError("--workdir is required to train (a directory for checkpoints and records)")
  distributed.initialize()
  summary = loop.train(f.config, f.workdir, hooks=[RecencyHook.for_run])
  logging.info("done: %s", summary)


if __name__ == "__main__":
  cli.run(main)
