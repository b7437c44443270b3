"""CPU-sized sweep reproducing the recency mechanism (docs/results.md): the demo's shape
(4 layers, d_model 128, seq_len 1024, stdlib bytes), 160 steps of 4 sequences, recency
every 16 steps.

  python launch/train.py --config=configs/small.py:swa64 --workdir=workdirs/small/swa64

Experiments: swa{16,64,256} (RoPE in SWA), nopeswa{64,256} (NoPE in SWA), gla (gated linear
attention in place of SWA), nope (global only).
About 2 minutes each on 2 idle CPU cores.

Cost (small.py:swa64): 7.07 MFLOP/token × 655 k tokens (160 steps × 4 × 1024) = 4.6e12 FLOPs.
"""
import re

from configs import demo


def get_config(experiment: str = "swa64"):
  match = re.fullmatch(r"(swa|nopeswa)(\d+)|nope|gla", experiment)
  if not match:
    raise ValueError(f"experiment={experiment!r}: expected swa<W>, nopeswa<W>, gla or nope")
  c = demo.get_config()
  if experiment == "nope":
    c.model.pattern = "G"
  elif experiment == "gla":
    c.model.pattern = "LG"
  else:
    c.model.window = int(match.group(2))
    c.model.swa_pos = "nope" if match.group(1) == "nopeswa" else "rope"
  c.data.batch_size = 4
  c.train.update(dict(steps=160, warmup_steps=16))
  c.checkpoint.update(dict(every_steps=16, keep=2))
  c.eval.every_steps = 32
  return c
