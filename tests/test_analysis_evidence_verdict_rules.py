"""Verdicts over seeds: each rule can fail (reproduced, negligible, refuted by direction or by
TOST inside the margin, inconclusive, untestable), the error rate of 'reproduced' under the null
is what the t test promises, and Holm's adjustment over a page decides, for the difference tests
and for the TOST family (an unadjusted TOST family fails here), with labels that follow each
row's own TOST p whatever its place in the ranking."""
import dataclasses

import numpy as np
import pytest
import scipy.stats

from hybrid_nope.analysis.evidence import flip_counts, multiplicity, two_level, verdict_rules


def verdict(values, sign=1, margin=None):
  return verdict_rules.Verdict("claim", "stat", "null", list(values), sign=sign, margin=margin)


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
  verdict_rules.adjust(page)
  assert lone.verdict == "reproduced" and page[0].p_adjusted > 0.05
  assert page[0].verdict == "inconclusive" and "Holm p" in page[0].note


def test_an_exact_p_replaces_the_t_tests():
  v = verdict_rules.Verdict("c", "s", "n", [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.1], p_exact=0.5)
  assert v.p == 0.5 and v.verdict == "inconclusive" and "exact permutation" in v.note


def test_an_invalid_test_decides_nothing_whatever_its_outcome_and_keeps_its_holm_place():
  """A failed validity check (a control that is not neutral) overrides every outcome: a clear
  effect either way and an equivalence alike read "invalid" with the reason; its p still takes
  its place in Holm, so the other rows are adjusted as if it had counted."""
  reason = "the matched control is not neutral"
  for values in ([0.3, 0.31, 0.29, 0.3], [-0.3, -0.31, -0.29, -0.3], [0.001, -0.001, 0.0, 0.0005]):
    valid = verdict(values)
    valid.margin = 0.05
    invalid = dataclasses.replace(valid, invalid=reason)
    assert valid.verdict != "invalid"
    assert invalid.verdict == "invalid" and invalid.note.startswith(f"invalid test: {reason}")
  other = verdict([0.1, 0.12, 0.09, 0.11, 0.1])
  alone = dataclasses.replace(other)
  verdict_rules.adjust([alone])
  weaker = dataclasses.replace(verdict([0.3, 0.1, 0.4, 0.25]), invalid=reason)
  assert weaker.p > other.p
  verdict_rules.adjust([other, weaker])
  assert other.p_adjusted > alone.p_adjusted


def test_smallest_attainable_p_is_the_sign_flip_tests_own():
  assert verdict_rules.smallest_attainable_p(5) == 2 / 32 == 0.0625
  assert verdict_rules.smallest_attainable_p(6) == 2 / 64
  assert verdict_rules.smallest_attainable_p(1) == verdict_rules.smallest_attainable_p(0) == 1.0
  for n, zeros in ((3, 0), (5, 0), (6, 0), (6, 1), (7, 2)):
    d = [0.0] * zeros + [0.1 * (k + 1) for k in range(n - zeros)]  # all one sign: as far as it goes
    assert flip_counts.sign_flip_p(d)["p_two_sided"] == pytest.approx(
        verdict_rules.smallest_attainable_p(n, zeros))
  with pytest.raises(ValueError):
    verdict_rules.smallest_attainable_p(3, zeros=4)


