"""The theory's predictions, checked by simulation (DESIGN.md stages 1-3)."""
import numpy as np
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from hybrid_nope.analysis import recency, theory
from hybrid_nope.model import LanguageModel
from hybrid_nope.model.layers import RMSNorm
from tests.helpers import tiny_config


def moving_average(o_BTD, w):
  """Uniform causal SWA over values o: y_i = mean of o_j for i − w < j <= i."""
  c = np.cumsum(np.pad(o_BTD, ((0, 0), (1, 0), (0, 0))), axis=1)
  i = np.arange(o_BTD.shape[1])
  lo = np.maximum(i + 1 - w, 0)
  return (c[:, i + 1] - c[:, lo]) / (i + 1 - lo)[None, :, None]


def test_uniform_swa_over_white_noise_follows_one_minus_d_over_w():
  rng = np.random.default_rng(0)
  B, T, D, w = 8, 2048, 256, 16
  y = moving_average(rng.standard_normal((B, T, D)), w)
  lags = (1, 2, 4, 8, 12, 16, 32)
  measured = np.asarray(recency.cosine_profile(jnp.asarray(y, jnp.float32), lags))
  # Per pair, a cosine of D-dim noise sums has std ≈ 1/sqrt(D); pairs within a window are
  # correlated, so there are ≈ B·T/w independent ones: SE ≈ 1/sqrt(D · B·T/w) ≈ 0.002. The
  # first w positions average fewer terms and bias the mean by at most w/T ≈ 0.008.
  tolerance = 5 / np.sqrt(D * B * T / w) + w / T
  np.testing.assert_allclose(measured, theory.swa_cosine(np.array(lags), w), atol=tolerance)


def test_uniform_global_attention_follows_the_square_root_law():
  rng = np.random.default_rng(1)
  B, T, D = 64, 513, 512
  o = rng.standard_normal((B, T, D))
  y = np.cumsum(o, axis=1) / np.arange(1, T + 1)[None, :, None]
  x = jnp.asarray(y, jnp.float32)
  # Mean over B samples of a cosine with std ≈ 1/sqrt(D): SE ≈ 1/sqrt(B·D) ≈ 0.006.
  tolerance = 5 / np.sqrt(B * D)
  for i in (32, 128, 512):
    lags = (1, i // 4, i // 2, i)
    measured = np.asarray(recency.cosine_profile(x, lags, positions=np.array([i])))
    np.testing.assert_allclose(measured, theory.global_cosine(np.array(lags), i), atol=tolerance)


def recency_with_mean(rng, B=4, T=512, D=64, w=16, mean_scale=3.0):
  """A recency component (SWA-like moving average) plus a position-independent mean that
  lives in the first 8 channels."""
  mean = np.zeros(D)
  mean[:8] = mean_scale
  return moving_average(rng.standard_normal((B, T, D)), w) * np.sqrt(w) + mean


def test_rmsnorm_preserves_the_unit_normalised_cross_moment():
  x = jnp.asarray(recency_with_mean(np.random.default_rng(2)), jnp.float32)
  norm = RMSNorm(x.shape[-1], eps=1e-12, rngs=nnx.Rngs(0))
  lags = (1, 4, 16, 64)
  np.testing.assert_allclose(recency.cosine_profile(norm(x), lags),
                             recency.cosine_profile(x, lags), rtol=1e-5, atol=1e-6)
  unit = lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True)
  for d in lags:
    np.testing.assert_allclose(recency.cross_moment(unit(norm(x)), d),
                               recency.cross_moment(unit(x), d), atol=1e-6)


def test_a_gain_that_shrinks_the_mean_lowers_the_floor_and_raises_the_gap():
  x = jnp.asarray(recency_with_mean(np.random.default_rng(3)), jnp.float32)
  lags = (1, 256)
  norm = RMSNorm(x.shape[-1], eps=1e-12, rngs=nnx.Rngs(0))
  before = recency.floor_and_gap(recency.cosine_profile(norm(x), lags), lags, far=256)
  norm.scale_D[...] = jnp.ones(x.shape[-1]).at[:8].set(0.2)  # Shrinks the mean's channels.
  after = recency.floor_and_gap(recency.cosine_profile(norm(x), lags), lags, far=256)
  assert after[0] < before[0] - 0.1   # floor
  assert after[1] > before[1] + 0.05  # gap


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "swiglu"])
def test_hermite_kernel_is_non_decreasing_and_matches_monte_carlo(activation):
  p = np.linspace(0, 1, 21)
  k = theory.hermite_kernel(activation, p)
  assert np.all(np.diff(k) >= -1e-9) and k[-1] == pytest.approx(1.0)
  rng = np.random.default_rng(4)
  n = 400_000
  for rho in (0.0, 0.3, 0.7):
    z1, z2 = rng.standard_normal((2, n))
    u, v = z1, rho * z1 + np.sqrt(1 - rho**2) * z2
    if activation == "swiglu":
      g1, g2 = rng.standard_normal((2, n))
      gu, gv = g1, rho * g1 + np.sqrt(1 - rho**2) * g2
      f = theory.ACTIVATIONS["silu"]
      fu, fv = f(gu) * u, f(gv) * v
    else:
      f = theory.ACTIVATIONS[activation]
      fu, fv = f(u), f(v)
    mc = np.mean(fu * fv) / np.sqrt(np.mean(fu * fu) * np.mean(fv * fv))
    # Monte-Carlo SE of a correlation-like mean over n samples is ≈ 1/sqrt(n) ≈ 0.0016.
    assert float(theory.hermite_kernel(activation, rho)) == pytest.approx(mc, abs=0.01)


