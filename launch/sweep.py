"""Train and analyse configs x seeds, resumably: python launch/sweep.py --experiments=swa16,nope
    --seeds=0,1,2,3,4 [--config_file=configs/small.py] [--root=workdirs/sweep]
    [--records_dir=docs/results/runs --commit] [--parallel=2 --threads=1] [--init_seeds=10]
    [--ablate [--ablate_experiments=swa64,...]]

Finished runs are skipped, partial ones resumed (hybrid_nope/sweep.py); each finished run's
records are packed under --records_dir (ROOT/records unless given; a directory of the
repository, e.g. docs/results/runs, to commit each pack by itself with --commit).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

from hybrid_nope import sweep  # noqa: E402

flags.DEFINE_string("config_file", "configs/small.py", "Config file taking an experiment name.")
flags.DEFINE_list("experiments", None, "Experiment names the config file takes.")
flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "train.seed of each run.")
flags.DEFINE_string("root", "workdirs/sweep", "Run directories go to ROOT/<experiment>/seed<k>.")
flags.DEFINE_string("records_dir", None, "Where packed records go (default ROOT/records); "
                    "'' = none.")
flags.DEFINE_bool("commit", False, "git-commit each pack as its run finishes (with "
                  "--records_dir inside the repository).")
flags.DEFINE_integer("parallel", 2, "Runs at a time.")
flags.DEFINE_integer("threads", 1, "Cores pinned to each run.")
flags.DEFINE_integer("init_seeds", 10, "Fresh inits for the init null (first seed's runs only).")
flags.DEFINE_bool("ablate", False, "Also run the causal test (analyze.py --ablate=local) on "
                  "each run with a local mixer; its ablation_T<T>.json is packed.")
flags.DEFINE_list("ablate_experiments", [], "With --ablate: only these experiments get the "
                  "causal test (default: every one with a local mixer).")
# Multi-string, one argument per use: a list flag would split "--lengths=1,2,4" at its commas.
flags.DEFINE_multi_string("analyze_args", ["--lengths=1,2"],
                          "An extra argument of launch/analyze.py (repeat the flag for more).")
flags.DEFINE_multi_string("train_args", [], "An extra argument of launch/train.py, e.g. an "
                          "override (repeat the flag for more).")
flags.mark_flags_as_required(["experiments"])
flags.register_multi_flags_validator(
    ["commit", "records_dir"], lambda f: not f["commit"] or bool(f["records_dir"]),
    message="--commit commits each pack to the repository: give --records_dir, a directory "
            "inside it (e.g. docs/results/runs)")


def main(argv):
  del argv
  f = flags.FLAGS
  runs = sweep.plan(f.config_file, f.experiments, [int(s) for s in f.seeds], f.root)
  status = sweep.sweep(runs, parallel=f.parallel, threads=f.threads,
                       records_dir=(sweep.default_records_dir(f.root) if f.records_dir is None
                                    else f.records_dir or None),
                       on_packed=sweep.git_commit if f.commit else None, log=logging.info,
                       analyze_args=f.analyze_args, train_args=f.train_args, init_seeds=f.init_seeds,
                       init_seed_of=int(f.seeds[0]), ablate=f.ablate,
                       ablate_experiments=f.ablate_experiments)
  failed = {k: v for k, v in status.items() if v.startswith("failed")}
  for name, why in failed.items():
    logging.error("%s %s", name, why)
  return 1 if failed else 0


if __name__ == "__main__":
  app.run(main)
