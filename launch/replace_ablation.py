"""Puts a rerun of the causal test into a run's pack, in place of the packed one
(hybrid_nope/analysis/checkpoint/ablation_rerun.py says when and what must match).

  python launch/analyze.py --workdir=RUN --ablate=local --lengths=1
  python launch/replace_ablation.py --pack=docs/results/primary/stdlib/swa64/seed0.tar.gz \
      --workdir=RUN
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from hybrid_nope.analysis.checkpoint import ablation_rerun  # noqa: E402

flags.DEFINE_string("pack", None, "The run's <experiment>/seed<k>.tar.gz.", required=True)
flags.DEFINE_string("workdir", None, "The run directory the rerun wrote into.", required=True)


def main(argv):
  del argv
  f = flags.FLAGS
  try:
    source = ablation_rerun.replace_in_pack(f.pack, f.workdir)
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(str(e))
  print(f"{f.pack}: its causal test replaced by {source}")


if __name__ == "__main__":
  app.run(main)
