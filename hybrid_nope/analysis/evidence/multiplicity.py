"""p-values a referee accepts for a page of findings: Holm's step-down adjustment over the page's
family, and the two one-sided tests (TOST) that turn "no effect" into a claim with a margin.

- `holm`: a page states several findings at once; read one by one at 5% each, the chance that
  some true null is "reproduced" grows with their number (20 independent true nulls: 64%). Holm's
  adjusted p-values keep that family-wise error rate at the level under any dependence between
  the findings, and reject at least what Bonferroni does.
- `tost_p`: a non-significant difference is not evidence of no difference. With a margin fixed
  in advance, H0: |effect| ≥ margin is rejected when both one-sided t tests (effect > −margin
  and effect < +margin) reject; its p is the larger of the two. Its size is at most α at the
  margin itself (|effect| = margin), whatever the SE.
- `two_sided_p`: the ordinary t test of effect = 0, for the same (mean, SE, df).
- `smallest_attainable_p`: an exact sign-flip permutation test over n paired seeds has 2^n
  equally likely sign patterns, so its two-sided p is never below 2/2^n (5 seeds: 0.0625, above
  5%): a test that cannot reach its level says so ("untestable"), not "inconclusive".

The t-based ones take an estimate, its standard error and Student-t degrees of freedom (seeds − 1
for a seed mean, Satterthwaite's float for a seed × document error, np.inf for a normal
reference), and accept numpy arrays elementwise.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import scipy.stats


def _usable(p) -> bool:
  return p is not None and math.isfinite(p)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
  """Holm's adjusted p-values, in the input order.

  With the m known p-values sorted, p_(1) ≤ … ≤ p_(m), the adjusted value of the i-th is
  max_{j ≤ i} min(1, (m − j + 1) p_(j)): the smallest family-wise level at which the step-down
  procedure (compare p_(1) with α/m, then p_(2) with α/(m − 1), …, stop at the first that fails)
  rejects it. The running maximum makes them monotone in p. None and NaN entries (a finding not
  measured) come back as None and are not counted in m."""
  known = [i for i, p in enumerate(p_values) if _usable(p)]
  for i in known:
    if not 0.0 <= p_values[i] <= 1.0:
      raise ValueError(f"p-value {p_values[i]!r} at {i} is not in [0, 1]")
  out: list[float | None] = [None] * len(p_values)
  m = len(known)
  running = 0.0
  for rank, i in enumerate(sorted(known, key=lambda i: p_values[i])):
    running = max(running, min(1.0, (m - rank) * float(p_values[i])))
    out[i] = running
  return out


def _out(x):
  x = np.asarray(x, float)
  return float(x) if x.ndim == 0 else x


def two_sided_p(mean, se, df):
  """P(|T_df| ≥ |mean / se|): the t test of effect = 0."""
  t = np.asarray(mean, float) / np.asarray(se, float)
  return _out(2.0 * scipy.stats.t.sf(np.abs(t), df))


def tost_p(mean, se, df, margin):
  """The TOST p for H0: |effect| ≥ margin against H1: |effect| < margin (margin > 0).

  max(P(T_df ≥ (mean + margin) / se), P(T_df ≤ (mean − margin) / se)): the first tests
  effect ≤ −margin, the second effect ≥ +margin; equivalence is shown at level α when both
  reject, i.e. when the 1 − 2α interval lies inside (−margin, margin)."""
  if np.any(np.asarray(margin, float) <= 0):
    raise ValueError(f"margin {margin!r} must be positive")
  mean, se = np.asarray(mean, float), np.asarray(se, float)
  if np.any(se <= 0):
    raise ValueError("standard error must be positive")
  below = scipy.stats.t.sf((mean + margin) / se, df)   # H0: effect ≤ −margin
  above = scipy.stats.t.cdf((mean - margin) / se, df)  # H0: effect ≥ +margin
  return _out(np.maximum(below, above))


def smallest_attainable_p(n: int, zeros: int = 0) -> float:
  """The smallest two-sided p of the exact sign-flip permutation test of a mean over n paired
  differences, `zeros` of them exactly 0: the observed pattern and its mirror, times the 2^zeros
  patterns that flip a zero, out of 2^n: min(1, 2^(zeros + 1) / 2^n)."""
  if n < 0 or not 0 <= zeros <= n:
    raise ValueError(f"n = {n!r}, zeros = {zeros!r}: need 0 ≤ zeros ≤ n")
  return min(1.0, 2.0 ** (zeros + 1 - n))