def test_an_exact_test_that_cannot_reach_its_level_is_untestable_not_inconclusive():
  """Five seeds all one way: the sign-flip p is 2/32 = 0.0625, the smallest it can be, above 5%:
  no outcome could have reproduced it. Six seeds can reach 0.031 alone, but not the Holm step of
  a page of ten (0.005); where the other p-values are all below it, its step is α again."""
  five = verdict_rules.Verdict("c", "s", "n", [0.3, 0.2, 0.4, 0.1, 0.5], p_exact=0.0625)
  assert five.smallest_p == 0.0625 and five.verdict == "untestable"
  assert five.note == ("untestable at 5 seeds: the smallest attainable p is 0.0625 against "
                       "level 0.05")
  assert five.row()["smallest_p"] == 0.0625 and five.row()["level"] == 0.05
  six = verdict_rules.Verdict("c", "s", "n", [0.3, 0.2, 0.4, 0.1, 0.5, 0.2], p_exact=1 / 32)
  assert six.verdict == "reproduced"
  page = [six] + [verdict([0.1, -0.1, 0.05, -0.05, 0.0]) for _ in range(9)]
  verdict_rules.adjust(page)
  assert six.level == pytest.approx(0.005) and six.verdict == "untestable"
  assert "untestable at 6 seeds" in six.note and "level 0.005 (its Holm step" in six.note
  strong = [verdict([1.0, 1.1, 0.9, 1.05, 0.95]) for _ in range(9)]  # p ≈ 1e-6 each
  verdict_rules.adjust([six] + strong)
  assert six.level == pytest.approx(0.05) and six.verdict == "reproduced"
  # A zero difference flips to itself: six seeds with one tie reach only 2/32.
  tie = verdict_rules.Verdict("c", "s", "n", [0.3, 0.2, 0.4, 0.1, 0.5, 0.0], p_exact=1 / 16)
  assert tie.smallest_p == 0.0625 and tie.verdict == "untestable"
  # t tests attain any p: never untestable.
  assert verdict([0.3, 0.2]).smallest_p is None


def _row(mean, se, margin, df=4.0):
  est = two_level.Estimate(mean=mean, se=se, se_seed=se, se_doc=0.0, df=df, seeds=5,
                           documents=63)
  return verdict_rules.Verdict("claim", "stat", "null", [mean] * 5, margin=margin, estimate=est)


def _family_around(mean, se, m=10, tost_p=0.0053, df=4.0):
  """Two nearly identical significant rows whose raw TOST p sits at `tost_p` (between α/m and
  α/(m − 1)), ranked first and second in a TOST family of m, the rest far outside their margins."""
  margin = mean + scipy.stats.t.isf(tost_p, df) * se
  a, b = _row(mean, se, margin, df), _row(mean * 1.0005, se, margin, df)
  rest = [_row(0.05 + 0.01 * k, 0.005, 0.01) for k in range(m - 2)]
  return a, b, [a, b] + rest


def test_tost_is_holm_adjusted_over_the_page_and_decides():
  """Alone, a raw TOST p of 0.0053 puts the effect inside the margin (negligible); in a family
  of ten TOST rows Holm holds it to 0.005: reproduced. A TOST family left unadjusted labels it
  negligible and fails here; so does a non-significant row 'refuted' by an unadjusted TOST."""
  a, _, family = _family_around(0.0170, 0.0012)
  assert a.p_tost == pytest.approx(0.0053) and a.verdict == "negligible"
  verdict_rules.adjust(family)
  assert [v.p_tost_adjusted for v in family] == pytest.approx(
      multiplicity.holm([v.p_tost for v in family]))
  assert a.p_tost_adjusted > 0.05 and a.verdict == "reproduced"
  assert a.tost_level == pytest.approx(0.05 * a.p_tost / a.p_tost_adjusted)
  quiet = _row(0.001, 0.004, 0.001 + scipy.stats.t.isf(0.0053, 4) * 0.004)
  assert quiet.verdict == "refuted"
  verdict_rules.adjust([quiet] + family[1:])
  assert quiet.verdict == "inconclusive"


