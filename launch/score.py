"""Score text files on a checkpoint: python launch/score.py --workdir=DIR [--step=N]
    [--seq_len=T] [--bucket_size=B] [--tokenizer=tokenizer.json] [--out=FILE.json] FILE...

Prints loss per token, bits per byte and loss by position bucket (hybrid_nope/analysis/checkpoint/score.py);
--seq_len may exceed the training length.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.run import storage
from hybrid_nope.analysis.checkpoint import score  # noqa: E402
from hybrid_nope.run.reader import open_readonly  # noqa: E402

flags.DEFINE_string("workdir", None, "Run directory written by launch/train.py.")
flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.")
flags.DEFINE_integer("seq_len", None, "Targets per row; default the training length.")
flags.DEFINE_integer("bucket_size", None, "Positions per loss bucket; default eval.bucket_size.")
flags.DEFINE_string("tokenizer", None, "A tokenizer.json; default the run's data tokenizer "
                    "(an imported model's own).")
flags.DEFINE_string("out", None, "Also write the result as JSON here.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) < 2:
    raise score.AnalysisError("name at least one FILE to score")
  result = score.score_files(open_readonly(flags.FLAGS.workdir), argv[1:], step=flags.FLAGS.step,
                             seq_len=flags.FLAGS.seq_len, bucket_size=flags.FLAGS.bucket_size,
                             tokenizer_path=flags.FLAGS.tokenizer)
  print(score.table(result))
  if flags.FLAGS.out:
    with open(flags.FLAGS.out, "w") as f:
      f.write(storage.to_json(result, indent=2) + "\n")


if __name__ == "__main__":
  cli.run(main, positional="text files")
