"""Analyse a run's checkpoint: recency at any length, loss by position, length extrapolation.

  python launch/analyze.py --workdir=DIR [--step=N] [--seq_len=T] [--lengths=1,2,4]
      [--recency_lengths=1,2]
      [--init_seeds=K] [--ablate=local] [--config.eval.path=/path/to/textbook_chapters]
      [--config.a.b=v ...]

Writes JSON and PNG figures to DIR/analysis/step_<N>/ (docs/analysis.md). --config.* overrides
the run's DIR/config.json (e.g. where its eval data lives on this machine).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For configs/.

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from configs import base  # noqa: E402
from hybrid_nope import cli  # noqa: E402
from hybrid_nope.analysis.checkpoint import ablation, report  # noqa: E402
from hybrid_nope.run.reader import open_readonly  # noqa: E402

flags.DEFINE_string("workdir", None, "Run directory written by launch/train.py.")
flags.DEFINE_integer("step", None, "Checkpoint step to analyse; default the latest.")
flags.DEFINE_integer("seq_len", None, "Analysis length; default the training length.")
flags.DEFINE_list("lengths", [str(k) for k in report.DEFAULT_LENGTHS],
                  "Multiples of the training length scored for extrapolation; empty to skip.")
flags.DEFINE_list("recency_lengths", None,
                  "The factors of --lengths whose rows also get the recency records (default "
                  "all); the others are scored for loss alone, which costs far less at 8x-16x.")
flags.DEFINE_integer("init_seeds", 0,
                     "Also measure this many fresh initialisations on the same probe (the "
                     "empirical init null, analysis/step_<N>/init_null_T<T>.json); 0 = skip.")
flags.DEFINE_enum("ablate", None, list(ablation.ABLATE_CHOICES),
                  "Also run the causal test: 'local' permutes the local mixers' outputs within "
                  "documents, against position-free controls matched in norm and eval loss, and "
                  "measures every global layer's read-out and the loss "
                  "(analysis/step_<N>/ablation_T<T>.json); unset = skip.")
flags.DEFINE_integer("rows_per_call", None,
                     "Eval rows per forward pass (memory at long lengths); default a batch.")
cli.define_config_dict("config", base.get_config(),
                       "Overrides of the run's config.json, e.g. --config.eval.path=.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  result = report.analyze(
      open_readonly(flags.FLAGS.workdir), step=flags.FLAGS.step, seq_len=flags.FLAGS.seq_len,
      lengths=[int(k) for k in flags.FLAGS.lengths],
      overrides=config_flags.get_override_values(flags.FLAGS["config"]),
      rows_per_call=flags.FLAGS.rows_per_call, init_seeds=flags.FLAGS.init_seeds,
      ablate=flags.FLAGS.ablate,
      recency_lengths=(None if flags.FLAGS.recency_lengths is None
                       else [int(k) for k in flags.FLAGS.recency_lengths]))
  for path in result["files"]:
    logging.info("wrote %s", path)
  print(report.summary_text(result))


if __name__ == "__main__":
  cli.run(main)
