"""Tests for hybrid_nope.data.repetition: the data's own P(t_i = t_{i-d}) and its monotonicity
rule, on synthetic token streams made here."""
import numpy as np
import pytest

from hybrid_nope.data import repetition


def _markov(docs=40, length=600, stay=0.6, vocab=50, seed=0):
  """A token repeats the previous one with probability `stay`, else is uniform: P(t_i = t_{i-d})
  = stay^d + (1 - stay^d) / vocab, strictly decreasing in d."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(docs):
    t = rng.integers(0, vocab, length)
    keep = rng.random(length) < stay
    for i in range(1, length):
      if keep[i]:
        t[i] = t[i - 1]
    out.append(t)
  return out


def _spelled(docs=40, period=8, vocab=50, seed=0):
  """Periodic spelling: a word of `period` tokens repeated, so lag `period` always repeats."""
  rng = np.random.default_rng(seed)
  return [np.tile(rng.integers(0, vocab, period), 60) for _ in range(docs)]


def test_the_profile_counts_pairs_inside_documents_only():
  docs = [np.array([1, 1, 2, 1]), np.array([5])]
  profile = repetition.repetition_profile(docs, lags=(1, 2, 3, 4))
  np.testing.assert_allclose(profile[:3], [1 / 3, 1 / 2, 1.0])
  assert np.isnan(profile[3])  # No document is longer than 4 tokens.
  matches, pairs = repetition.repetition_counts(docs, lags=(1, 2, 3, 4))
  assert pairs.tolist() == [[3, 2, 1, 0], [0, 0, 0, 0]] and matches[0].tolist() == [1, 1, 1, 0]
  # Two documents concatenated would pair across their boundary; here they never do.
  assert repetition.repetition_profile([np.array([7, 8]), np.array([8, 7])], (1,))[0] == 0


def test_a_decaying_source_is_monotone_within_noise_and_matches_its_formula():
  docs = _markov()
  lags = repetition.LAGS
  profile = repetition.repetition_profile(docs, lags)
  want = [0.6**d + (1 - 0.6**d) / 50 for d in lags]
  np.testing.assert_allclose(profile, want, atol=0.01)
  assert repetition.is_monotone(docs, lags)  # The far lags are flat at 1/50: noise, not a rise.
  diff, se = repetition.rises(docs, lags)
  assert np.all(se > 0) and np.any(diff[-4:] > 0)  # Some sampled rises; all inside 3 se.


def test_periodic_spelling_is_not_monotone():
  docs = _spelled()
  assert not repetition.is_monotone(docs)  # Lag 8 repeats every token, lags 1..4 rarely.
  profile = repetition.repetition_profile(docs)
  assert profile[3] == 1.0 and profile[0] < 0.1
  # Mixed into a decaying source it still shows: the rule is about the rises, not the levels.
  assert not repetition.is_monotone(_markov(stay=0.3) + docs)


def test_the_report_and_its_summary_say_the_verdict_and_the_rule():
  report = repetition.report(_spelled(), lags=(1, 2, 4, 8))
  assert report["lags"] == [1, 2, 4, 8] and report["monotone"] is False
  assert len(report["profile"]) == 4 and len(report["rises"]) == 3
  assert "3 x its paired per-document standard error" in report["rule"]
  text = repetition.summary({"path": "somewhere", "split": "eval", **report})
  assert "NOT monotone" in text and "8:1.0000" in text and "into lag 8" in text


def test_lags_must_be_increasing_positive_ints():
  with pytest.raises(ValueError, match="increasing positive ints"):
    repetition.repetition_profile([np.arange(10)], lags=(2, 1))
  with pytest.raises(ValueError, match="increasing positive ints"):
    repetition.repetition_profile([np.arange(10)], lags=(0,))


def test_rises_of_counts_is_the_rule_on_documents():
  """The results page applies the rule to the probe's per-document counts: the same numbers."""
  from hybrid_nope.data import repetition
  rng = np.random.default_rng(5)
  docs = [rng.integers(0, 6, size=n) for n in (40, 90, 300, 700)]
  lags = (1, 2, 4, 8, 16)
  direct = repetition.rises(docs, lags)
  counted = repetition.rises_of_counts(*repetition.repetition_counts(docs, lags))
  np.testing.assert_allclose(counted, direct)
  assert repetition.monotone_rises(*counted) == repetition.is_monotone(docs, lags)
  assert not repetition.monotone_rises([0.1, -0.2], [0.01, 0.01])
  assert repetition.monotone_rises([0.02, -0.2], [0.01, 0.01])
