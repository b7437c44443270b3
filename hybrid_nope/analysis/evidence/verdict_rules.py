"""The `Verdict` on one finding from a multi-seed sweep (docs/results.md): its kinds, margin,
equivalence test and the page's adjustment (`adjust`). Which findings there are, and their
statistics, are `exploratory_verdicts` and `finding_statistics` (`primary` for registered ones).

Every finding is one statistic per seed (a paired difference where two numbers share a seed:
two steps of one run, two configs started from one initialisation, two modules of one forward
pass). Its error has two levels where the statistic is built from the probe's per-document sums
(seed × document, `analysis.evidence.two_level`, Satterthwaite df), the document level alone for
a statistic of the probe itself (the data's recency: the same for every seed, df C − 1), else
the seed level alone (eval losses). Its test is Student's t on the error's degrees of freedom
against no effect (or the null named per finding), or an exact permutation test (`p_exact`),
and every p on a page is Holm-adjusted as one family (`adjust`). Each finding carries a margin,
the smallest effect the claim means, fixed by one rule before the data are read
(`MARGIN_FRACTION` of a named reference magnitude, written beside it), and an equivalence test
(TOST) against it, Holm-adjusted as the page's second family:

- reproduced: adjusted p < 0.05 in the claimed direction, and not inside the margin;
- negligible: adjusted p < 0.05, but TOST puts the effect wholly inside the margin;
- refuted: significant in the opposite direction (beyond the margin), or not significant and
  TOST inside the margin (an effect as large as the claim means would have been seen);
- inconclusive: none of these; the note says roughly how many seeds would decide it;
- untestable: an exact test whose smallest attainable p (a sign-flip over n seeds: 2/2^n,
  `multiplicity.smallest_attainable_p`) is not below the level it faces: α, or after `adjust`
  the Holm step that p would meet on the page (α/(m − k), k the family's p-values below it).
  No outcome of the sweep could have reproduced it; the note names n, that p and the level.
  (TOST inside the margin still refutes: it is a separate test, on the t scale.)
- invalid: the test's own validity check failed (`Verdict.invalid` says which and by how much:
  a control that moves the quantity it must leave alone), so no outcome decides the claim. Its
  p still counts in its Holm family: dropping it would loosen the other rows after the fact.

"Inside the margin" is one rule for every row of the TOST family: the row's (1 − 2α_k) interval
lies wholly inside ±margin, where α_k = α · p_tost / p_tost_holm is the level Holm's step-down
grants that row (α before `adjust`); that is exactly Holm-adjusted TOST p < α, and the note
prints the interval. Holm's adjusted p is a continuous, non-decreasing function of a row's own
raw p (the running maximum), so the label depends on the row's rank only through its own TOST
p: rows with equal (mean, SE, df, margin) get the same label wherever they stand in the family,
nearly equal ones differ only where α falls between their adjusted p-values, and a row more
clearly inside its margin is never labelled reproduced while a less clear one is negligible.
Equal effects with different margins or df are different TOST evidence and may differ (the
page's swa64 and nopeswa64 init rows, +0.0170 ± 0.0012 and +0.0175 ± 0.0011, have margins
±0.0271 and ±0.033: TOST t of 8.4 against 14.1).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
import scipy.stats

from hybrid_nope.analysis.evidence import multiplicity
from hybrid_nope.analysis.evidence.multiplicity import smallest_attainable_p  # noqa: F401

ALPHA = 0.05
# The margin rule, one for every finding: a tenth of what the local layers themselves do to the
# statistic's quantity (results_page names each reference).
MARGIN_FRACTION = 0.1


@dataclasses.dataclass
class Verdict:
  finding: str          # the published claim, in words
  statistic: str        # what is computed per seed
  null: str             # what it is tested against
  values: list          # one per seed
  sign: int = 1         # +1: the claim says the statistic is positive; −1: negative
  margin: float | None = None  # smallest effect the claim means (fixed before the data)
  margin_rule: str = ""        # where the margin comes from, in words
  estimate: object = None      # two_level.Estimate (mean, se, df) where documents are a level
  p_adjusted: float | None = None       # Holm over the page (`adjust`)
  p_tost_adjusted: float | None = None  # Holm over the page's equivalence tests
  p_exact: float | None = None  # an exact test's two-sided p (a permutation), in place of t's
  # The smallest p the exact test can give (default for p_exact: a sign-flip over the seeds,
  # `multiplicity.smallest_attainable_p`), and the level it faces (set by `adjust`; α before).
  p_attainable: float | None = None
  p_level: float | None = None
  invalid: str = ""  # why the test cannot decide (its validity check failed); "" when valid

  @property
  def n(self) -> int:
    return int(np.sum(np.isfinite(np.asarray(self.values, float))))

  def _known(self) -> np.ndarray:
    v = np.asarray(self.values, float)
    return v[np.isfinite(v)]

  @property
  def levels(self) -> str:
    return getattr(self.estimate, "levels", "seed × document") if self.estimate else "seed"

  @property
  def mean(self) -> float | None:
    if self.estimate is not None:
      return self.estimate.mean
    return float(self._known().mean()) if self.n else None

  @property
  def se(self) -> float | None:
    if self.estimate is not None:
      return self.estimate.se
    return float(self._known().std(ddof=1) / math.sqrt(self.n)) if self.n >= 2 else None

  @property
  def df(self) -> float | None:
    if self.estimate is not None:
      return self.estimate.df
    return float(self.n - 1) if self.n >= 2 else None

  @property
  def t(self) -> float | None:
    return self.mean / self.se if self.se else None

  @property
  def critical(self) -> float | None:
    return float(scipy.stats.t.ppf(1 - ALPHA / 2, self.df)) if self.df else None

  @property
  def interval(self) -> tuple[float, float] | None:
    if not self.se:
      return None
    return self.mean - self.critical * self.se, self.mean + self.critical * self.se

  @property
  def p(self) -> float | None:
    if self.p_exact is not None:
      return self.p_exact
    return multiplicity.two_sided_p(self.mean, self.se, self.df) if self.se else None

  @property
  def p_tost(self) -> float | None:
    if not self.se or self.margin is None or not self.margin > 0:
      return None
    return multiplicity.tost_p(self.mean, self.se, self.df, self.margin)

  @property
  def smallest_p(self) -> float | None:
    """The smallest p the difference test can give: `p_attainable`, else for an exact test the
    sign-flip permutation's over the seeds (zero differences flip to themselves); None for t."""
    if self.p_attainable is not None:
      return self.p_attainable
    if self.p_exact is None:
      return None
    return multiplicity.smallest_attainable_p(self.n, int(np.sum(self._known() == 0)))

  @property
  def level(self) -> float:
    """The level the smallest attainable p faces: its Holm step on the page (`adjust`), else α."""
    return self.p_level if self.p_level is not None else ALPHA

  @property
  def untestable(self) -> bool:
    return self.smallest_p is not None and self.smallest_p >= self.level

  @property
  def tost_level(self) -> float:
    """α_k: the one-sided level Holm's step-down grants this row's TOST (α before `adjust`)."""
    raw, adjusted = self.p_tost, self.p_tost_adjusted
    if raw is None or adjusted is None or not adjusted > raw:
      return ALPHA
    return ALPHA * raw / adjusted

  @property
  def equivalence_interval(self) -> tuple[float, float] | None:
    """The (1 − 2α_k) interval that decides "inside the margin" (module docstring)."""
    if not self.se or self.df is None:
      return None
    half = float(scipy.stats.t.ppf(1 - self.tost_level, self.df)) * self.se
    return self.mean - half, self.mean + half

  def _decides(self, adjusted, raw) -> float | None:
    return adjusted if adjusted is not None else raw

  @property
  def inside(self) -> bool:
    """TOST puts the effect wholly inside ±margin: Holm-adjusted TOST p < α, i.e. the
    (1 − 2α_k) `equivalence_interval` lies inside the margin."""
    p_eq = self._decides(self.p_tost_adjusted, self.p_tost)
    return p_eq is not None and p_eq < ALPHA

  @property
  def verdict(self) -> str:
    if self.invalid:
      return "invalid"
    inside = self.inside
    if self.untestable:
      return "refuted" if inside else "untestable"
    p = self._decides(self.p_adjusted, self.p)
    if p is None or not self.se > 0:
      return "inconclusive"
    if p < ALPHA:
      if inside:
        return "negligible"
      return "reproduced" if self.sign * self.mean > 0 else "refuted"
    return "refuted" if inside else "inconclusive"

  @property
  def note(self) -> str:
    v = self.verdict
    if v == "invalid":
      p = self._decides(self.p_adjusted, self.p)
      return f"invalid test: {self.invalid}" + (
          f" (as computed, t = {self.t:+.1f} on {_df_text(self.df)} df, Holm p {p:.2g})"
          if p is not None and self.se else "")
    if v == "untestable":
      step = " (its Holm step on this page)" if self.level < ALPHA else ""
      return (f"untestable at {self.n} seeds: the smallest attainable p is {self.smallest_p:.3g} "
              f"against level {self.level:.3g}{step}")
    if self.se is None:
      return f"{self.n} seed(s): no seed-level error"
    if not self.se > 0:
      return f"{self.n} seeds with identical values: no seed-level spread to test against"
    p = self._decides(self.p_adjusted, self.p)
    test = ("exact permutation" if self.p_exact is not None
            else f"t = {self.t:+.1f} on {_df_text(self.df)} df")
    where = f"{test}, Holm p {p:.2g}"
    if v in ("negligible", "refuted") and self.inside:
      lo, hi = self.equivalence_interval
      tost = (f"its {100 * (1 - 2 * self.tost_level):.4g}% interval [{lo:+.4f}, {hi:+.4f}] (TOST "
              f"at its Holm level) lies inside the margin ±{self.margin:.3g}")
    if v == "reproduced":
      return where
    if v == "negligible":
      return f"{where}, but wholly inside the margin: {tost}"
    if v == "refuted":
      if not self.inside:
        return f"significant in the opposite direction: {where}"
      return f"{where}; {tost}: an effect the claim means would have been seen"
    if self.levels == "document":
      return (f"{where}; a statistic of the probe alone: more seeds will not decide it, more "
              "documents would")
    if self.sign * self.mean > 0:
      needed = self.seeds_to_decide()
      return (f"{where}; at this mean and spread about "
              f"{needed if needed else 'more than 1000'} seeds would decide it (at its Holm "
              "level on this page)")
    return f"{where}, against the claim's direction but not significant"

  def seeds_to_decide(self, most: int = 1000) -> int | None:
    """The fewest seeds at which the observed mean and per-seed spread would pass the t test at
    this finding's Holm level: α times p / p_holm, the factor Holm's step-down applied to it on
    this page (α itself before `adjust`). The spread is the error's, scaled as if it were all
    at the seed level."""
    level = ALPHA
    if self.p_adjusted and self.p and self.p_adjusted > self.p:
      level = ALPHA * self.p / self.p_adjusted
    sd = self.se * math.sqrt(max(self.n, 2))
    for n in range(max(self.n, 2), most + 1):
      if abs(self.mean) / (sd / math.sqrt(n)) > scipy.stats.t.ppf(1 - level / 2, n - 1):
        return n
    return None

  def row(self) -> dict:
    return {"finding": self.finding, "statistic": self.statistic, "null": self.null,
            "n_seeds": self.n, "mean": self.mean, "se": self.se, "df": self.df,
            "levels": self.levels, "t": self.t, "p": self.p, "p_holm": self.p_adjusted,
            "margin": self.margin, "margin_rule": self.margin_rule, "p_tost": self.p_tost,
            "p_tost_holm": self.p_tost_adjusted, "smallest_p": self.smallest_p,
            "level": self.level if self.smallest_p is not None else None,
            "verdict": self.verdict, "note": self.note,
            "se_seed": getattr(self.estimate, "se_seed", None),
            "se_doc": getattr(self.estimate, "se_doc", None), "values": list(self.values)}


