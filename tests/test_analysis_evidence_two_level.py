"""Seed × document errors (analysis/evidence/two_level.py): the leave-one-document-out ratio
means against a direct recomputation, and the two-level SE's coverage by simulation under the
committed probe's real document sizes, where dropping either level undercovers."""

import numpy as np
import pytest
import scipy.stats

from hybrid_nope.analysis.evidence import two_level
from hybrid_nope.analysis.measure import records
from tests.helpers import committed_probe_counts



@pytest.fixture(scope="module")
def real_counts(tmp_path_factory):
  return committed_probe_counts(str(tmp_path_factory.mktemp("pack")))


def test_leave_one_out_is_the_ratio_mean_without_that_document():
  rng = np.random.default_rng(0)
  s, n = rng.normal(size=7), rng.integers(1, 9, size=7).astype(float)
  got = two_level.leave_one_out(s, n)
  assert got[0] == pytest.approx(s.sum() / n.sum())
  for c in range(7):
    keep = np.arange(7) != c
    assert got[1 + c] == pytest.approx(s[keep].sum() / n[keep].sum())


def test_replicates_gap_matches_the_records_gap():
  """The full-probe entry of Replicates.gap is the record's gap (one formula, two homes)."""
  rng = np.random.default_rng(1)
  lags, far = (1, 2, 4), 4
  counts = rng.integers(1, 30, size=(3, 12)).astype(float)
  sums = {"counts": counts, "0/input": counts * rng.uniform(0, 1, size=(3, 12))}
  rec = records.boundary_fields(sums, "0/input", lags, far)
  assert two_level.Replicates(sums, lags, far).gap("0/input")[0] == pytest.approx(rec["gap"])


def test_pure_seed_spread_gives_the_seed_se():
  reps = [np.full(10, v) for v in (0.1, 0.3, 0.2, 0.4)]
  est = two_level.combine(reps)
  assert est.se == pytest.approx(np.std([0.1, 0.3, 0.2, 0.4], ddof=1) / 2)
  assert est.se_doc == 0 and est.df == 3


def test_one_seed_or_a_non_finite_replicate_gives_none():
  assert two_level.combine([np.ones(5)]) is None
  assert two_level.combine([np.ones(5), np.array([1, 1, np.nan, 1, 1.0])]) is None


def _simulated_gaps(counts, rng, reps, seeds, sd_seed, sd_doc, sd_cell, sd_token=0.3):
  """Per-document cosine sums at lag 1 and the far lag for `reps` sweeps of `seeds` seeds on the
  probe's documents: level + seed effect + document effect + seed × document + pair noise. The
  target is the population gap 0.2 (over seeds and documents)."""
  n = np.moveaxis(counts, 0, -1)[None, None]                        # [1, 1, C, 2]
  c = counts.shape[1]
  level = np.array([0.3, 0.1])
  effect = (rng.normal(0, sd_seed, (reps, seeds, 1, 2)) + rng.normal(0, sd_doc, (reps, 1, c, 2))
            + rng.normal(0, sd_cell, (reps, seeds, c, 2)))
  sums = n * (level + effect) + np.sqrt(n) * sd_token * rng.normal(size=(reps, seeds, c, 2))
  return sums, 0.2


def _coverage(counts, se_of, **levels):
  rng = np.random.default_rng(0)
  sums, target = _simulated_gaps(counts, rng, reps=300, seeds=5, **levels)
  hits = []
  for sweep_sums in sums:
    est = two_level.combine([two_level.leave_one_out(s[:, 0], counts[0])
                             - two_level.leave_one_out(s[:, 1], counts[1]) for s in sweep_sums])
    half = scipy.stats.t.ppf(0.975, est.df) * se_of(est)
    hits.append(abs(est.mean - target) <= half)
  return float(np.mean(hits))


SCENARIOS = {"seeds only": dict(sd_seed=0.02, sd_doc=0.0, sd_cell=0.0),
             "documents dominate": dict(sd_seed=0.003, sd_doc=0.03, sd_cell=0.01),
             "both levels": dict(sd_seed=0.015, sd_doc=0.03, sd_cell=0.01)}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_two_level_interval_covers_under_the_real_document_sizes(real_counts, scenario):
  # 300 sweeps: the MC SE of a 95% coverage is 0.013. The floor at the larger one-way variance
  # and df = seeds − 1 make it conservative where documents dominate (≈ 0.98).
  coverage = _coverage(real_counts, lambda e: e.se, **SCENARIOS[scenario])
  assert 0.92 <= coverage <= 0.995, coverage


def test_mutant_without_the_document_level_undercovers(real_counts):
  """The seed SE alone (today's page) misses the shared documents' sampling."""
  assert _coverage(real_counts, lambda e: e.se_seed, **SCENARIOS["documents dominate"]) < 0.8


def test_mutant_without_the_seed_level_undercovers(real_counts):
  assert _coverage(real_counts, lambda e: e.se_doc, **SCENARIOS["seeds only"]) < 0.8
