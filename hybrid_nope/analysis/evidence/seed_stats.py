"""Statistics over the seeds of one configuration, and between configurations paired by seed.

A row of compare.py is the runs of one config that differ only in their seeds. Its numbers are
seed means ± seed-level standard errors; a difference between two rows is taken per seed (one
seed, one initialisation where shapes agree) and then averaged; a trained mean is set against
the empirical init null by Welch's t (`welch`), carrying the trained seeds' spread and the null's
own sampling error (the number of initialisations is each null moment's "draws"); the z against
the null's SD alone it replaces understated the error where training widens the spread.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import scipy.stats

from hybrid_nope.model.kind_specs import has_local_mixer



def known(value) -> bool:
  """A number that was measured: not None, not NaN or ±inf."""
  return value is not None and math.isfinite(value)


def mean_se(values: Sequence[float | None]) -> tuple[float | None, float | None]:
  """Mean and standard error (std / sqrt(n), ddof 1) of the known values; SE None below 2."""
  measured = np.asarray([v for v in values if known(v)], float)
  if not len(measured):
    return None, None
  se = float(measured.std(ddof=1) / np.sqrt(len(measured))) if len(measured) > 1 else None
  return float(measured.mean()), se


PAIRED_KEYS = ("eval_loss", "gap", "floor", "logit_gap")


def paired_difference(row: dict, reference: dict, key: str) -> dict[str, Any]:
  """row − reference for `key`, paired by seed: the mean over the seeds both hold of the
  per-seed differences ± its standard error (ddof 1), and those seeds. Seeds pair runs whose
  shapes agree at init (one seed, one initialisation), so what they share cancels."""
  seeds = sorted(set(row["members_by_seed"]) & set(reference["members_by_seed"]))
  diffs = [row["members_by_seed"][s][key] - reference["members_by_seed"][s][key] for s in seeds
           if known(row["members_by_seed"][s].get(key))
           and known(reference["members_by_seed"][s].get(key))]
  mean, se = mean_se(diffs)
  return {"mean": mean, "se": se, "seeds": seeds, "n": len(diffs)}


def reference_row(rows: Sequence[dict]) -> dict | None:
  """The global-only baseline (pattern G) if there is one with several seeds, else None."""
  return next((r for r in rows if not has_local_mixer(r["pattern"]) and r["n_seeds"] > 1), None)


def welch(values: Sequence[float | None], null_mean: float, null_sd: float,
          null_n: int) -> dict[str, float | None]:
  """Welch's t of a trained seed mean against the empirical init null, carrying both spreads.

  The null is a sample of null_n fresh initialisations with mean null_mean and SD null_sd
  (ddof 1); the trained side, the n known seed values with mean m and SD s. H0: trained and
  initialised networks share a mean. t = (m − null_mean) / sqrt(s²/n + null_sd²/null_n) on the
  Welch–Satterthwaite df (s²/n + null_sd²/null_n)² / ((s²/n)²/(n − 1) + (null_sd²/null_n)²/
  (null_n − 1)); p two-sided. Unlike a z against the null SD alone, which scales the null SD to a mean of n and so
  assumes trained seeds spread as initialisations do, this does not understate the error when
  training widens (or narrows) the spread, nor treat the null's own mean as exact. Given the raw
  null sample's moments it is scipy.stats.ttest_ind(trained, null, equal_var=False).
  {t, df, p}, each None with fewer than 2 on either side or no spread at all."""
  measured = np.asarray([v for v in values if known(v)], float)
  n = len(measured)
  if n < 2 or null_n is None or null_n < 2 or not (known(null_mean) and known(null_sd)):
    return {"t": None, "df": None, "p": None}
  a, b = measured.var(ddof=1) / n, null_sd ** 2 / null_n
  if not a + b > 0:
    return {"t": None, "df": None, "p": None}
  t = (measured.mean() - null_mean) / math.sqrt(a + b)
  df = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / (null_n - 1))
  return {"t": float(t), "df": float(df), "p": float(2 * scipy.stats.t.sf(abs(t), df))}


def welch_vs_null(values: Sequence[float | None], null: dict | None) -> dict[str, float | None]:
  """`welch` against one statistic's init-null moments as init_null.measure stores them
  ({"mean", "sd", "draws"}: draws is the number of initialisations that measured it)."""
  if not null or null.get("sd") is None or null.get("draws") is None:
    return {"t": None, "df": None, "p": None}
  return welch(values, null["mean"], null["sd"], int(null["draws"]))
