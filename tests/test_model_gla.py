# Tiers (pytest.ini): test_at_init_the_state_follows_the_decay_law_and_the_output_does_not runs a
# 768-token, d_model-128 state over 8 rows (~19 s cold on 2 cores), so by cost it is integration,
# `make test-all` only.
# test-all only: at init the GLA state's cosine profile follows rho + (1 - rho) E[alpha]^d and the
# layer's output carries no recency
# (test_at_init_the_state_follows_the_decay_law_and_the_output_does_not).
"""The gated linear attention layer (pattern letter L) against the published formula in numpy,
its gate, its segment resets, its parameters' logical axes, and its recency at init."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_nope import kernels
from hybrid_nope.analysis.measure import recency, theory
from hybrid_nope.model import gla
from hybrid_nope.model.layers import logical_axes
from tests.linear_reference import linear_reference, rel_err

D, N, K, H = 32, 4, 2, 8


def make_layer(seed=0, **kw):
  shape = dict(d_model=D, num_heads=N, num_kv_heads=K, head_dim=H)
  return gla.GatedLinearAttention(**{**shape, **kw}, norm_eps=1e-6, impl="xla",
                                  dtype=jnp.float32, rngs=nnx.Rngs(seed))


def numpy_gla(layer, x, segment_ids=None):
  """Yang et al. (2023), written out in float64 numpy from the layer's parameters."""
  p = {name: np.asarray(v[...], np.float64) for name, v in nnx.state(layer, nnx.Param).items()}
  x = np.asarray(x, np.float64)
  q = np.einsum("btd,dnh->btnh", x, p["wq_DNH"])
  k = np.einsum("btd,dkh->btkh", x, p["wk_DKH"])
  v = np.einsum("btd,dkh->btkh", x, p["wv_DKH"])
  z = np.einsum("btr,rkh->btkh", x @ p["w_gate_down_DR"], p["w_gate_up_RKH"]) + p["gate_bias_KH"]
  log_alpha = -np.logaddexp(0.0, -z) / 16.0  # logsigmoid(z) / τ
  o = linear_reference(q, k, v, log_alpha, segment_ids)
  o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + 1e-6) * p["out_norm_scale_H"]
  g = np.einsum("btd,dnh->btnh", x, p["w_out_gate_DNH"])
  return np.einsum("btnh,nhd->btd", o * g / (1 + np.exp(-g)), p["wo_NHD"])


def test_layer_matches_the_published_formula_with_segments_and_gqa():
  seed = int(np.random.default_rng().integers(1 << 30))  # Fresh each run, named on failure.
  rng = np.random.default_rng(seed)
  layer = make_layer(seed=seed)
  x = rng.standard_normal((2, 150, D)).astype(np.float32)
  seg = np.repeat(np.array([[1, 2, 3], [1, 1, 0]]), [40, 70, 40], axis=1).astype(np.int32)
  seg[1, :5] = 4
  out = layer(jnp.asarray(x), positions_BT=None, segment_ids_BT=jnp.asarray(seg))
  expected = numpy_gla(layer, x, seg)
  valid = seg != 0
  assert rel_err(np.asarray(out)[valid], expected[valid]) < 1e-5, seed


def test_gate_is_a_decay_near_one_at_init_and_depends_on_the_input():
  layer = make_layer()
  x = jax.random.normal(jax.random.key(3), (2, 64, D))
  log_alpha = np.asarray(layer.log_decay(x))
  assert log_alpha.shape == (2, 64, K, H) and (log_alpha < 0).all()
  # logsigmoid of ~unit-variance logits, over τ = 16: α ≈ 0.95, and it varies with x_t.
  assert 0.93 < np.exp(log_alpha).mean() < 0.97
  assert np.std(log_alpha) > 0.01


