"""The causal test across seeds: do a config's global NoPE layers read out the recency its local
layers plant? One verdict per config, from each run's ablation_T<T>.json (`analyze.py
--ablate=local`, analysis/checkpoint/ablation.py).

Per seed the statistic is the ablated − control logit gap of each global NoPE layer (head mean),
signed by the layer's clean logit gap and averaged over the layers: the change in the read-out
when the local branches keep their vectors and norms but lose their positions, beyond an
equal-norm perturbation in rotated directions, negative where the read-out shrinks toward 0
whichever way it pointed (a trained layer may favour far keys: prose swa16's last). It is built
from the file's per-document sums (`logit_sums`), so its error has the seed and the document
level (`two_level.combine`, the probe's documents shared by every seed). The claim says it is
negative; its margin is `findings.MARGIN_FRACTION` of the clean |logit gap| (the read-out the
ablation should remove), fixed before the ablated numbers are read.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hybrid_nope.analysis.checkpoint.ablation import ABLATED, CLEAN, CONTROL
from hybrid_nope.analysis.evidence import findings, two_level
from hybrid_nope.analysis.evidence.findings import Verdict

FINDING = "global NoPE layers read out the planted recency (causal: local branches ablated)"
STATISTIC = ("ablated − control logit gap at the final checkpoint, each global NoPE layer's signed "
             "by its clean logit gap (negative: the read-out shrinks), mean over layers and heads")
NULL = ("removing position from the local branches changes the read-out no more than an "
        "equal-norm rotated perturbation")
MARGIN_RULE = "a tenth of the clean logit gap's size (the read-out the ablation should remove)"


def _layer_replicates(result: dict, condition: str, layer: int) -> np.ndarray:
  """[C + 1]: one global NoPE layer's head-mean logit gap under `condition` on all of the
  probe's documents, then with each document left out (`two_level.leave_one_out`)."""
  sums, counts = result["logit_sums"], result["logit_sums"]["counts"]
  near_CN, far_CN = (np.asarray(sums[condition][str(layer)][k], np.float64)
                     for k in ("near", "far"))
  return (two_level.leave_one_out(near_CN.T, counts["near"])
          - two_level.leave_one_out(far_CN.T, counts["far"])).mean(0)


def logit_gap_replicates(result: dict, condition: str) -> np.ndarray:
  """[C + 1] for one condition: the head- and layer-mean logit gap, full and leave-one-out."""
  return np.mean([_layer_replicates(result, condition, layer)
                  for layer in result["logit_sums"]["layers"]], axis=0)


def read_out_size(result: dict) -> float:
  """Mean over global NoPE layers of |clean logit gap|: the read-out the ablation can remove."""
  return float(np.mean([abs(_layer_replicates(result, CLEAN, layer)[0])
                        for layer in result["logit_sums"]["layers"]]))


def difference_replicates(result: dict, a: str = ABLATED, b: str = CONTROL) -> np.ndarray:
  """[C + 1]: condition a − condition b per global NoPE layer, signed by that layer's clean
  logit gap (a read-out may favour recent or far keys; removing what it reads moves it toward
  0 either way), averaged over the layers; paired by document."""
  per_layer = []
  for layer in result["logit_sums"]["layers"]:
    sign = np.sign(_layer_replicates(result, CLEAN, layer)[0])
    per_layer.append(sign * (_layer_replicates(result, a, layer)
                             - _layer_replicates(result, b, layer)))
  return np.mean(per_layer, axis=0)


def _same_probe(results: Sequence[dict], name: str) -> None:
  keys = {(tuple(r["probe"]["rows"]), r["seq_len"], r["far_lag"]) for r in results}
  if len(keys) > 1:
    raise ValueError(f"{name}: the seeds' ablation files measured different probes, lengths or "
                     f"far lags; documents cannot pair across them")


def verdict(config: str, results: Sequence[dict]) -> Verdict:
  """The config's causal verdict over its seeds' ablation results (one per seed)."""
  results = [r for r in results if r is not None and "logit_sums" in r
             and r["logit_sums"]["layers"]]
  if results:
    _same_probe(results, config)
  diffs = [difference_replicates(r) for r in results]
  clean = [read_out_size(r) for r in results]
  estimate = two_level.combine(diffs) if len(diffs) >= 2 else None
  return Verdict(f"{config}: {FINDING}", STATISTIC, NULL, [float(d[0]) for d in diffs], sign=-1,
                 margin=findings.MARGIN_FRACTION * float(np.mean(clean)) if clean else None,
                 margin_rule=MARGIN_RULE, estimate=estimate)


def loss_change(results: Sequence[dict], key: str = "loss") -> list[float]:
  """Per seed: ablated − control eval loss (`key`: loss, loss_within, loss_near or
  loss_beyond), the cost in prediction of removing the planted position."""
  return [r["loss_delta"]["ablated_minus_control"][key] for r in results
          if r is not None and r["loss_delta"]["ablated_minus_control"][key] is not None]


def row(config: str, results: Sequence[dict], v: Verdict) -> dict:
  """The page's numbers for one config: seeds, the clean read-out's size, each difference's seed
  mean (signed as the verdict's statistic), and the loss change (seed mean, seed SE)."""
  results = [r for r in results if r is not None and "logit_sums" in r
             and r["logit_sums"]["layers"]]
  mean = lambda xs: float(np.mean(xs)) if len(xs) else None
  se = lambda xs: float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) >= 2 else None
  signed = lambda a, b: mean([float(difference_replicates(r, a, b)[0]) for r in results])
  losses = loss_change(results)
  return {"config": config, "seeds": len(results),
          "clean": mean([read_out_size(r) for r in results]),
          "ablated_minus_clean": signed(ABLATED, CLEAN),
          "control_minus_clean": signed(CONTROL, CLEAN),
          "ablated_minus_control": v.mean, "se": v.se,
          "loss": mean(losses), "loss_se": se(losses), "verdict": v}
