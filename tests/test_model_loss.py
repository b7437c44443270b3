import jax
import numpy as np
import jax.numpy as jnp
import pytest

from hybrid_nope.model.loss import (cross_entropy_sums, objective_sums, sums_by_bucket,
                                    unigram_entropy, weighted_token_losses)


def test_cross_entropy_matches_numpy_and_respects_weights():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((2, 5, 7)).astype(np.float32)
  targets = rng.integers(0, 7, (2, 5))
  weights = np.ones((2, 5), np.float32)
  weights[0, 1] = weights[1, 4] = 0.0
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  loss_sum, weight_sum = cross_entropy_sums(jnp.asarray(logits), jnp.asarray(targets),
                                            jnp.asarray(weights))
  assert float(loss_sum) == pytest.approx(float((nll * weights).sum()), rel=1e-5)
  assert float(weight_sum) == weights.sum()
  # A masked position's logits do not matter at all.
  masked = np.argwhere(weights == 0)[0]
  logits[tuple(masked)] += 100.0
  again, _ = cross_entropy_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
  assert float(again) == float(loss_sum)


def test_unigram_entropy():
  targets = np.array([[0, 0, 1, 1, 2, 9]])
  weights = np.array([[1, 1, 1, 1, 0, 0]])
  assert unigram_entropy(targets, weights) == pytest.approx(np.log(2))
  assert unigram_entropy(np.array([[3, 3, 3]]), np.ones((1, 3))) == 0.0


def test_bucketed_sums_add_up_to_the_totals_and_split_by_position():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.standard_normal((3, 8, 5)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 5, (3, 8)))
  weights = jnp.asarray(rng.random((3, 8)) > 0.2, jnp.float32)
  buckets = np.arange(8) // 3  # buckets of 3 positions: [0,0,0,1,1,1,2,2]
  loss_b, weight_b = sums_by_bucket(*weighted_token_losses(logits, targets, weights),
                                    jnp.asarray(buckets), 3)
  total_loss, total_weight = cross_entropy_sums(logits, targets, weights)
  assert float(loss_b.sum()) == pytest.approx(float(total_loss), rel=1e-6)
  assert float(weight_b.sum()) == float(total_weight)
  only_first = cross_entropy_sums(logits[:, :3], targets[:, :3], weights[:, :3])
  assert float(loss_b[0]) == pytest.approx(float(only_first[0]), rel=1e-6)
  assert float(weight_b[0]) == float(only_first[1])


def test_z_loss_value_and_gradient_match_a_float64_formula():
  """z × Σ w·log²Z and its gradient 2z·w·log Z·softmax, Z = Σ exp(logits), in float64 numpy;
  logits far from 0 (offset 5), where log Z is large and the term bites."""
  rng = np.random.default_rng(1)
  logits = (rng.standard_normal((2, 5, 7)) + 5.0).astype(np.float32)
  targets = rng.integers(0, 7, (2, 5))
  weights = np.ones((2, 5), np.float32)
  weights[0, 0] = weights[1, 3] = 0.0
  x = logits.astype(np.float64)
  log_z = np.log(np.exp(x).sum(-1))
  z = 1e-2
  want = z * (weights * log_z ** 2).sum()
  want_grad = 2 * z * (weights * log_z)[..., None] * np.exp(x - log_z[..., None])
  term = lambda l: objective_sums(l, jnp.asarray(targets), jnp.asarray(weights), z)["z_loss"]
  assert float(term(jnp.asarray(logits))) == pytest.approx(want, rel=1e-6)
  np.testing.assert_allclose(jax.grad(term)(jnp.asarray(logits)), want_grad, rtol=1e-5,
                             atol=1e-7)
  sums = objective_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), z)
  ce, weight = cross_entropy_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
  assert (float(sums["loss"]), float(sums["weight"])) == (float(ce), float(weight))
  off = objective_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
  assert float(off["z_loss"]) == 0.0 and float(off["loss"]) == float(ce)
