"""Length extrapolation against recency, with the loss held fixed: configs as the units.

The paper asks whether configs whose global layers carry more recency extrapolate worse. Across
configs the loss and the extrapolation ratio move together (a better-trained model is also a
better extrapolator), so a raw correlation of ratio and gap can be a loss effect. The question
is the gap's coefficient in

  ratio_k(config) = a + b · gap(config) + c · eval_loss(config) + error,

one point per config (its seed means: seeds of one config are not independent evidence about
configs), with b's interval by a bootstrap that resamples whole configs. A factor k is the
evaluation length over the training length; ratio_k = loss at k× / loss at 1×.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

MIN_CONFIGS = 4  # Three coefficients need more than three points to leave any residual.

# A config fails to extrapolate at k× when its eval loss there is this much above its loss at
# the training length (the ratio); below it, the regression has no failure to explain.
FAILURE_RATIO = 1.05


def failing(regression: dict) -> list[str]:
  """The configs whose mean ratio at this factor reaches FAILURE_RATIO."""
  return [p["config"] for p in regression.get("points") or [] if p["ratio"] >= FAILURE_RATIO]


def has_failure(regression: dict) -> bool:
  """Whether any config's mean ratio at this factor reaches FAILURE_RATIO."""
  top = (regression.get("ratio_range") or [None, None])[1]
  return top is not None and top >= FAILURE_RATIO


def _coefficients(gap: np.ndarray, loss: np.ndarray, ratio: np.ndarray) -> np.ndarray | None:
  design = np.column_stack([np.ones_like(gap), gap, loss])
  if np.linalg.matrix_rank(design) < 3:
    return None
  return np.linalg.lstsq(design, ratio, rcond=None)[0]


def regression(points: Sequence[dict], resamples: int = 4000, seed: int = 0) -> dict:
  """points: one per config, {"config", "gap", "eval_loss", "ratio"} (seed means). The gap's
  slope with loss as a covariate, its config-bootstrap 95% interval, the partial correlation of
  ratio and gap given loss, and how far the ratios are from 1 (no failure to explain)."""
  pts = [p for p in points if all(np.isfinite(p.get(k, np.nan))
                                  for k in ("gap", "eval_loss", "ratio"))]
  out = {"configs": [p["config"] for p in pts], "n": len(pts), "slope": None, "low": None,
         "high": None, "partial_r": None, "ratio_range": None, "resamples": resamples,
         "points": [dict(p) for p in pts]}
  if len(pts) < MIN_CONFIGS:
    return out
  gap, loss, ratio = (np.asarray([p[k] for p in pts], float)
                      for k in ("gap", "eval_loss", "ratio"))
  coef = _coefficients(gap, loss, ratio)
  if coef is None:
    return out
  rng = np.random.default_rng(seed)
  boot = []
  for _ in range(resamples):
    i = rng.integers(0, len(pts), len(pts))
    c = _coefficients(gap[i], loss[i], ratio[i])
    if c is not None:
      boot.append(c[1])
  low, high = np.quantile(boot, [0.025, 0.975]) if boot else (np.nan, np.nan)

  def residual(y):
    design = np.column_stack([np.ones_like(loss), loss])
    return y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
  rg, rr = residual(gap), residual(ratio)
  partial = (float(np.corrcoef(rg, rr)[0, 1]) if rg.std() > 0 and rr.std() > 0 else None)
  out.update(slope=float(coef[1]), loss_slope=float(coef[2]), low=float(low), high=float(high),
             partial_r=partial, ratio_range=[float(ratio.min()), float(ratio.max())],
             bootstrap_draws=len(boot))
  return out


def decided(result: dict) -> str:
  """The reading: the slope's interval excludes 0 or not, and whether any config fails."""
  if result["slope"] is None:
    n = result["n"]
    return (f"undecided: {n} config{'' if n == 1 else 's'} with every number; the regression "
            f"needs {MIN_CONFIGS}")
  lo, hi = result["ratio_range"]
  fails = "" if hi > 1 else (" Every ratio is below 1: at this length no config fails to "
                             "extrapolate, so there is no failure to explain yet.")
  if result["low"] > 0 or result["high"] < 0:
    sign = "more" if result["slope"] > 0 else "less"
    return (f"decided: at fixed loss, configs with more recency lose {sign} at the longer "
            f"length (slope {result['slope']:+.3g}, 95% [{result['low']:+.3g}, "
            f"{result['high']:+.3g}]).{fails}")
  return (f"undecided: the slope's interval [{result['low']:+.3g}, {result['high']:+.3g}] holds "
          f"0 over {result['n']} configs.{fails}")
