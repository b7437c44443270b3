"""Statistics over the seeds of one configuration, and between configurations paired by seed.

A row of compare.py is the runs of one config that differ only in their seeds. Its numbers are
seed means ± seed-level standard errors; a difference between two rows is taken per seed (one
seed, one initialisation where shapes agree) and then averaged; a trained mean is set against
the empirical init null of a mean of as many fresh initialisations.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from hybrid_nope.analysis.checkpoint import init_null


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


def null_z(mean: float | None, null: dict | None, n: int) -> float | None:
  """z of a mean of n seeds against the init null of a mean of n independent initialisations
  (null SD / sqrt(n))."""
  if not null or not null.get("sd"):
    return None
  return init_null.zscore(mean, dict(null, sd=null["sd"] / math.sqrt(n)))


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
  return next((r for r in rows if r["pattern"] == "G" and r["n_seeds"] > 1), None)