def test_wide_random_mlp_preserves_the_order_of_the_profile():
  rng = np.random.default_rng(5)
  B, T, D, F, w = 4, 512, 64, 4096, 32
  x = moving_average(rng.standard_normal((B, T, D)), w)
  x = x / np.sqrt((x**2).mean(-1, keepdims=True))  # Unit RMS: pre-activations have unit variance.
  W = rng.standard_normal((D, F)) / np.sqrt(D)
  lags = (1, 2, 4, 8, 16, 24, 32, 64)
  f_in = np.asarray(recency.cosine_profile(jnp.asarray(x, jnp.float32), lags))
  for activation in ("relu", "gelu", "silu"):
    y = theory.ACTIVATIONS[activation](x @ W)
    f_out = np.asarray(recency.cosine_profile(jnp.asarray(y, jnp.float32), lags))
    assert np.all(np.diff(f_in) <= 0) and np.all(np.diff(f_out) <= 1e-3)
    assert np.argsort(-f_out, kind="stable").tolist() == np.argsort(-f_in, kind="stable").tolist()
    # And the values follow the kernel of the input cosine (width F finite: loose tolerance).
    np.testing.assert_allclose(f_out, theory.hermite_kernel(activation, f_in), atol=0.03)


def test_cross_moment_through_attention_matches_the_prediction():
  rng = np.random.default_rng(6)
  B, T, D, w = 2000, 24, 3, 4
  # Stationary AR(1) input with known cross-moments G_X(u) = φ^u I / (1 − φ²).
  phi = 0.6
  x = np.zeros((B, T + 50, D))
  e = rng.standard_normal((B, T + 50, D))
  for t in range(1, T + 50):
    x[:, t] = phi * x[:, t - 1] + e[:, t]
  x = x[:, 50:]
  G = {u: np.eye(D) * phi**u / (1 - phi**2) for u in range(T)}
  # A non-uniform causal sliding-window attention pattern, the same for every sequence.
  attn = np.tril(np.exp(rng.standard_normal((T, T))))
  attn *= np.tril(np.ones((T, T)), 0) - np.tril(np.ones((T, T)), -w)
  attn /= attn.sum(1, keepdims=True)
  A = rng.standard_normal((D, D))
  y = np.einsum("ij,bjd->bid", attn, x) @ A.T
  for d in (1, 3, 6):
    measured = np.asarray(recency.cross_moment(jnp.asarray(y, jnp.float32), d))
    predicted = theory.cross_moment_prediction(attn, G, A, d)
    # Sequences are independent: the standard error comes from the spread of per-sequence
    # cross-moments; 5 SE per entry.
    per_sequence = np.einsum("bid,bie->bde", y[:, d:], y[:, :-d]) / (T - d)
    se = per_sequence.std(0) / np.sqrt(B)
    assert np.all(np.abs(measured - predicted) <= 5 * se + 1e-6), (measured, predicted, se)


def test_logit_gap_of_a_global_nope_layer_is_zero_in_expectation_at_init():
  """E[M] = 0 under independent zero-mean init: across seeds the gap averages out."""
  config = tiny_config(model__pattern="G", model__num_layers=2, model__d_model=32)
  rng = np.random.default_rng(7)
  x = jnp.asarray(recency_with_mean(rng, B=2, T=128, D=32, mean_scale=1.0), jnp.float32)
  gaps = []
  for seed in range(48):
    model = LanguageModel(config.model, rngs=nnx.Rngs(seed))
    attn = model.blocks[0].attn
    profile = recency.logit_profile(x, attn.wq_DNH[...], attn.wk_DKH[...], (1, 64))
    gaps.extend(np.asarray(profile[:, 0] - profile[:, 1]))
  gaps = np.array(gaps)
  assert gaps.std() > 0
  assert abs(gaps.mean()) < 3 * gaps.std() / np.sqrt(len(gaps))