def adjust(verdicts: Sequence[Verdict]) -> None:
  """Holm over the page: the difference tests as one family, the equivalence tests as the
  second; each verdict then reads its adjusted p. An exact test's smallest attainable p gets
  the level Holm's step-down would hold it to had it come out: α/(m − k), with k the family's
  other p-values below it (`Verdict.untestable`)."""
  for raw, field in (([v.p for v in verdicts], "p_adjusted"),
                     ([v.p_tost for v in verdicts], "p_tost_adjusted")):
    for v, p in zip(verdicts, multiplicity.holm(raw)):
      setattr(v, field, p)
  ps = [v.p for v in verdicts]
  for i, v in enumerate(verdicts):
    smallest = v.smallest_p
    if smallest is None:
      continue
    others = [p for j, p in enumerate(ps) if j != i and p is not None and math.isfinite(p)]
    v.p_level = ALPHA / (len(others) + 1 - sum(p < smallest for p in others))


def _df_text(df: float) -> str:
  return f"{df:.0f}" if float(df).is_integer() else f"{df:.1f}"


def margin_of(reference: float | None) -> float | None:
  """The margin from its reference magnitude (None where the reference was not measured)."""
  if reference is None or not math.isfinite(reference):
    return None
  return MARGIN_FRACTION * abs(reference)


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