def test_nearly_identical_rows_in_one_family_get_the_same_label():
  """Holm's running maximum: the row ranked first is held to α/m, the one beside it to
  α/(m − 1); a raw TOST p between the two (0.0053 in a family of 10) would label the first
  reproduced and the second negligible by rank alone. Both get the first's adjusted p."""
  a, b, family = _family_around(0.0170, 0.0012)
  verdict_rules.adjust(family)
  assert a.p_tost < b.p_tost < 0.05 / 9  # ranked 1 and 2; the second alone would pass its step
  assert a.p_tost_adjusted == b.p_tost_adjusted
  assert a.verdict == b.verdict == "reproduced"
  # Inside, the note prints the interval that decides, at the row's Holm level.
  a2, b2, family2 = _family_around(0.0170, 0.0012, tost_p=0.001)
  verdict_rules.adjust(family2)
  assert a2.verdict == b2.verdict == "negligible"
  lo, hi = a2.equivalence_interval
  assert -a2.margin < lo and hi < a2.margin and "interval" in a2.note


def test_labels_follow_each_rows_own_tost_p_on_random_pages():
  """Over random pages: a significant row more clearly inside its margin (smaller raw TOST p) is
  never 'reproduced' while one less clearly inside is 'negligible'."""
  rng = np.random.default_rng(5)
  for _ in range(100):
    m = int(rng.integers(3, 25))
    family = [_row(float(rng.uniform(0.005, 0.03)), float(rng.uniform(0.0005, 0.002)),
                   float(rng.uniform(0.01, 0.05)), df=float(rng.uniform(2, 30)))
              for _ in range(m)]
    verdict_rules.adjust(family)
    sig = [(v.p_tost, v.verdict) for v in family]
    sig = [(p, label) for p, label in sig if label in ("reproduced", "negligible")]
    least_inside = max((p for p, label in sig if label == "negligible"), default=-1.0)
    assert all(label == "negligible" for p, label in sig if p <= least_inside)


def test_a_statistic_of_the_probe_alone_says_documents_decide_it():
  data = [0.1, 0.2, 0.15, 0.12, 0.3, 0.05, 0.2, 0.1]
  est = two_level.across_documents(np.array([0.01] + [0.01 + d for d in data]), seeds=5)
  v = verdict_rules.Verdict("data", "s", "n", [0.01] * 5, estimate=est)
  assert v.levels == "document" and v.df == 7 and v.verdict == "inconclusive"
  assert "more documents" in v.note and "seeds would decide" not in v.note


def test_a_satterthwaite_df_is_a_float_on_the_page():
  est = two_level.Estimate(mean=0.02, se=0.004, se_seed=0.003, se_doc=0.002, df=4.734,
                           seeds=3, documents=63)
  v = verdict_rules.Verdict("c", "s", "n", [0.02] * 3, estimate=est)
  assert v.critical == pytest.approx(scipy.stats.t.ppf(0.975, 4.734))
  assert "on 4.7 df" in v.note


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
  assert verdict_rules.paired({0: 1.0, 1: 2.0, 2: 3.0}, {1: 0.5, 2: 1.0, 3: 9.0}) == [1.5, 2.0]


def test_clustered_correlation_does_not_count_seeds_as_independent_configs():
  """Two configs, many seeds each, and a correlation that lives only between configs: with
  configs resampled whole, the interval is wide (3 configs minimum, else undefined)."""
  rng = np.random.default_rng(1)
  assert verdict_rules.clustered_correlation([[1, 2]], [[1, 2]])["r"] is None
  xs = [rng.normal(m, 0.01, 10) for m in (0.0, 1.0, 2.0)]
  ys = [rng.normal(m, 0.01, 10) for m in (0.0, 1.0, 2.0)]
  c = verdict_rules.clustered_correlation(xs, ys, resamples=500)
  assert c["r"] > 0.99 and c["groups"] == 3 and c["points"] == 30
  # Within configs x and y are independent: with only the between-config signal gone
  # (all configs at one mean) the correlation vanishes.
  xs0 = [rng.normal(0, 1, 10) for _ in range(6)]
  ys0 = [rng.normal(0, 1, 10) for _ in range(6)]
  c0 = verdict_rules.clustered_correlation(xs0, ys0, resamples=500)
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
