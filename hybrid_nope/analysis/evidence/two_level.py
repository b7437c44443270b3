"""Errors at two levels, seed × document, for statistics of the committed per-cluster sums.

Every run of a sweep is measured on one probe: the same C documents for every seed and config.
A seed-level SE is then conditional on those documents; a verdict that should hold for other
documents of the corpus needs the document level too. The two levels are crossed (every seed
sees every document), so the variance of a seed mean θ̄ = (1/S) Σ_s θ_s is estimated two-way
(Cameron, Gelbach & Miller 2011, clustering on seeds and on documents):

  V = V_seed + V_doc − V_cell,
  V_seed = var_s(θ_s) / S                                 (seeds as clusters)
  V_doc  = (C − 1)/C Σ_c (θ̄_(−c) − θ̄_(·))²               (documents as clusters: delete-one
                                                            jackknife of the seed mean)
  V_cell = (1/S) mean_s [(C − 1)/C Σ_c (θ_s,(−c) − θ_s,(·))²]   (each seed × document cell
                                                            once: counted in both, so removed)

and never below the larger one-way variance (with 5 seeds the subtraction alone runs low:
under a pure document effect it gives V_doc (1 − 1/S)). Degrees of freedom: min(S, C) − 1,
the smaller number of clusters. The jackknife works for any smooth statistic of the sums (a
ratio mean, a gap, a difference of gaps between steps or configs, a max over modules), because
every statistic is computed on `Replicates`: the full estimate and one per left-out document.
tests/test_analysis_evidence_two_level.py checks the coverage by simulation under the
committed probe's real document sizes, and that dropping the document level undercovers.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from hybrid_nope.analysis.measure.records import near_far


def leave_one_out(sums_C, counts_C) -> np.ndarray:
  """[C + 1]: the ratio mean Σ s / Σ n, then the same with each document left out in turn.
  Leading axes (heads) broadcast; documents are the last axis."""
  s, n = np.asarray(sums_C, np.float64), np.asarray(counts_C, np.float64)
  total_s, total_n = s.sum(-1, keepdims=True), n.sum(-1, keepdims=True)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.concatenate([total_s / total_n, (total_s - s) / (total_n - n)], axis=-1)


class Replicates:
  """One measurement's statistics (one run, one step) as arrays [C + 1]: the estimate on all of
  the probe's documents, then on the probe less each document. Arithmetic on them (differences
  between steps, modules or configs on the same probe) keeps the pairing by document."""

  def __init__(self, sums: dict, lags: Sequence[int], far: int):
    self.sums, self.lags, self.far = sums, list(lags), far
    self.near_i, self.far_i = near_far(lags, far)
    self.counts = np.asarray(sums["counts"], np.float64)

  @property
  def num_documents(self) -> int:
    return self.counts.shape[-1]

  def has(self, key: str) -> bool:
    return key in self.sums

  def mean(self, key: str, lag_index: int) -> np.ndarray:
    return leave_one_out(np.asarray(self.sums[key], np.float64)[lag_index],
                         self.counts[lag_index])

  def floor(self, key: str) -> np.ndarray:
    return self.mean(key, self.far_i)

  def gap(self, key: str) -> np.ndarray:
    return self.mean(key, self.near_i) - self.mean(key, self.far_i)

  def shuffled_gap(self, key: str) -> np.ndarray:
    """The shuffled-token control's gap: its sums hold lags (1, L) only, on the same pairs."""
    s = np.asarray(self.sums[f"{key}/shuffled"], np.float64)
    return (leave_one_out(s[0], self.counts[self.near_i])
            - leave_one_out(s[1], self.counts[self.far_i]))

  def logit_gap(self, layer: int) -> np.ndarray:
    """The head-mean logit gap of a global NoPE layer (per head first, as the records are)."""
    s_LCN = np.asarray(self.sums[f"{layer}/logit"], np.float64)
    per_head = (leave_one_out(np.moveaxis(s_LCN[self.near_i], -1, 0), self.counts[self.near_i])
                - leave_one_out(np.moveaxis(s_LCN[self.far_i], -1, 0), self.counts[self.far_i]))
    return per_head.mean(0)

  def shuffled_logit_gap(self, layer: int) -> np.ndarray:
    """The head-mean logit gap on the shuffled-token probe (its sums hold lags (1, L))."""
    s_2CN = np.asarray(self.sums[f"{layer}/logit/shuffled"], np.float64)
    per_head = (leave_one_out(np.moveaxis(s_2CN[0], -1, 0), self.counts[self.near_i])
                - leave_one_out(np.moveaxis(s_2CN[1], -1, 0), self.counts[self.far_i]))
    return per_head.mean(0)


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A seed mean with its two-level standard error and the one-level pieces it is made of."""
  mean: float
  se: float
  se_seed: float
  se_doc: float
  df: int
  seeds: int
  documents: int


def jackknife_variance(replicates_C: np.ndarray) -> float:
  c = replicates_C.shape[-1]
  return float((c - 1) / c * np.sum((replicates_C - replicates_C.mean()) ** 2))


def combine(replicates_by_seed: Sequence[np.ndarray]) -> Estimate | None:
  """The seed mean of a statistic and its seed × document SE, from one replicate array [C + 1]
  per seed (all on the same documents, in the same order). None below 2 seeds or 2 documents,
  or where a replicate is not finite (a document whose removal leaves a lag without pairs)."""
  r = np.asarray([np.asarray(x, np.float64) for x in replicates_by_seed])
  if r.ndim != 2 or r.shape[0] < 2 or r.shape[1] < 3 or not np.all(np.isfinite(r)):
    return None
  full, loo = r[:, 0], r[:, 1:]
  s, c = loo.shape
  v_seed = float(full.var(ddof=1) / s)
  v_doc = jackknife_variance(loo.mean(0))
  v_cell = float(np.mean([jackknife_variance(row) for row in loo]) / s)
  v = max(v_seed + v_doc - v_cell, v_seed, v_doc)
  return Estimate(mean=float(full.mean()), se=float(np.sqrt(v)), se_seed=float(np.sqrt(v_seed)),
                  se_doc=float(np.sqrt(v_doc)), df=min(s, c) - 1, seeds=s, documents=c)
