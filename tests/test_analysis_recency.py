"""Recency metrics against explicit computations (D x D matrices, loops over pairs)."""
import numpy as np
import jax.numpy as jnp
import pytest

from hybrid_nope.analysis import recency


def random_x(seed=0, B=3, T=40, D=6):
  rng = np.random.default_rng(seed)
  # A moving average gives the input real recency, so profiles are not flat.
  noise = rng.standard_normal((B, T + 4, D))
  return jnp.asarray((noise[:, 4:] + noise[:, 3:-1] + noise[:, 2:-2]) + 0.5, jnp.float32)


def test_default_lags():
  assert recency.default_lags(16) == (1, 2, 4, 8, 16)
  assert recency.default_lags(20, window=6) == (1, 2, 4, 6, 8, 16, 20)
  assert recency.default_lags(8, window=64) == (1, 2, 4, 8)


def test_cosine_profile_matches_loop_over_pairs():
  x = np.asarray(random_x())
  lags = (1, 3, 10)
  got = recency.cosine_profile(jnp.asarray(x), lags)
  for n, d in enumerate(lags):
    cos = [x[b, i] @ x[b, i - d] / np.linalg.norm(x[b, i]) / np.linalg.norm(x[b, i - d])
           for b in range(x.shape[0]) for i in range(d, x.shape[1])]
    assert float(got[n]) == pytest.approx(np.mean(cos), rel=1e-5)


def test_subsampled_positions_only_use_valid_pairs():
  x = np.asarray(random_x())
  positions = np.array([0, 5, 20, 39])
  got = recency.cosine_profile(jnp.asarray(x), (10,), positions)
  cos = [x[b, i] @ x[b, i - 10] / np.linalg.norm(x[b, i]) / np.linalg.norm(x[b, i - 10])
         for b in range(x.shape[0]) for i in (20, 39)]
  assert float(got[0]) == pytest.approx(np.mean(cos), rel=1e-5)
  assert list(recency.query_positions(100, 5)) == [0, 25, 50, 74, 99]
  assert recency.query_positions(100, 0) is None


def test_floor_and_gap():
  floor, gap = recency.floor_and_gap(np.array([0.9, 0.5, 0.2]), (1, 4, 16), far=16)
  assert floor == pytest.approx(0.2) and gap == pytest.approx(0.7)
  with pytest.raises(ValueError, match="far lag 32"):
    recency.floor_and_gap(np.array([0.9, 0.5]), (1, 4), far=32)


def test_logit_profile_equals_frobenius_product_with_cross_moment():
  rng = np.random.default_rng(1)
  x = random_x(D=6)
  N, K, H = 4, 2, 3
  wq = jnp.asarray(rng.standard_normal((6, N, H)), jnp.float32)
  wk = jnp.asarray(rng.standard_normal((6, K, H)), jnp.float32)
  lags = (1, 2, 7)
  got = np.asarray(recency.logit_profile(x, wq, wk, lags))
  assert got.shape == (N, len(lags))
  for h in range(N):
    m = np.asarray(wq[:, h, :]) @ np.asarray(wk[:, h // (N // K), :]).T / np.sqrt(H)
    for n, d in enumerate(lags):
      g = np.asarray(recency.cross_moment(x, d))
      assert got[h, n] == pytest.approx(np.sum(g * m), rel=1e-4, abs=1e-5)


def test_alignment_is_the_frobenius_cosine():
  rng = np.random.default_rng(2)
  x = random_x(D=6, T=50)
  wq = jnp.asarray(rng.standard_normal((6, 2, 3)), jnp.float32)
  wk = jnp.asarray(rng.standard_normal((6, 2, 3)), jnp.float32)
  got = np.asarray(recency.alignment(x, wq, wk, near=1, far=30))
  delta = np.asarray(recency.cross_moment(x, 1) - recency.cross_moment(x, 30))
  for h in range(2):
    m = np.asarray(wq[:, h]) @ np.asarray(wk[:, h]).T / np.sqrt(3)
    want = np.sum(m * delta) / np.linalg.norm(m) / np.linalg.norm(delta)
    assert got[h] == pytest.approx(want, rel=1e-4)
  # M aligned with ΔG by construction has alignment 1.
  u, s, vt = np.linalg.svd(delta)
  wq1 = jnp.asarray(u[:, :1, None] * np.sqrt(s[0]), jnp.float32)
  wk1 = jnp.asarray(vt[:1].T[:, :, None] * np.sqrt(s[0]), jnp.float32)
  rank1 = u[:, :1] @ vt[:1] * s[0]
  expected = np.sum(rank1 * delta) / np.linalg.norm(rank1) / np.linalg.norm(delta)
  assert float(recency.alignment(x, wq1, wk1, near=1, far=30)[0]) == pytest.approx(expected,
                                                                                    rel=1e-4)
