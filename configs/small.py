"""CPU-sized sweep reproducing the recency mechanism (docs/results.md): the demo's shape
(4 layers, d_model 128, seq_len 1024, stdlib bytes), 640 steps of 4 sequences, recency every
32 steps, each experiment at several seeds (train.seed draws the init and the data order).

  python launch/train.py --config=configs/small.py:swa64 --config.train.seed=0 \\
      --workdir=workdirs/sweep/swa64/seed0
  python launch/sweep.py --experiments=swa16,nope --seeds=0,1,2,3,4      # resumable sweep

Experiments: swa{16,64,256} (RoPE in SWA), nopeswa{64,256} (NoPE in SWA), gla (gated linear
attention in place of SWA), gdn (the gated delta rule in place of SWA, DGDG) and gdn3 (three
delta-rule layers per global one, DDDG, as Kimi Linear and Qwen3-Next), nope (global only), and
swa<W>_flops<V>: window W trained for the FLOPs that window V spends in 640 steps (the
compute-matched pair for the window claim). Any of them with `_deep` (swa64_deep, nope_deep):
8 layers instead of 4, the pattern repeated (SGSGSGSG: 4 global layers; nope: 8 G).
docs/performance.md has the measured cost of a run and of the sweep.

The controls expected to FAIL to extrapolate (eval at 2x the training length, `launch/analyze.py
--lengths=1,2`): rope, global-only with RoPE in its G layers (model.global_pos "rope"), and any
hybrid with `_globalrope` (swa64_globalrope: SG with RoPE in both kinds; before `_deep`, as
swa64_globalrope_deep). Their G layers carry a position encoding, so the recency hook measures
their cosines but gives them no logit read-out (that is for global NoPE layers only).

Cost (small.py:swa64): 7.07 MFLOP/token × 2.62 M tokens (640 steps × 4 × 1024) = 1.9e13 FLOPs.
"""
import re

from configs import demo
from hybrid_nope.train import flops

STEPS = 640
DEEP_LAYERS = 8  # `_deep`: the pattern repeated to 8 layers (SG: 4 global NoPE layers).
PATTERNS = {"gla": "LG", "gdn": "DG", "gdn3": "DDDG"}  # the experiments without a window
GLOBAL_ROPE = "_globalrope"  # A hybrid's G layers with RoPE: a control not expected to extrapolate.


def _steps_for_flops_of(c, window: int) -> int:
  """Steps at which config c spends what window `window` spends in STEPS steps."""
  other = c.model.copy_and_resolve_references()
  other.window = window
  ratio = (flops.flops_per_token(other, c.data.seq_len)
           / flops.flops_per_token(c.model, c.data.seq_len))
  return round(STEPS * ratio)


def get_config(experiment: str = "swa64"):
  name, deep = experiment, experiment.endswith("_deep")
  experiment = experiment.removesuffix("_deep")
  global_rope = experiment.endswith(GLOBAL_ROPE)
  experiment = experiment.removesuffix(GLOBAL_ROPE)
  match = re.fullmatch(r"(swa|nopeswa)(\d+)(?:_flops(\d+))?|nope|rope|gla|gdn3?", experiment)
  if not match or (global_rope and experiment in ("nope", "rope")):
    raise ValueError(f"experiment={name!r}: expected swa<W>, "
                     "nopeswa<W>, swa<W>_flops<V>, gla, gdn, gdn3, nope or rope; all but nope "
                     "and rope optionally followed by _globalrope; each then optionally by _deep")
  c = demo.get_config()
  if deep:
    c.model.num_layers = DEEP_LAYERS
  if global_rope or experiment == "rope":
    c.model.global_pos = "rope"
  if experiment in ("nope", "rope"):
    c.model.pattern = "G"
  elif experiment in PATTERNS:
    c.model.pattern = PATTERNS[experiment]
  else:
    c.model.window = int(match.group(2))
    c.model.swa_pos = "nope" if match.group(1) == "nopeswa" else "rope"
  c.data.batch_size = 4
  steps = _steps_for_flops_of(c, int(match.group(3))) if match and match.group(3) else STEPS
  c.train.update(dict(steps=steps, warmup_steps=STEPS // 10))
  c.train.schedule_offset = 0  # The committed sweep's runs (first update at lr 0) resume as is.
  c.checkpoint.update(dict(every_steps=64, keep=2))
  c.metrics.every_steps = 32
  c.eval.every_steps = 64
  return c
