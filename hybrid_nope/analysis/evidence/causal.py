"""The causal test across seeds: do a config's global NoPE layers read out the recency its local
layers plant? One verdict per config, from each run's ablation_T<T>.json (`analyze.py
--ablate=local`, analysis/checkpoint/ablation.py).

Per seed the statistic is the ablated − control logit gap, averaged over the global NoPE layers
and their heads: the change in the read-out when the local branches keep their vectors and norms
but lose their positions, beyond an equal-norm perturbation in rotated directions. It is built
from the file's per-document sums (`logit_sums`), so its error has the seed and the document
level (`two_level.combine`, the probe's documents shared by every seed). The claim says it is
negative; its margin is `findings.MARGIN_FRACTION` of the clean logit gap (the read-out the
ablation should remove), fixed before the ablated numbers are read.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hybrid_nope.analysis.checkpoint.ablation import ABLATED, CLEAN, CONTROL
from hybrid_nope.analysis.evidence import findings, two_level
from hybrid_nope.analysis.evidence.findings import Verdict

FINDING = "global NoPE layers read out the planted recency (causal: local branches ablated)"
STATISTIC = ("ablated − control logit gap at the final checkpoint, mean over global NoPE layers "
             "and heads")
NULL = ("removing position from the local branches changes the read-out no more than an "
        "equal-norm rotated perturbation")
MARGIN_RULE = "a tenth of the clean logit gap (the read-out the ablation should remove)"


def logit_gap_replicates(result: dict, condition: str) -> np.ndarray:
  """[C + 1] for one condition: the head- and layer-mean logit gap on all of the probe's
  documents, then with each document left out (`two_level.leave_one_out`)."""
  sums, counts = result["logit_sums"], result["logit_sums"]["counts"]
  per_layer = []
  for layer in sums["layers"]:
    near_CN, far_CN = (np.asarray(sums[condition][str(layer)][k], np.float64)
                       for k in ("near", "far"))
    per_head_NC1 = (two_level.leave_one_out(near_CN.T, counts["near"])
                    - two_level.leave_one_out(far_CN.T, counts["far"]))
    per_layer.append(per_head_NC1.mean(0))
  return np.mean(per_layer, axis=0)


def difference_replicates(result: dict, a: str = ABLATED, b: str = CONTROL) -> np.ndarray:
  """[C + 1]: condition a − condition b, paired by document."""
  return logit_gap_replicates(result, a) - logit_gap_replicates(result, b)


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
  clean = [float(logit_gap_replicates(r, CLEAN)[0]) for r in results]
  estimate = two_level.combine(diffs) if len(diffs) >= 2 else None
  return Verdict(f"{config}: {FINDING}", STATISTIC, NULL, [float(d[0]) for d in diffs], sign=-1,
                 margin=findings.MARGIN_FRACTION * abs(float(np.mean(clean))) if clean else None,
                 margin_rule=MARGIN_RULE, estimate=estimate)


def loss_change(results: Sequence[dict], key: str = "loss") -> list[float]:
  """Per seed: ablated − control eval loss (`key`: loss, loss_within, loss_near or
  loss_beyond), the cost in prediction of removing the planted position."""
  return [r["loss_delta"]["ablated_minus_control"][key] for r in results
          if r is not None and r["loss_delta"]["ablated_minus_control"][key] is not None]


def row(config: str, results: Sequence[dict], v: Verdict) -> dict:
  """The page's numbers for one config: seeds, the clean logit gap, each difference's seed
  mean, and the loss change (seed mean, seed SE)."""
  results = [r for r in results if r is not None]
  mean = lambda xs: float(np.mean(xs)) if len(xs) else None
  se = lambda xs: float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) >= 2 else None
  summary = lambda name: [r["summary"][name]["logit_gap"] for r in results]
  losses = loss_change(results)
  return {"config": config, "seeds": len(results),
          "clean": mean([r["summary"][CLEAN]["logit_gap"] for r in results]),
          "ablated_minus_clean": mean(summary("ablated_minus_clean")),
          "control_minus_clean": mean(summary("control_minus_clean")),
          "ablated_minus_control": v.mean, "se": v.se,
          "loss": mean(losses), "loss_se": se(losses), "verdict": v}
