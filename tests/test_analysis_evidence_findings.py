"""Verdicts over seeds: each rule can fail (reproduced, negligible, refuted by direction or by
TOST inside the margin, inconclusive), the error rate of 'reproduced' under the null is what the
t test promises, and Holm's adjustment over a page decides."""
import numpy as np
import pytest
import scipy.stats

from hybrid_nope.analysis.evidence import findings


def verdict(values, sign=1, margin=None):
  return findings.Verdict("claim", "stat", "null", list(values), sign=sign, margin=margin)


def test_mean_se_and_t_are_the_seed_level_ones():
  v = verdict([0.1, 0.3, 0.2, 0.4, 0.25])
  x = np.array(v.values)
  assert v.mean == pytest.approx(x.mean())
  assert v.se == pytest.approx(x.std(ddof=1) / np.sqrt(5))
  assert v.critical == pytest.approx(scipy.stats.t.ppf(0.975, 4))
  assert v.verdict == "reproduced"


def test_direction_decides_reproduced_against_refuted():
  values = [-0.1, -0.3, -0.2, -0.4, -0.25]
  assert verdict(values, sign=-1).verdict == "reproduced"
  assert verdict(values, sign=+1).verdict == "refuted"
  assert "opposite" in verdict(values, sign=+1).note


def test_refuted_with_power_only_when_tost_puts_the_effect_inside_the_margin():
  tight = [0.001, -0.002, 0.0005, 0.0015, -0.001]
  assert verdict(tight).verdict == "inconclusive"  # no margin named: no power claim
  assert verdict(tight, margin=0.05).verdict == "refuted"
  assert "TOST" in verdict(tight, margin=0.05).note
  assert verdict(tight, margin=0.001).verdict == "inconclusive"


def test_significant_but_inside_the_margin_is_negligible_not_reproduced():
  small = [0.0010, 0.0012, 0.0011, 0.0009, 0.0010]
  assert verdict(small).verdict == "reproduced"
  assert verdict(small, margin=0.01).verdict == "negligible"
  assert verdict(small, margin=0.0011).verdict == "reproduced"  # not wholly inside
  assert verdict([-x for x in small], margin=0.01).verdict == "negligible"  # either direction


def test_the_holm_adjusted_p_decides():
  values = [0.1, 0.3, 0.2, 0.4, 0.25]  # t ≈ 5.3 on 4 df: p ≈ 0.006
  lone = verdict(values)
  page = [verdict(values)] + [verdict([0.1, -0.1, 0.05, -0.05, 0.0]) for _ in range(19)]
  findings.adjust(page)
  assert lone.verdict == "reproduced" and page[0].p_adjusted > 0.05
  assert page[0].verdict == "inconclusive" and "Holm p" in page[0].note


def test_an_exact_p_replaces_the_t_tests():
  v = findings.Verdict("c", "s", "n", [0.1, 0.2, 0.3], p_exact=0.5)
  assert v.p == 0.5 and v.verdict == "inconclusive" and "exact permutation" in v.note


def test_too_few_seeds_is_inconclusive_and_nan_is_not_a_seed():
  assert verdict([0.5]).verdict == "inconclusive"
  v = verdict([0.1, float("nan"), 0.2, 0.15])
  assert v.n == 3 and v.verdict == "reproduced"


def test_false_reproduction_rate_under_the_null_is_about_two_and_a_half_percent():
  """Under no effect a one-directional 'reproduced' at 95% two-sided happens 2.5% of the time
  (binomial SE over 4000 draws: 0.25%)."""
  rng = np.random.default_rng(0)
  draws = rng.normal(0.0, 1.0, size=(4000, 5))
  rate = np.mean([verdict(d).verdict == "reproduced" for d in draws])
  assert abs(rate - 0.025) < 4 * np.sqrt(0.025 * 0.975 / 4000)


def test_paired_uses_common_seeds_only():
  assert findings.paired({0: 1.0, 1: 2.0, 2: 3.0}, {1: 0.5, 2: 1.0, 3: 9.0}) == [1.5, 2.0]


def test_clustered_correlation_does_not_count_seeds_as_independent_configs():
  """Two configs, many seeds each, and a correlation that lives only between configs: with
  configs resampled whole, the interval is wide (3 configs minimum, else undefined)."""
  rng = np.random.default_rng(1)
  assert findings.clustered_correlation([[1, 2]], [[1, 2]])["r"] is None
  xs = [rng.normal(m, 0.01, 10) for m in (0.0, 1.0, 2.0)]
  ys = [rng.normal(m, 0.01, 10) for m in (0.0, 1.0, 2.0)]
  c = findings.clustered_correlation(xs, ys, resamples=500)
  assert c["r"] > 0.99 and c["groups"] == 3 and c["points"] == 30
  # Within configs x and y are independent: with only the between-config signal gone
  # (all configs at one mean) the correlation vanishes.
  xs0 = [rng.normal(0, 1, 10) for _ in range(6)]
  ys0 = [rng.normal(0, 1, 10) for _ in range(6)]
  c0 = findings.clustered_correlation(xs0, ys0, resamples=500)
  assert c0["low"] < 0 < c0["high"]


def test_seeds_to_decide_is_the_first_n_at_which_the_t_test_would_pass():
  v = verdict([0.1, 0.5, -0.1, 0.3])  # mean 0.2, SD ≈ 0.258: t ≈ 1.55 on 3 df
  n = v.seeds_to_decide()
  sd = np.std(v.values, ddof=1)
  passes = lambda k: 0.2 / (sd / np.sqrt(k)) > scipy.stats.t.ppf(0.975, k - 1)
  assert v.verdict == "inconclusive" and passes(n) and not passes(n - 1)
  assert f"about {n} seeds" in v.note
  # On a page Holm multiplied this p (0.22) by 4: the seeds needed are those at α / 4.
  assert 4 * v.p < 1
  v.p_adjusted = 4 * v.p
  n_holm = v.seeds_to_decide()
  passes_holm = lambda k: 0.2 / (sd / np.sqrt(k)) > scipy.stats.t.ppf(1 - 0.05 / 8, k - 1)
  assert n_holm > n and passes_holm(n_holm) and not passes_holm(n_holm - 1)
  assert f"about {n_holm} seeds" in v.note
