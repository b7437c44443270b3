"""Compare runs of a sweep: python launch/compare.py DIR1 DIR2 ... [--out=DIR].

Writes compare.md (one table and the recency / extrapolation correlations), compare.json and
figures to --out (default <common parent of the runs>/compare). Run launch/analyze.py on each
run first for the extrapolation columns.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.analysis.evidence import compare  # noqa: E402
from hybrid_nope.run.reader import open_readonly  # noqa: E402

flags.DEFINE_string("out", None, "Output directory; default <common parent>/compare.")


def main(argv):
  result = compare.compare([open_readonly(w) for w in argv[1:]], out_dir=flags.FLAGS.out)
  for path in result["files"]:
    logging.info("wrote %s", path)
  print(result["markdown"])


if __name__ == "__main__":
  cli.run(main, positional="workdirs")
