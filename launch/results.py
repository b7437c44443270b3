"""Regenerate docs/results.md from the sweep's committed records (no training, no checkpoints):

  python launch/results.py [--records_dir=docs/results/runs] [--out=docs/results.md]
      [--figures_dir=docs/results]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from hybrid_nope.analysis.evidence import results_page  # noqa: E402

flags.DEFINE_string("records_dir", "docs/results/runs", "<experiment>/seed<k>.tar.gz packs.")
flags.DEFINE_string("out", "docs/results.md", "The page to write.")
flags.DEFINE_string("figures_dir", "docs/results", "Where the sweep figures go; '' = none.")
flags.DEFINE_string("intro", "docs/results_intro.md", "The page's fixed text ({commit} filled).")


def main(argv):
  del argv
  f = flags.FLAGS
  with open(f.intro) as intro:
    result = results_page.build(f.records_dir, f.out, f.figures_dir or None, intro.read())
  for v in result["verdicts"]:
    print(f"{v['verdict']:>12}  {v['finding']}")
  print(f"wrote {f.out}")


if __name__ == "__main__":
  app.run(main)
