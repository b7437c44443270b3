"""Verdicts on the published findings from a multi-seed sweep (docs/results.md).

Every finding is one statistic per seed (a paired difference where two numbers share a seed:
two steps of one run, two configs started from one initialisation, two modules of one forward
pass). Its verdict is a test over seeds: with n seeds, mean m and seed-level SE s,
t = m / s against Student's t with n − 1 degrees of freedom (the null: no effect, or the value a
fresh initialisation or a shuffled-token control gives, named per finding).

- reproduced: t beyond the two-sided 95% critical value in the claimed direction;
- refuted: beyond it in the opposite direction, or the 95% interval lies wholly below
  `min_effect` in the claimed direction (an effect that size would have been seen: power);
- inconclusive: neither; the note says roughly how many seeds would decide it at the observed
  mean and spread.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
import scipy.stats

CONFIDENCE = 0.95


@dataclasses.dataclass
class Verdict:
  finding: str          # the published claim, in words
  statistic: str        # what is computed per seed
  null: str             # what it is tested against
  values: list          # one per seed
  sign: int = 1         # +1: the claim says the statistic is positive; −1: negative
  min_effect: float | None = None  # smallest effect the claim means (for refuted-with-power)

  @property
  def n(self) -> int:
    return int(np.sum(np.isfinite(np.asarray(self.values, float))))

  def _known(self) -> np.ndarray:
    v = np.asarray(self.values, float)
    return v[np.isfinite(v)]

  @property
  def mean(self) -> float | None:
    return float(self._known().mean()) if self.n else None

  @property
  def se(self) -> float | None:
    return float(self._known().std(ddof=1) / math.sqrt(self.n)) if self.n >= 2 else None

  @property
  def t(self) -> float | None:
    return self.mean / self.se if self.se else None

  @property
  def critical(self) -> float | None:
    return float(scipy.stats.t.ppf(0.5 + CONFIDENCE / 2, self.n - 1)) if self.n >= 2 else None

  @property
  def interval(self) -> tuple[float, float] | None:
    if self.se is None:
      return None
    return self.mean - self.critical * self.se, self.mean + self.critical * self.se

  @property
  def verdict(self) -> str:
    if self.se is None or not self.se > 0:
      return "inconclusive"
    directed = self.sign * self.t
    if directed > self.critical:
      return "reproduced"
    if directed < -self.critical:
      return "refuted"
    lo, hi = self.interval
    upper = hi if self.sign > 0 else -lo  # the largest effect in the claimed direction allowed
    if self.min_effect is not None and upper < self.min_effect:
      return "refuted"
    return "inconclusive"

  @property
  def note(self) -> str:
    v = self.verdict
    if self.se is None:
      return f"{self.n} seed(s): no seed-level error"
    if not self.se > 0:
      return f"{self.n} seeds with identical values: no seed-level spread to test against"
    if v == "reproduced":
      return f"t = {self.t:+.1f} on {self.n - 1} df (critical {self.critical:.2f})"
    if v == "refuted":
      if self.sign * self.t < -self.critical:
        return (f"significant in the opposite direction: t = {self.t:+.1f} on {self.n - 1} "
                f"df")
      return (f"the 95% interval excludes effects ≥ {self.min_effect:.3g} in the claimed "
              f"direction (power to have seen one)")
    if self.sign * self.mean > 0:
      needed = self.seeds_to_decide()
      return (f"t = {self.t:+.1f} on {self.n - 1} df; at this mean and spread about "
              f"{needed if needed else 'more than 1000'} seeds would decide it")
    return (f"t = {self.t:+.1f} on {self.n - 1} df, against the claim's direction but not "
            f"significant; a minimal effect of interest would decide it")

  def seeds_to_decide(self, most: int = 1000) -> int | None:
    """The fewest seeds at which the observed mean and seed SD would pass the t test."""
    sd = self.se * math.sqrt(self.n)
    for n in range(max(self.n, 2), most + 1):
      if abs(self.mean) / (sd / math.sqrt(n)) > scipy.stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1):
        return n
    return None

  def row(self) -> dict:
    return {"finding": self.finding, "statistic": self.statistic, "null": self.null,
            "n_seeds": self.n, "mean": self.mean, "se": self.se, "t": self.t,
            "verdict": self.verdict, "note": self.note, "values": list(self.values)}


def paired(a: dict[int, float], b: dict[int, float]) -> list[float]:
  """a[s] − b[s] over the seeds both hold, in seed order."""
  return [a[s] - b[s] for s in sorted(set(a) & set(b))
          if a[s] is not None and b[s] is not None]


def clustered_correlation(x_by_group: Sequence[Sequence[float]],
                          y_by_group: Sequence[Sequence[float]],
                          resamples: int = 2000, seed: int = 0) -> dict:
  """Pearson r of x and y over all points, with a bootstrap CI that resamples whole groups
  (configs; each group's points are its seeds), so seeds of one config are not counted as
  independent evidence."""
  groups = [(np.asarray(x, float), np.asarray(y, float))
            for x, y in zip(x_by_group, y_by_group) if len(x)]
  if len(groups) < 3:  # Resampling fewer configs than 3 says nothing about configs.
    return {"r": None, "low": None, "high": None, "groups": len(groups),
            "points": int(sum(len(g[0]) for g in groups))}
  def r_of(gs):
    x = np.concatenate([g[0] for g in gs])
    y = np.concatenate([g[1] for g in gs])
    return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")
  rng = np.random.default_rng(seed)
  boot = [r_of([groups[i] for i in rng.integers(0, len(groups), len(groups))])
          for _ in range(resamples)]
  boot = np.asarray([b for b in boot if np.isfinite(b)])
  low, high = (np.quantile(boot, [0.025, 0.975]) if boot.size else (np.nan, np.nan))
  return {"r": r_of(groups), "low": float(low), "high": float(high), "groups": len(groups),
          "points": int(sum(len(g[0]) for g in groups))}
