"""Extrapolation against recency at fixed loss (analysis/evidence/extrapolation.py): the gap's
slope with loss as a covariate, on configs as units, where a raw correlation is a loss
confound."""
import numpy as np
import pytest

from hybrid_nope.analysis.evidence import extrapolation


def _points(gap_slope, rng, n=10):
  loss = rng.uniform(1.2, 1.6, n)
  gap = 0.2 + 0.5 * (loss - 1.4) + rng.normal(0, 0.02, n)  # gap tracks loss: a confound
  ratio = 0.8 + 0.1 * loss + gap_slope * gap + rng.normal(0, 0.002, n)
  return [{"config": f"c{i}", "gap": g, "eval_loss": l, "ratio": r}
          for i, (g, l, r) in enumerate(zip(gap, loss, ratio))]


def test_no_gap_effect_at_fixed_loss_though_raw_correlation_is_strong():
  pts = _points(0.0, np.random.default_rng(0))
  r = extrapolation.regression(pts, resamples=500)
  raw = np.corrcoef([p["gap"] for p in pts], [p["ratio"] for p in pts])[0, 1]
  assert raw > 0.7  # the mutant reading: a raw correlation would call it recency
  assert r["low"] < 0 < r["high"] and "undecided" in extrapolation.decided(r)


def test_a_real_gap_effect_is_found_with_its_sign():
  r = extrapolation.regression(_points(0.5, np.random.default_rng(1)), resamples=500)
  assert r["slope"] == pytest.approx(0.5, abs=0.2) and r["low"] > 0  # 10 configs: SE ~0.07
  assert "decided" in extrapolation.decided(r) and "more" in extrapolation.decided(r)


def test_too_few_configs_is_undecided_and_says_how_many():
  r = extrapolation.regression(_points(0.5, np.random.default_rng(2), n=3))
  assert r["slope"] is None and "needs 4" in extrapolation.decided(r)


def test_ratios_below_one_say_there_is_no_failure_to_explain():
  r = extrapolation.regression(_points(0.0, np.random.default_rng(3)), resamples=200)
  assert r["ratio_range"][1] < 1 and "no failure to explain" in extrapolation.decided(r)


def test_a_failure_to_extrapolate_is_a_ratio_at_the_threshold():
  from hybrid_nope.analysis.evidence import extrapolation as ex
  assert not ex.has_failure({"ratio_range": [0.9, ex.FAILURE_RATIO - 1e-9]})
  assert ex.has_failure({"ratio_range": [0.9, ex.FAILURE_RATIO]})
  assert not ex.has_failure({"ratio_range": None})


def test_failing_configs_are_those_at_or_above_the_failure_ratio():
  pts = _points(0.0, np.random.default_rng(4), n=6)
  pts[2]["ratio"], pts[4]["ratio"] = extrapolation.FAILURE_RATIO, extrapolation.FAILURE_RATIO - 1e-6
  r = extrapolation.regression(pts, resamples=50)
  assert extrapolation.failing(r) == ["c2"] and extrapolation.has_failure(r)
  assert [p["config"] for p in r["points"]] == [f"c{i}" for i in range(6)]
