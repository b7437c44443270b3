"""Regenerate docs/results.md from the sweeps' committed records (no training, no checkpoints):

  python launch/results.py [--primary=docs/results/primary.toml] [--corpus=NAME=DIR[,DIR...] ...]
      [--exploratory=docs/results/exploratory.toml] [--out=docs/results.md]
      [--figures_dir=docs/results]

--primary is the registered primary family, decided first from its own runs (the records_dir of
each of its corpora), Holm inside it. Each --corpus names an exploratory sweep and its records
dirs: the first is the sweep every row reads, later ones (reruns with new measurements) add
causal tests and longer lengths; their rows carry Benjamini–Hochberg q-values
(hybrid_nope/analysis/evidence/results_page.py). --exploratory names which experiment plays
which part in those rows (the global-only baseline, the mixer pairs, the windows compared).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from hybrid_nope.analysis.evidence import (exploratory_experiments, primary,  # noqa: E402
                                           results_page)

flags.DEFINE_multi_string(
    "corpus", ["stdlib=docs/results/runs,docs/results/runs_v2",
               "prose=docs/results/runs_prose"],
    "NAME=DIR[,DIR...]: a corpus and its records dirs of <experiment>/seed<k>.tar.gz packs.")
flags.DEFINE_string("out", "docs/results.md", "The page to write.")
flags.DEFINE_string("figures_dir", "docs/results", "Where the sweep figures go; '' = none.")
flags.DEFINE_string("primary", primary.DEFAULT_PATH, "The registered primary family, decided "
                    "first from its own runs; '' = a page of exploratory sweeps only.")
flags.DEFINE_string("exploratory", exploratory_experiments.DEFAULT_PATH, "Which experiment "
                    "plays which part in the exploratory rows (baseline, local configs, mixer "
                    "pairs, windows, RoPE-global controls).")
flags.DEFINE_string("intro", "docs/results_intro.md", "The page's fixed text ({commit} filled).")


def main(argv):
  del argv
  f = flags.FLAGS
  with open(f.intro) as intro:
    result = results_page.build(results_page.parse_corpora(f.corpus), f.out,
                                f.figures_dir or None, intro.read(),
                                primary.load(f.primary) if f.primary else None,
                                experiments=exploratory_experiments.load(f.exploratory))
  for name, corpus in result["corpora"].items():
    for v in corpus["verdicts"] + corpus["causal"]:
      print(f"{name:>7} {v['verdict']:>12}  {v['finding']}")
  for name, rows in result["primary"].items():
    for v in rows:
      print(f"{name:>7} {v['verdict']:>12}  (primary) {v['finding']}")
  print(f"wrote {f.out}")


if __name__ == "__main__":
  app.run(main)
