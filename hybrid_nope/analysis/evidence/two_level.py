"""Errors at two levels, seed × document, for statistics of the committed per-cluster sums.

Every run of a sweep is measured on one probe: the same C documents for every seed and config.
A seed-level SE is then conditional on those documents; a verdict that should hold for other
documents of the corpus needs the document level too. The two levels are crossed (every seed
sees every document), so the variance of a seed mean θ̄ = (1/S) Σ_s θ_s is the crossed random
two-way one, σ²_seed/S + σ²_doc/C + σ²_cell/(SC), estimated from three mean squares (the
classical variance-components estimator; Cameron, Gelbach & Miller 2011 cluster on both levels
the same way):

  V = V_seed + V_doc − V_cell,
  V_seed = var_s(θ_s) / S                                 seeds as clusters; df S − 1
  V_doc  = (C − 1)/C Σ_c (r̄_·c − r̄_··)²                  documents as clusters: the delete-one
                                                          jackknife of the seed mean; df C − 1
  V_cell = (C − 1)/(C S (S − 1)) Σ_s,c (r_sc − r̄_s· − r̄_·c + r̄_··)²
                                                          the seed × document interaction of the
                                                          left-one-out replicates r_sc = θ_s,(−c);
                                                          df (S − 1)(C − 1)

For a plain mean (θ_s the mean of the cells x_sc) these are exactly MS_seed/(SC), MS_doc/(SC)
and MS_cell/(SC) of the two-way ANOVA of x_sc, whose expectations σ²_cell + C σ²_seed,
σ²_cell + S σ²_doc and σ²_cell make V unbiased; for a smooth statistic of the sums (a ratio
mean, a gap, a difference of gaps between steps or configs, a max over modules) the replicates
are its jackknife, and the same formulas are its linearisation. Each one-way term alone counts
the interaction once, so the sum counts it twice and V_cell takes one copy away.

The subtraction can run below either one-way variance (and below 0) by chance; each one-way
term is an unbiased estimate of a part of the true V, so V is floored at the larger of them.

Degrees of freedom: Welch–Satterthwaite over the three terms, with the signs of the sum,

  df = (V_seed + V_doc − V_cell)² / (V_seed²/(S − 1) + V_doc²/(C − 1) + V_cell²/((S − 1)(C − 1)))

(the squares take no sign: a subtracted term adds its own uncertainty). Where the floor binds, V
is that one-way term alone and df is its own: S − 1 for the seed term, C − 1 for the document
term (`Estimate.floor` names it). df is a float (Student's t takes any df > 0); without the
floor it is at least (S − 1)(C − 1)/(S + C − 1), just under S − 1 (≈ 1.9 at 3 seeds and 63
documents), and it rises toward C − 1 where documents carry the variance.

A statistic with no seed level (the data's own recency P(t_i = t_{i−d}): the same probe, hence
bit-identical replicates, for every seed) has the document level alone: `combine` detects
identical seeds exactly and returns `across_documents`: V_doc and df C − 1.

tests/test_analysis_evidence_two_level.py checks the three terms against a direct two-way ANOVA
on a small balanced design, and the 95% coverage by simulation under the committed probe's real
document sizes at 3, 5 and 8 seeds, with mis-scaled cell terms and either level dropped failing.
"""
from __future__ import annotations

import dataclasses
import math
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
  """A seed mean with its two-level standard error and the one-level pieces it is made of.
  df is Welch–Satterthwaite's over the terms that make the variance (a float); `floor` names the
  one-way term the variance was floored at ("seed" or "document"; "" where the two-way sum
  stands); `levels` is "seed × document", or "document" for a statistic with no seed level."""
  mean: float
  se: float
  se_seed: float
  se_doc: float
  df: float
  seeds: int
  documents: int
  se_cell: float = 0.0
  floor: str = ""
  levels: str = "seed × document"


def jackknife_variance(replicates_C: np.ndarray) -> float:
  c = replicates_C.shape[-1]
  return float((c - 1) / c * np.sum((replicates_C - replicates_C.mean()) ** 2))


def satterthwaite(terms: Sequence[tuple[float, float, float]]) -> float:
  """Welch–Satterthwaite degrees of freedom of Σ a_k V_k from (a_k, V_k, df_k) triples:
  (Σ a_k V_k)² / Σ (a_k V_k)² / df_k. Terms with V_k = 0 carry nothing; inf where none does."""
  total = sum(a * v for a, v, _ in terms)
  spread = sum((a * v) ** 2 / df for a, v, df in terms if v != 0)
  return float(total ** 2 / spread) if spread > 0 else math.inf


def components(replicates_by_seed) -> tuple[float, float, float]:
  """(V_seed, V_doc, V_cell) of the module docstring from replicates [S, C + 1]."""
  r = np.asarray(replicates_by_seed, np.float64)
  full, loo = r[:, 0], r[:, 1:]
  s, c = loo.shape
  v_seed = float(full.var(ddof=1) / s)
  v_doc = jackknife_variance(loo.mean(0))
  inter = loo - loo.mean(1, keepdims=True) - loo.mean(0, keepdims=True) + loo.mean()
  v_cell = float((c - 1) / (c * s * (s - 1)) * np.sum(inter ** 2))
  return v_seed, v_doc, v_cell


def across_documents(replicates_C, seeds: int = 1) -> Estimate | None:
  """The document level alone, for a statistic with no seed level (one replicate array [C + 1],
  the same for every one of `seeds` seeds): its jackknife SE over the probe's documents on C − 1
  df. None below 2 documents or where a replicate is not finite."""
  r = np.asarray(replicates_C, np.float64)
  if r.ndim != 1 or r.shape[0] < 3 or not np.all(np.isfinite(r)):
    return None
  c = r.shape[0] - 1
  se = math.sqrt(jackknife_variance(r[1:]))
  return Estimate(mean=float(r[0]), se=se, se_seed=0.0, se_doc=se, df=float(c - 1),
                  seeds=seeds, documents=c, levels="document")


def combine(replicates_by_seed: Sequence[np.ndarray]) -> Estimate | None:
  """The seed mean of a statistic and its seed × document SE, from one replicate array [C + 1]
  per seed (all on the same documents, in the same order). None below 2 seeds or 2 documents,
  or where a replicate is not finite (a document whose removal leaves a lag without pairs).
  Seeds whose replicates are all identical (a statistic of the probe alone) give
  `across_documents`."""
  r = np.asarray([np.asarray(x, np.float64) for x in replicates_by_seed])
  if r.ndim != 2 or r.shape[0] < 2 or r.shape[1] < 3 or not np.all(np.isfinite(r)):
    return None
  s, c = r.shape[0], r.shape[1] - 1
  if np.all(r == r[0]):
    return across_documents(r[0], seeds=s)
  v_seed, v_doc, v_cell = components(r)
  v_two_way = v_seed + v_doc - v_cell
  if v_two_way >= max(v_seed, v_doc):
    v, floor = v_two_way, ""
    df = satterthwaite([(1.0, v_seed, s - 1), (1.0, v_doc, c - 1),
                        (-1.0, v_cell, (s - 1) * (c - 1))])
  elif v_seed >= v_doc:
    v, floor, df = v_seed, "seed", float(s - 1)
  else:
    v, floor, df = v_doc, "document", float(c - 1)
  return Estimate(mean=float(r[:, 0].mean()), se=math.sqrt(v), se_seed=math.sqrt(v_seed),
                  se_doc=math.sqrt(v_doc), df=df, seeds=s, documents=c,
                  se_cell=math.sqrt(v_cell), floor=floor)