def test_a_segment_start_forgets_the_past():
  layer = make_layer()
  x = jax.random.normal(jax.random.key(4), (1, 96, D))
  seg = jnp.asarray(np.repeat([[1, 2]], 48, axis=1).astype(np.int32))
  together = layer(x, positions_BT=None, segment_ids_BT=seg)
  alone = layer(x[:, 48:], positions_BT=None, segment_ids_BT=None)
  np.testing.assert_allclose(together[:, 48:], alone, rtol=1e-5, atol=1e-6)


def test_parameters_carry_logical_axes():
  axes = {name: logical_axes(v) for name, v in nnx.state(make_layer(), nnx.Param).items()}
  assert axes["wq_DNH"] == ("embed", "heads", "kv")
  assert axes["w_gate_up_RKH"] == (None, "kv_heads", "kv")
  assert axes["gate_bias_KH"] == ("kv_heads", "kv")
  assert axes["wo_NHD"] == ("heads", "kv", "embed")


def _profile(y_BTX, lags, segment_ids=None):
  B, T = y_BTX.shape[:2]
  sums, counts = recency.cosine_sums(y_BTX.reshape(B, T, -1), lags, None, segment_ids,
                                     jnp.zeros((B, T), jnp.int32) + jnp.arange(B)[:, None], B)
  return recency.mean_and_stderr(np.asarray(sums, np.float64), np.asarray(counts, np.float64))


@pytest.mark.integration
def test_at_init_the_state_follows_the_decay_law_and_the_output_does_not():
  """Theory (analysis.theory.linear_cosine): a sum of uncorrelated terms decayed by α_t, i.i.d.
  across tokens, has cosine E[α]^d at lag d (a ratio of expectations, long prefix). The layer's
  terms k_j v_j share a mean m (k and v read the same x_j), a position-independent component
  ρ = |E o|² / E|o|², so the prediction is ρ + (1 − ρ) E[α]^d, as for SWA over values with a
  mean. A state read out by a fixed query follows it. The layer's own output reads the state
  with q_t = W_Q x_t, independent across positions at init, so E[w_ij w_(i-d)j] = 0 and its
  cosine is ~0 at every d >= 1: unlike SWA, whose softmax is uniform at init, a random GLA
  layer plants no recency in its output until W_Q learns to read the state."""
  layer = make_layer(d_model=128, num_heads=4, num_kv_heads=4, head_dim=32)
  B, T, prefix = 8, 768, 256
  x = jax.random.normal(jax.random.key(5), (B, T, 128))
  lags = np.array([1, 2, 4, 8, 16, 32, 64])
  log_alpha = layer.log_decay(x)
  k = jnp.einsum("btd,dkh->btkh", x, layer.wk_DKH[...])
  v = jnp.einsum("btd,dkh->btkh", x, layer.wv_DKH[...])
  state = kernels.linear_attention(jnp.ones((B, T, 4, 32)), k, v, log_alpha)[:, prefix:]
  measured, se, _ = _profile(state, tuple(lags))  # A long prefix, as the law assumes.
  o = np.asarray(state, np.float64).reshape(-1, 4 * 32)
  rho = np.sum(o.mean(0) ** 2) / np.mean(np.sum(o * o, -1))
  mean_decay = float(np.exp(np.asarray(log_alpha, np.float64)).mean())
  predicted = rho + (1 - rho) * theory.linear_cosine(lags, mean_decay)
  tolerance = 4 * se + 0.01  # 0.01: the mean cosine's O(1/D) bias against the ratio.
  assert np.all(np.abs(measured - predicted) < tolerance), (measured, predicted, se)
  # A null that could have produced it: the SWA law at the same recency scale 1 / (1 − α).
  swa = rho + (1 - rho) * theory.swa_cosine(lags, theory.linear_recency_scale(mean_decay))
  assert np.any(np.abs(measured - swa) > 3 * tolerance)
  output = layer(x, positions_BT=None, segment_ids_BT=None)[:, prefix:]
  out_profile, out_se, _ = _profile(output, tuple(lags))
  assert np.all(np.abs(out_profile) < 4 * out_se + 0.01), (out_profile, out_se)
