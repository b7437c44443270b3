"""Holm and TOST (analysis/evidence/multiplicity.py): a hand-worked Holm family, an independent
step-down implementation, the family-wise error rate by simulation (with a wrong-multiplier
mutant that fails it), TOST's size at the margin and power inside it, and the smallest p an exact
sign-flip test can attain."""
import numpy as np
import pytest
import scipy.stats

from hybrid_nope.analysis.evidence import multiplicity

HAND_P = [0.01, 0.04, 0.03, 0.005]
# Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → running max 0.06.
HAND_HOLM = [0.03, 0.06, 0.06, 0.02]


def rank_multiplier_mutant(p):
  """A wrong Holm: sorted p × its rank (1, 2, …), the step-up multiplier turned around."""
  order = np.argsort(p)
  out = np.empty(len(p))
  out[order] = np.minimum(1, np.asarray(p)[order] * np.arange(1, len(p) + 1))
  return list(out)


def unmonotone_mutant(p):
  """Holm's multipliers without the running maximum."""
  order = np.argsort(p)
  out = np.empty(len(p))
  out[order] = np.minimum(1, np.asarray(p)[order] * np.arange(len(p), 0, -1))
  return list(out)


def step_down_rejections(p, alpha):
  """Holm as a procedure, not a formula: walk the sorted p, reject while p_(k) ≤ α/(m − k)."""
  rejected = set()
  for k, i in enumerate(sorted(range(len(p)), key=lambda i: p[i])):
    if p[i] > alpha / (len(p) - k):
      break
    rejected.add(i)
  return rejected


def test_holm_on_the_hand_worked_family():
  assert multiplicity.holm(HAND_P) == pytest.approx(HAND_HOLM)


@pytest.mark.parametrize("mutant", [rank_multiplier_mutant, unmonotone_mutant])
def test_the_hand_example_catches_a_wrong_holm(mutant):
  assert mutant(HAND_P) != pytest.approx(HAND_HOLM)


def test_holm_agrees_with_the_step_down_procedure_at_every_level():
  rng = np.random.default_rng(0)
  for _ in range(200):
    m = int(rng.integers(1, 12))
    p = list(rng.uniform(size=m) ** rng.uniform(0.3, 3))
    adjusted = multiplicity.holm(p)
    for alpha in (0.001, 0.01, 0.05, 0.1, 0.2, 0.5):
      assert {i for i, a in enumerate(adjusted) if a <= alpha} == step_down_rejections(p, alpha)
    assert all(0 <= a <= 1 for a in adjusted)
    order = np.argsort(p)
    assert np.all(np.diff(np.asarray(adjusted)[order]) >= 0)  # monotone in p


def test_unknown_entries_pass_through_and_do_not_count():
  got = multiplicity.holm([0.01, None, float("nan"), 0.04])
  assert got[1] is None and got[2] is None
  assert got[0] == pytest.approx(0.02) and got[3] == pytest.approx(0.04)  # m = 2, not 4
  assert multiplicity.holm([]) == []
  assert multiplicity.holm([0.3]) == [0.3]
  assert multiplicity.holm([0.6, 0.7]) == [1.0, 1.0]  # capped
  with pytest.raises(ValueError):
    multiplicity.holm([0.1, 1.5])


def test_family_wise_error_rate_of_twenty_true_nulls():
  """2000 families of 20 uniform p-values: Holm rejects any at 5% in at most 5% (+3 MC SEs) of
  them; reading each at 5% rejects some in ~64%; the rank-multiplier mutant does no better."""
  rng = np.random.default_rng(1)
  families, m, alpha = 2000, 20, 0.05
  p = rng.uniform(size=(families, m))
  slack = 3 * np.sqrt(alpha * (1 - alpha) / families)
  holm_any = np.mean([min(multiplicity.holm(list(row))) <= alpha for row in p])
  raw_any = np.mean(p.min(axis=1) <= alpha)
  mutant_any = np.mean([min(rank_multiplier_mutant(row)) <= alpha for row in p])
  assert holm_any <= alpha + slack
  assert raw_any >= 0.5
  assert mutant_any > alpha + slack


def test_two_sided_p_is_the_t_test():
  x = np.array([0.3, 0.1, 0.5, 0.2, 0.4])
  se = x.std(ddof=1) / np.sqrt(5)
  assert multiplicity.two_sided_p(x.mean(), se, 4) == pytest.approx(
      scipy.stats.ttest_1samp(x, 0).pvalue)


def test_tost_is_the_larger_one_sided_p_and_its_interval_rule():
  mean, se, df, margin = 0.02, 0.03, 4, 0.1
  expected = max(scipy.stats.t.sf((mean + margin) / se, df),
                 scipy.stats.t.cdf((mean - margin) / se, df))
  assert multiplicity.tost_p(mean, se, df, margin) == pytest.approx(expected)
  # p ≤ α exactly when the 1 − 2α interval lies inside the margin.
  crit = scipy.stats.t.ppf(0.95, df)
  inside = abs(mean) + crit * se < margin
  assert (multiplicity.tost_p(mean, se, df, margin) <= 0.05) == inside
  assert multiplicity.tost_p(0.5, se, df, margin) > 0.5  # far outside: no equivalence
  with pytest.raises(ValueError):
    multiplicity.tost_p(mean, se, df, 0.0)


def _simulated_tost(true_effect, sd, n, margin, sims, rng, df=None):
  x = rng.normal(true_effect, sd, size=(sims, n))
  mean, se = x.mean(axis=1), x.std(axis=1, ddof=1) / np.sqrt(n)
  return multiplicity.tost_p(mean, se, n - 1 if df is None else df, margin)


def test_tost_size_at_the_margin_and_power_inside_it():
  """At |effect| = margin (either side) TOST claims equivalence in ≤ 5% (+MC slack); at effect 0
  with a small SE it claims it nearly always. A mutant on the normal instead of t with 5 seeds
  exceeds the size."""
  rng = np.random.default_rng(2)
  sims, alpha, n, margin = 4000, 0.05, 5, 0.1
  slack = 3 * np.sqrt(alpha * (1 - alpha) / sims)
  for effect in (margin, -margin):
    size = np.mean(_simulated_tost(effect, 0.05, n, margin, sims, rng) <= alpha)
    assert size <= alpha + slack
  normal_mutant = np.mean(_simulated_tost(margin, 0.05, n, margin, sims, rng, np.inf) <= alpha)
  assert normal_mutant > alpha + slack
  power = np.mean(_simulated_tost(0.0, 0.05, 20, margin, sims, rng) <= alpha)
  assert power >= 0.95


def test_smallest_attainable_p_of_the_sign_flip_test():
  """2^n equally likely sign patterns: the observed one and its mirror are the most extreme,
  2/2^n (5 seeds: 0.0625, above 5%); a zero difference flips to itself and doubles it."""
  assert multiplicity.smallest_attainable_p(5) == 0.0625
  assert multiplicity.smallest_attainable_p(6) == 0.03125 < 0.05
  assert multiplicity.smallest_attainable_p(6, zeros=1) == 0.0625
  assert multiplicity.smallest_attainable_p(1) == multiplicity.smallest_attainable_p(0) == 1.0
  with pytest.raises(ValueError):
    multiplicity.smallest_attainable_p(2, zeros=3)
