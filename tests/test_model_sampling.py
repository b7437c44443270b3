"""Greedy, temperature and nucleus (top-p) sampling against numpy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_nope.model import sampling


def reference_nucleus(logits: np.ndarray, top_p: float) -> set[int]:
  """The smallest set of most probable tokens whose probability reaches top_p (float64)."""
  p = np.exp(logits - logits.max())
  p /= p.sum()
  order = np.argsort(-p, kind="stable")
  size = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
  return set(order[:size].tolist())


def test_nucleus_mask_keeps_exactly_the_nucleus():
  rng = np.random.default_rng(0)
  logits = (rng.normal(size=(64, 11)) * rng.uniform(0.3, 4.0, size=(64, 1))).astype(np.float32)
  cases = []  # (row, top_p): random ones, and each midpoint between two cumulative sums.
  for row, values in enumerate(logits.astype(np.float64)):
    p = np.sort(np.exp(values - values.max()) / np.exp(values - values.max()).sum())[::-1]
    cumulative = np.cumsum(p)
    cases.append((row, float(rng.uniform(0.05, 1.0))))
    cases += [(row, float((a + b) / 2)) for a, b in zip(cumulative[:-1], cumulative[1:])
              if b - a > 1e-4]
  rows, top_ps = zip(*cases)  # One call: top_p may be given per row.
  masks = np.asarray(sampling.nucleus_mask(jnp.asarray(logits[list(rows)]),
                                           jnp.asarray(top_ps, jnp.float32)[:, None]))
  sizes = set()
  for mask, row, top_p in zip(masks, rows, top_ps):
    expected = reference_nucleus(logits[row].astype(np.float64), top_p)
    assert set(np.flatnonzero(mask).tolist()) == expected, (row, top_p)
    sizes.add(len(expected))
  assert sizes == set(range(1, 12))  # Every nucleus size was exercised.


def test_greedy_is_the_argmax_and_a_tiny_nucleus_is_greedy_at_any_temperature():
  logits = jax.random.normal(jax.random.key(1), (16, 50)) * 3
  argmax = np.argmax(np.asarray(logits), axis=-1)
  greedy = sampling.next_token(logits, jax.random.key(0), temperature=0.0, top_p=1.0)
  np.testing.assert_array_equal(greedy, argmax)
  for seed in range(3):
    tiny = sampling.next_token(logits, jax.random.key(seed), temperature=2.0, top_p=1e-6)
    np.testing.assert_array_equal(tiny, argmax)


def test_draws_follow_the_tempered_renormalised_nucleus():
  logits = jnp.asarray([[2.0, 1.5, 0.5, 0.0, -1.0]])
  temperature, top_p, draws = 0.7, 0.8, 20000
  tempered = np.asarray(logits[0], np.float64) / temperature
  kept = sorted(reference_nucleus(tempered, top_p))
  expected = np.zeros(5)
  expected[kept] = np.exp(tempered[kept] - tempered.max())
  expected /= expected.sum()
  batch = jnp.broadcast_to(logits, (draws, 5))
  tokens = np.asarray(sampling.next_token(batch, jax.random.key(0), temperature=temperature,
                                          top_p=top_p))
  frequencies = np.bincount(tokens, minlength=5) / draws
  assert set(np.flatnonzero(frequencies).tolist()) == set(kept)
  # Binomial standard error at 20000 draws is < 0.0036; 5 of them.
  np.testing.assert_allclose(frequencies, expected, atol=0.018)


@pytest.mark.parametrize("temperature, top_p, name", [
    (-0.5, 1.0, "temperature"), (float("nan"), 1.0, "temperature"),
    (float("inf"), 1.0, "temperature"), (1.0, 0.0, "top_p"), (1.0, 1.5, "top_p")])
def test_bad_settings_fail_by_name(temperature, top_p, name):
  with pytest.raises(sampling.SamplingError, match=name):
    sampling.check(temperature, top_p)
