"""Welch's t against the init null (analysis/evidence/seed_stats.py): exactly scipy's unequal-
variance t test on raw samples, and its size when training widens the seeds' spread 3× beyond the
null's, where the replaced z against the null SD alone over-rejects."""
import os

import numpy as np
import pytest
import scipy.stats

from hybrid_nope import sweep
from hybrid_nope.analysis.evidence import run_files, seed_stats
from hybrid_nope.run.reader import open_readonly


def test_welch_is_scipys_unequal_variance_t_test_on_the_raw_samples():
  rng = np.random.default_rng(0)
  for n, k in ((5, 10), (3, 4), (8, 2), (2, 30)):
    trained = rng.normal(0.3, 0.2, n)
    null = rng.normal(0.25, 0.05, k)
    got = seed_stats.welch(list(trained), null.mean(), null.std(ddof=1), k)
    ref = scipy.stats.ttest_ind(trained, null, equal_var=False)
    assert got["t"] == pytest.approx(ref.statistic, rel=1e-12)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert got["df"] == pytest.approx(ref.df, rel=1e-12)


def test_welch_skips_unknown_seeds_and_is_none_without_a_spread():
  full = seed_stats.welch([0.1, 0.2, 0.4], 0.0, 0.1, 10)
  assert seed_stats.welch([0.1, None, 0.2, float("nan"), 0.4], 0.0, 0.1, 10) == full
  assert seed_stats.welch([0.1], 0.0, 0.1, 10)["t"] is None
  assert seed_stats.welch([0.1, 0.2], 0.0, 0.1, 1)["t"] is None
  assert seed_stats.welch([0.1, 0.1], 0.0, 0.0, 10)["t"] is None
  assert seed_stats.welch([0.1, 0.1], 0.0, None, 10)["t"] is None


def test_welch_vs_null_reads_the_draws_init_null_stores():
  null = {"mean": 0.0, "sd": 0.1, "draws": 10}
  assert seed_stats.welch_vs_null([0.1, 0.2, 0.4], null) == seed_stats.welch(
      [0.1, 0.2, 0.4], 0.0, 0.1, 10)
  assert seed_stats.welch_vs_null([0.1, 0.2], None)["t"] is None
  assert seed_stats.welch_vs_null([0.1, 0.2], {"mean": 0.0, "sd": 0.1})["t"] is None


def test_a_committed_init_null_carries_its_number_of_initialisations(tmp_path):
  """init_null_T*.json's summary moments each say how many initialisations measured them."""
  pack = os.path.join(sweep.REPO, "docs/results/runs/nopeswa256/seed0.tar.gz")
  null = run_files.latest_init_null(open_readonly(sweep.unpack_records(pack, str(tmp_path))))
  assert null["gap"]["draws"] >= 2 and null["gap"]["sd"] > 0
  assert seed_stats.welch_vs_null([0.1, 0.12, 0.13], null["gap"])["df"] > 0


def test_coverage_when_trained_seeds_spread_three_times_the_null():
  """H0 true (trained mean = init mean), 5 trained seeds with SD 3× the null's, a null of 10
  initialisations: the old null_z rejects at |z| > 1.96 far more than 5%; welch stays at ≤ 5% + slack."""
  rng = np.random.default_rng(1)
  sims, n, k, alpha = 3000, 5, 10, 0.05
  trained = rng.normal(0.0, 3.0, (sims, n))
  null = rng.normal(0.0, 1.0, (sims, k))
  welch_rejects, z_rejects = 0, 0
  for x, y in zip(trained, null):
    moments = {"mean": y.mean(), "sd": y.std(ddof=1), "draws": k}
    welch_rejects += seed_stats.welch_vs_null(list(x), moments)["p"] <= alpha
    z = (x.mean() - moments["mean"]) / (moments["sd"] / np.sqrt(n))  # the old null_z
    z_rejects += abs(z) > scipy.stats.norm.ppf(0.975)
  slack = 3 * np.sqrt(alpha * (1 - alpha) / sims)
  assert welch_rejects / sims <= alpha + slack
  assert z_rejects / sims > 0.3  # the mutant: the null SD alone understates the error 3×
