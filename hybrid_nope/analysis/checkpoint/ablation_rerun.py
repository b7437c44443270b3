"""A rerun of the causal test in place of a run's packed one (launch/replace_ablation.py).

A pack analysed before a control existed lacks it. Its run is retrained from the pack's commit
(training is deterministic) or its checkpoint kept, `analyze.py --ablate=local` is rerun at a
newer commit, and the new ablation_T<T>.json replaces the packed one, every other record kept
byte for byte (`sweep.replace_record`). Only a rerun that measured the same run and probe may do
so: the same step, lengths, seeds and probe rows, and the same clean and ablated eval losses
within SAME_RUN_LOSS_RTOL, else nothing is written. Retraining is bitwise where the thread count
matches the original's; XLA's CPU reductions differ with it (stdlib swa64 retrains on one core
first differ at step 4, by 5e-8 in the loss, and end up to 6e-5 apart in clean eval loss and
9.3e-4 in ablated, which amplifies it), so the tolerance admits float-level drift and nothing
near a different seed (seeds differ by 1-2% in clean and ablated eval loss). The replaced file
records what it replaced (`rerun_of`).
"""
from __future__ import annotations

import fnmatch
import json
import os

from hybrid_nope import sweep
from hybrid_nope.analysis.checkpoint.ablation import ABLATED, CLEAN
from hybrid_nope.run import run_dir

SAME_RUN_KEYS = ("step", "seq_len", "train_seq_len", "far_lag", "ablate", "permutation_seed")
SAME_RUN_LOSS_RTOL = 2e-3


def mismatches(packed: dict, rerun: dict) -> list[str]:
  """What shows that `rerun` did not measure `packed`'s run: a differing key of SAME_RUN_KEYS or
  probe row, or a clean or ablated eval loss off by more than SAME_RUN_LOSS_RTOL. Empty where
  the rerun may replace the packed file."""
  out = [f"{k}: packed {packed.get(k)!r}, rerun {rerun.get(k)!r}" for k in SAME_RUN_KEYS
         if packed.get(k) != rerun.get(k)]
  if packed["probe"]["rows"] != rerun["probe"]["rows"]:
    out.append("probe rows differ")
  for c in (CLEAN, ABLATED):
    a, b = packed["eval"][c]["loss"], rerun["eval"][c]["loss"]
    if not abs(a - b) <= SAME_RUN_LOSS_RTOL * abs(a):
      out.append(f"{c} eval loss: packed {a!r}, rerun {b!r}")
  return out


def replace_in_pack(pack_path: str, workdir: str) -> str:
  """Replaces the pack's one ablation_T<T>.json with the same path under `workdir` (the rerun);
  returns that path. Raises ValueError naming both files where the pack has no single ablation
  file or the rerun measured another run (`mismatches`)."""
  packed = sweep.read_pack(pack_path)
  pattern = run_dir.wildcard(run_dir.ABLATION_FILE)
  found = [r for r in packed if fnmatch.fnmatchcase(os.path.basename(r), pattern)]
  if len(found) != 1:
    raise ValueError(f"{pack_path}: expected one {pattern} (a run with a causal test), found "
                     f"{len(found)}")
  (rel,) = found
  rerun_path = os.path.join(workdir, rel)
  with open(rerun_path, "rb") as f:
    record = json.load(f)
  packed_file = json.loads(packed[rel])
  problems = mismatches(packed_file, record)
  if problems:
    raise ValueError(f"{rerun_path} did not measure {pack_path}'s run: " + "; ".join(problems))
  record["rerun_of"] = {c: {"packed_eval_loss": packed_file["eval"][c]["loss"]}
                        for c in (CLEAN, ABLATED)}
  record["rerun_of"]["bitwise"] = all(packed_file["eval"][c]["loss"] == record["eval"][c]["loss"]
                                      for c in (CLEAN, ABLATED))
  sweep.replace_record(pack_path, rel, json.dumps(record).encode())
  return rerun_path
