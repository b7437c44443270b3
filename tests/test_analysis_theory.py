"""The theory's predictions (DESIGN.md stages 1-3): checked by simulation, then against the
demo-shaped model at init (layer 0's SWA mixer, layer 1's global NoPE read-out)."""
import functools

import numpy as np
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from configs import demo
from hybrid_nope.analysis import probe, recency, theory
from hybrid_nope.data import pipeline
from hybrid_nope.model import LanguageModel
from hybrid_nope.model.layers import RMSNorm


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


DECAYS = (0.5, 0.9, 0.99)  # recency scales 1/(1 − α) = 2, 10, 100


def decayed_sum(v_BTD, decay):
  """The constant-decay linear mixer over values v: y_t = α y_{t−1} + v_t = Σ_{j≤t} α^{t−j} v_j."""
  y = np.empty_like(v_BTD)
  y[:, 0] = v_BTD[:, 0]
  for t in range(1, v_BTD.shape[1]):
    y[:, t] = decay * y[:, t - 1] + v_BTD[:, t]
  return y


def gaussian_cosine_bias(c, D):
  """E cos − c for D i.i.d. pairs of jointly Gaussian components with correlation c (any scales):
  −c(1 − c²)/(2D) + O(1/D²), the delta method of `uniform_swa_cosine_and_bias` with ν = 0, S ∝ I."""
  return -c * (1 - c**2) / (2 * D)


def linear_mixer_nulls(d, decay, i=None):
  """Laws the Monte Carlo must reject: the SWA law with the recency scale as its window (equal to
  α^d at d = 1), the square root α^(d/2), and for a finite prefix the long-prefix α^d and the
  uniform-prefix law (α = 1)."""
  nulls = {"swa, w = 1/(1 − α)": theory.swa_cosine(d, theory.linear_recency_scale(decay)),
           "α^(d/2)": decay ** (d / 2)}
  if i is not None:
    nulls |= {"long prefix α^d": theory.linear_cosine(d, decay),
              "global (α = 1)": theory.global_cosine(d, i)}
  return nulls


def linear_mixer_long_prefix(decay, seed, B=64, T=1536, D=128, start=512,
                             lags=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512)):
  """f(d) of the decayed sum of white noise over the pairs whose earlier token is at >= start,
  through the recency estimator (one cluster per row: rows are independent), against α^d."""
  y = decayed_sum(np.random.default_rng(seed).standard_normal((B, T, D)), decay)
  measured, stderr, _ = recency.mean_and_stderr(*row_cosine_sums(y[:, start:], lags))
  d = np.array(lags)
  law = theory.linear_cosine(d, decay)
  bias = gaussian_cosine_bias(law, D)
  # The counted pairs' finite-prefix law lies between α^d and its value at i − d = start.
  prefix = law - theory.linear_cosine(d, decay, start + d)
  return dict(lags=d, measured=measured, stderr=stderr, law=law, bias=bias, prefix=prefix,
              tolerance=4 * stderr + np.abs(bias) + prefix, nulls=linear_mixer_nulls(d, decay))


def linear_mixer_finite_prefix(decay, seed, B=512, D=256, positions=(2, 8, 32, 128)):
  """Per position i and lag d in {1, 2, i/4, i/2, i}, the mean cosine of (y_i, y_{i−d}) over B
  independent rows of the decayed sum of white noise, and its standard error over the rows."""
  pairs = [(i, d) for i in positions for d in sorted({1, 2, i // 4, i // 2, i}) if 1 <= d <= i]
  wanted = {t for i, d in pairs for t in (i, i - d)}
  rng = np.random.default_rng(seed)
  y, kept = np.zeros((B, D)), {}
  for t in range(max(positions) + 1):  # Only the positions used are kept: B·D memory.
    y = decay * y + rng.standard_normal((B, D))
    if t in wanted:
      kept[t] = y
  u = {t: x / np.linalg.norm(x, axis=-1, keepdims=True) for t, x in kept.items()}
  cos = np.array([np.sum(u[i] * u[i - d], -1) for i, d in pairs])  # [pairs, B]
  i, d = np.array(pairs).T
  law = theory.linear_cosine(d, decay, i)
  bias = gaussian_cosine_bias(law, D)
  stderr = cos.std(1, ddof=1) / np.sqrt(B)
  return dict(i=i, lags=d, measured=cos.mean(1), stderr=stderr, law=law, bias=bias,
              tolerance=4 * stderr + np.abs(bias), nulls=linear_mixer_nulls(d, decay, i))


@pytest.mark.parametrize("form", ["long prefix", "finite prefix"])
def test_constant_decay_linear_mixer_over_white_noise_follows_the_decay_law(form):
  """y_i = Σ_{j≤i} α^{i−j} v_j over i.i.d. Gaussian values: the mean cosine of (y_i, y_{i−d})
  against theory.linear_cosine, for α in DECAYS. Long prefix: α^d over the pairs whose earlier
  token is at >= 512 (the finite-prefix correction there, ≤ 2e-5, is added to the tolerance).
  Finite prefix: α^d sqrt((1 − α^{2(i−d+1)})/(1 − α^{2(i+1)})) at i in {2, 8, 32, 128}.

  Tolerance: 4 standard errors (over the independent rows: 64 of them, or 512; 78 comparisons, so
  a false failure has probability < 1% per draw) + the mean cosine's derived bias against the law,
  the ratio of expectations: c(1 − c²)/(2D) ≤ 0.0015 (D = 128) and 0.0008 (D = 256); at the long
  prefix's small lags it is several standard errors, and the error minus it is within 2 of them
  (`gaussian_cosine_bias`). Power: the same tolerance rejects, for every α, the SWA law with
  w = 1/(1 − α), α^(d/2) and, for the finite prefix, the long-prefix α^d and the uniform-prefix
  global law.
  """
  compare = linear_mixer_long_prefix if form == "long prefix" else linear_mixer_finite_prefix
  for seed, decay in enumerate(DECAYS):
    r = compare(decay, seed=10 + seed)
    assert np.all(np.abs(r["measured"] - r["law"]) <= r["tolerance"]), (decay, r)
    for name, null in r["nulls"].items():
      assert np.any(np.abs(r["measured"] - null) > r["tolerance"]), (decay, name, r)


def test_linear_cosine_is_the_ratio_of_the_moments_of_the_decayed_sum():
  """The closed form against the derivation's sums, exactly: y_i = Σ_j a_ij v_j with a_ij = α^{i−j}
  (j ≤ i) over uncorrelated unit values has E[y_i · y_k] ∝ Σ_j a_ij a_kj."""
  for decay in (0.0, 0.3, 0.9, 0.999, 1.0):
    for i in (0, 1, 5, 40):
      j = np.arange(i + 1)
      a_TJ = np.where(j[None] <= j[:, None], decay ** np.maximum(j[:, None] - j[None], 0), 0.0)
      d = np.arange(i + 1)
      a_i, a_k = a_TJ[i], a_TJ[i - d]
      expected = a_k @ a_i / (np.linalg.norm(a_i) * np.linalg.norm(a_k, axis=-1))
      np.testing.assert_allclose(theory.linear_cosine(d, decay, i), expected, rtol=1e-12,
                                 atol=1e-300)
      assert np.isnan(theory.linear_cosine(i + 1, decay, i))  # no pair (i, i − d) with d > i


def test_linear_cosine_limits_and_recency_scale():
  d, i = np.arange(65), 64
  # α → 1: the uniform-prefix law, continuously (the deviation is O((1 − α) i)), and at α = 1.
  np.testing.assert_array_equal(theory.linear_cosine(d, 1.0, i), theory.global_cosine(d, i))
  for eps in (1e-4, 1e-8, 1e-12):
    deviation = theory.linear_cosine(d, 1 - eps, i) - theory.global_cosine(d, i)
    assert np.max(np.abs(deviation)) <= eps * (i + 1), (eps, deviation)
  np.testing.assert_array_equal(theory.linear_cosine(d, 1.0), np.ones(len(d)))
  # α = 0: y_i = v_i, so 1 at d = 0 and 0 at every other lag, with or without a finite prefix.
  for prefix in (None, 0, 3, 1000):
    lags = np.arange(4 if prefix is None else min(prefix, 3) + 1)
    np.testing.assert_array_equal(theory.linear_cosine(lags, 0.0, prefix), lags == 0)
  # The finite-prefix form tends to α^d; broadcasting over d, α and i.
  np.testing.assert_allclose(theory.linear_cosine(d, 0.9, 10**6), 0.9**d, rtol=1e-14)
  grid = theory.linear_cosine(d[:, None, None], np.array(DECAYS)[:, None], np.array([64, 128]))
  assert grid.shape == (len(d), len(DECAYS), 2)
  np.testing.assert_allclose(grid[:, 1, 0], theory.linear_cosine(d, 0.9, 64))
  # The recency scale: 1/(1 − α), the window of the SWA law that agrees with α^d at d = 1.
  decays = np.array((0.0, 0.5, 0.9, 0.99))
  np.testing.assert_allclose(theory.linear_recency_scale(decays), [1, 2, 10, 100])
  np.testing.assert_allclose(theory.swa_cosine(1, theory.linear_recency_scale(decays)),
                             theory.linear_cosine(1, decays))
  for bad in (-0.1, 1.5, np.nan):
    with pytest.raises(ValueError, match="decay"):
      theory.linear_cosine(d, bad)
  with pytest.raises(ValueError, match="decay"):
    theory.linear_recency_scale(1.0)
  with pytest.raises(ValueError, match="d="):
    theory.linear_cosine(-1, 0.5)
  with pytest.raises(ValueError, match="i="):
    theory.linear_cosine(1, 0.5, -1)


def recency_with_mean(rng, B=4, T=512, D=64, w=16, mean_scale=3.0):
  """A recency component (SWA-like moving average) plus a position-independent mean that
  lives in the first 8 channels."""
  mean = np.zeros(D)
  mean[:8] = mean_scale
  return moving_average(rng.standard_normal((B, T, D)), w) * np.sqrt(w) + mean


def unit_cross_moment(x_BTD, d):
  """Σ over pairs of û_i û_{i−d}ᵀ / pairs, û = x / |x|, in float64: the definition."""
  u = x_BTD / np.linalg.norm(x_BTD, axis=-1, keepdims=True)
  return np.einsum("btd,bte->de", u[:, d:], u[:, :-d]) / (u.shape[0] * (u.shape[1] - d))


def test_rmsnorm_keeps_the_unit_normalised_cross_moment_of_its_gained_input():
  """RMSNorm(x) = x / sqrt(mean x² + eps) ⊙ g is a positive factor per token times x ⊙ g, so
  the unit-normalised cross-moment (and the cosine profile) of its output is exactly that of
  x ⊙ g, for any eps: with g = 1 that of x (DESIGN.md stage 2). With random non-unit gains it
  differs from x's by far more than the tolerance, so a norm that dropped or misplaced the gain,
  or subtracted the mean as LayerNorm does, would fail."""
  rng = np.random.default_rng(2)
  x = recency_with_mean(rng)
  D = x.shape[-1]
  gain = np.exp(rng.normal(0.0, 0.5, D))
  norm = RMSNorm(D, eps=1e-5, rngs=nnx.Rngs(0))
  norm.scale_D[...] = jnp.asarray(gain, jnp.float32)
  y = np.asarray(norm(jnp.asarray(x, jnp.float32)), np.float64)
  lags = (1, 4, 16, 64)
  for d in lags:
    expected = unit_cross_moment(x * gain, d)
    np.testing.assert_allclose(unit_cross_moment(y, d), expected, atol=1e-6)
    assert np.max(np.abs(expected - unit_cross_moment(x, d))) > 1e-3  # 1000x the tolerance
  x_layernorm = x - x.mean(-1, keepdims=True)
  assert np.max(np.abs(unit_cross_moment(x_layernorm, 1) - unit_cross_moment(x, 1))) > 1e-3
  profile = np.asarray(recency.cosine_profile(jnp.asarray(y, jnp.float32), lags))
  expected = [np.trace(unit_cross_moment(x * gain, d)) for d in lags]
  np.testing.assert_allclose(profile, expected, atol=1e-5)
  unit_gain = np.asarray(recency.cosine_profile(jnp.asarray(x, jnp.float32), lags))
  assert np.max(np.abs(profile - unit_gain)) > 1e-3  # 100x the tolerance
  norm.scale_D[...] = jnp.ones(D)
  np.testing.assert_allclose(recency.cosine_profile(norm(jnp.asarray(x, jnp.float32)), lags),
                             unit_gain, atol=1e-5)


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
def test_hermite_kernel_matches_monte_carlo_and_is_non_decreasing(activation):
  """The kernel against a Monte-Carlo estimate of the wide layer's output cosine; the estimates
  themselves increase with the input correlation (the order-preservation claim, measured)."""
  rng = np.random.default_rng(4)
  n = 400_000
  rhos = (0.0, 0.3, 0.7, 0.95)
  mc = []
  for rho in rhos:
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
    mc.append(np.mean(fu * fv) / np.sqrt(np.mean(fu * fu) * np.mean(fv * fv)))
  # Monte-Carlo SE of a correlation-like mean over n samples is ≈ 1/sqrt(n) ≈ 0.0016 (heavier
  # tails for swiglu's products: ≈ 0.003); 0.01 is > 3 SE.
  np.testing.assert_allclose(theory.hermite_kernel(activation, np.array(rhos)), mc, atol=0.01)
  assert np.all(np.diff(mc) > 0.05), mc  # steps of 0.25-0.4 in ρ move k by far more than SE


def test_wide_random_mlp_preserves_the_order_of_the_profile():
  rng = np.random.default_rng(5)
  B, T, D, F, w = 4, 512, 64, 4096, 32
  x = moving_average(rng.standard_normal((B, T, D)), w)
  x = x / np.sqrt((x**2).mean(-1, keepdims=True))  # Unit RMS: pre-activations have unit variance.
  W = rng.standard_normal((D, F)) / np.sqrt(D)
  lags = (1, 2, 4, 8, 16, 24, 28, 32, 64)
  # Inside the window f_in falls by >= 1/32 per step, many SE (≈ 1/sqrt(D·B·T/w) ≈ 0.016, less
  # for the difference of nearby lags); from d = w on it is 0 ± SE at every lag, so the order is
  # asserted inside the window only.
  inside = np.array(lags) < w
  f_in = np.asarray(recency.cosine_profile(jnp.asarray(x, jnp.float32), lags))
  assert np.all(np.diff(f_in[inside]) < 0)
  for activation in ("relu", "gelu", "silu"):
    y = theory.ACTIVATIONS[activation](x @ W)
    f_out = np.asarray(recency.cosine_profile(jnp.asarray(y, jnp.float32), lags))
    assert np.all(np.diff(f_out[inside]) < 0)
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


# ---- Against the demo-shaped model at init ---------------------------------------------------
#
# The demo's shapes (d_model 128, 4 heads of 32, window 64, RoPE in SWA, NoPE global); rows are
# shorter than its seq_len 1024 to stay fast (nothing at layer 0 depends on the row length but the
# number of pairs). Layer 0 is fed tokens drawn uniformly from the vocabulary, so the data has no
# recency of its own: everything measured at its mixer comes from the attention.

ROWS, ROW_LEN = 32, 512  # the W_Q = 0 test's probe; the replica test uses the first 16 x 256


def observer(model, wanted):
  """A jitted (state, tokens, positions, segment_ids) -> {"layer/boundary": x} for the model's
  graph, keeping the boundaries in `wanted` (pairs (layer, boundary)); XLA drops the rest."""
  graphdef = nnx.split(model)[0]

  @jax.jit
  def run(state, tokens_BT, positions_BT, segment_ids_BT):
    seen = {}

    def observe(layer, name, x_BTD):
      if (layer, name) in wanted:
        seen[f"{layer}/{name}"] = x_BTD
      return x_BTD

    nnx.merge(graphdef, state)(tokens_BT, positions_BT=positions_BT,
                               segment_ids_BT=segment_ids_BT, observe=observe)
    return seen

  return run


def layer0_at_init(seed):
  """Layer 0 of the demo model on uniform random tokens: its normalised input x and its mixer
  output y, as initialised and with W_Q zeroed, and its parameters in float64."""
  config = demo.get_config()
  model = LanguageModel(config.model, rngs=nnx.Rngs(seed))
  attn = model.blocks[0].attn
  assert model.kinds[0] == "S" and attn.position == "rope" and attn.window == 64
  tokens = np.random.default_rng(seed).integers(0, config.model.vocab_size, (ROWS, ROW_LEN))
  positions = np.broadcast_to(np.arange(ROW_LEN), tokens.shape)
  run = observer(model, {(0, "pre_mixer_norm"), (0, "mixer")})
  out = run(nnx.state(model), tokens, positions, None)
  params = {k: np.asarray(getattr(attn, k)[...], np.float64)
            for k in ("wq_DNH", "wk_DKH", "wv_DKH", "wo_NHD")}
  attn.wq_DNH[...] = jnp.zeros_like(attn.wq_DNH[...])
  out_uniform = run(nnx.state(model), tokens, positions, None)
  # The normalised embedding table: with i.i.d. tokens, x_j = h[t_j] has G_X(0) = E[h hᵀ] and
  # G_X(u ≠ 0) = μ μᵀ (the mean component) exactly, so Cov = G_X(0) − μ μᵀ is all we need.
  table = np.asarray(model.embed.embedding_VD[...], np.float64)
  norm = model.blocks[0].attn_norm
  h_VD = (table / np.sqrt(np.mean(table**2, -1, keepdims=True) + norm.eps)
          * np.asarray(norm.scale_D[...], np.float64))
  mu = h_VD.mean(0)
  A_NDD = np.einsum("dnh,nhe->nde", params["wv_DKH"], params["wo_NHD"])  # y = Σ_h (a x) A_h
  return dict(
      tokens=tokens, h_VD=h_VD, mu=mu, cov=h_VD.T @ h_VD / len(h_VD) - np.outer(mu, mu),
      A_NDD=A_NDD, window=attn.window, theta=attn.rope_theta, **params,
      x=np.asarray(out["0/pre_mixer_norm"], np.float64),
      y=np.asarray(out["0/mixer"], np.float64),
      y_uniform=np.asarray(out_uniform["0/mixer"], np.float64))


@pytest.fixture(scope="module")
def layer0():
  return layer0_at_init(seed=0)


def rope_tables(T, H, theta):
  inv_freq_F = 1.0 / theta ** (np.arange(0, H, 2) / H)
  angle_TF = np.arange(T)[:, None] * inv_freq_F
  return np.cos(angle_TF), np.sin(angle_TF)


def rope(z_BTNH, cos_TF, sin_TF):
  """Rotate-half RoPE at positions 0..T-1 (as the model's apply_rope)."""
  z1, z2 = np.split(z_BTNH, 2, axis=-1)
  c, s = cos_TF[None, :, None], sin_TF[None, :, None]
  return np.concatenate([z1 * c - z2 * s, z2 * c + z1 * s], axis=-1)


def softmax_in_window(logits_BNTT, window):
  """Causal sliding-window softmax: keys j with i − window < j <= i."""
  T = logits_BNTT.shape[-1]
  i, j = np.arange(T)[:, None], np.arange(T)[None]
  logits = np.where((j <= i) & (j > i - window), logits_BNTT, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


def layer0_replica(p, B, T):
  """Layer 0's attention in float64 from its parameters: roped queries [B, T, N, H], probabilities
  [B, N, T, T] and the mixer output [B, T, D], on the first B rows and T positions."""
  x = p["x"][:B, :T]
  H = p["wq_DNH"].shape[-1]
  cos_TF, sin_TF = rope_tables(T, H, p["theta"])
  q = rope(np.einsum("btd,dnh->btnh", x, p["wq_DNH"]), cos_TF, sin_TF)
  k = rope(np.einsum("btd,dnh->btnh", x, p["wk_DKH"]), cos_TF, sin_TF)
  v = np.einsum("btd,dnh->btnh", x, p["wv_DKH"])
  logits = q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1) / np.sqrt(H)
  a = softmax_in_window(logits, p["window"])
  y = np.einsum("bnth,nhd->btd", a @ v.transpose(0, 2, 1, 3), p["wo_NHD"])
  return q, logits, a, y


def attended_mean(p, a_BNTT, q_BTNH):
  """ȳ_i = Σ_h (μ + Cov b̄^h_i) A_h: the mean of y_i given query i's attention, to first order in
  the logits. a^h_ij = softmax_j(x_j · b^h_ij) with b^h_ij = W_K,h R_jᵀ q̃^h_i / sqrt(H) (q̃ the
  roped query, R_j RoPE at j), and tilting a distribution by exp(x · b) moves its mean by Cov b
  + O(b²); b̄^h_i = Σ_j a^h_ij b^h_ij."""
  H = q_BTNH.shape[-1]
  cos_TF, sin_TF = rope_tables(a_BNTT.shape[-1], H, p["theta"])
  ac = (a_BNTT @ cos_TF).transpose(0, 2, 1, 3)  # Σ_j a_ij cos(j ω): [B, T, N, H/2]
  as_ = (a_BNTT @ sin_TF).transpose(0, 2, 1, 3)
  q1, q2 = np.split(q_BTNH, 2, axis=-1)
  rq = np.concatenate([q1 * ac + q2 * as_, q2 * ac - q1 * as_], -1) / np.sqrt(H)  # Σ_j a R_jᵀ q̃
  K_NHD = np.einsum("dnh,de,nef->nhf", p["wk_DKH"], p["cov"], p["A_NDD"], optimize=True)
  return p["mu"] @ p["A_NDD"].sum(0) + np.einsum("btnh,nhf->btf", rq, K_NHD)


def predicted_cosine_sums(a_BNTT, ybar_BTD, s_NN, lags):
  """Per lag and row, the sum over pairs (i, i − d) of the predicted cosine: [L, B].

  E[y_i · y_k | a] = ȳ_i · ȳ_k + Σ_hh' s_hh' ⟨a^h_i, a^h'_k⟩ with s_hh' = tr(A_hᵀ Cov A_h'), and
  the predicted cosine is E[y_i · y_k | a] / sqrt(E[|y_i|² | a] E[|y_k|² | a]).
  """
  B, N, T, _ = a_BNTT.shape
  a_BTNT = a_BNTT.transpose(0, 2, 1, 3)

  def dot(i, k):  # [B, len(i)]
    gram_BPNN = a_BTNT[:, i] @ a_BTNT[:, k].transpose(0, 1, 3, 2)
    return (np.einsum("bpd,bpd->bp", ybar_BTD[:, i], ybar_BTD[:, k])
            + np.einsum("bpnm,nm->bp", gram_BPNN, s_NN))

  square = dot(np.arange(T), np.arange(T))
  sums = []
  for d in lags:
    i = np.arange(d, T)
    sums.append(np.sum(dot(i, i - d) / np.sqrt(square[:, i] * square[:, i - d]), axis=1))
  return np.stack(sums)


def row_cosine_sums(x_BTD, lags):
  """recency.cosine_sums with one cluster per row (rows are independent sequences), jitted:
  sums and counts [L, B] in float64."""
  B, T = x_BTD.shape[:2]
  clusters = np.broadcast_to(np.arange(B)[:, None], (B, T))
  sums, counts = _cosine_sums(jnp.asarray(x_BTD, jnp.float32), clusters, lags=tuple(lags),
                              num_clusters=B)
  return np.asarray(sums, np.float64), np.asarray(counts, np.float64)


@functools.partial(jax.jit, static_argnames=("lags", "num_clusters"))
def _cosine_sums(x_BTD, clusters_BT, *, lags, num_clusters):
  return recency.cosine_sums(x_BTD, lags, clusters_BT=clusters_BT, num_clusters=num_clusters)


def test_layer0_replica_reproduces_the_mixer_and_the_theory_module(layer0):
  """The float64 replica of layer 0 (queries, RoPE, window, softmax, W_O) gives the model's
  mixer output, the normalised input is the normalised table row of each token, and for one
  head the replica's mean predicted y_i · y_{i−d} is tr of theory.cross_moment_prediction."""
  p = layer0
  B, T = 16, 256
  np.testing.assert_allclose(p["x"], p["h_VD"][p["tokens"]], atol=1e-5)
  _, _, a, y = layer0_replica(p, B, T)
  np.testing.assert_allclose(y, p["y"][:B, :T], atol=1e-4)  # |y| up to ≈ 4
  # One head, one row, the first 128 positions (causal: they depend on no later token).
  t, head = 128, 2
  a_TT, A = a[0, head, :t, :t], p["A_NDD"][head]
  G = {0: p["cov"] + np.outer(p["mu"], p["mu"])}
  G.update({u: np.outer(p["mu"], p["mu"]) for u in range(1, t)})
  s = np.trace(A.T @ p["cov"] @ A)
  m = p["mu"] @ A @ A.T @ p["mu"]
  for d in (1, 5, 40):
    i = np.arange(d, t)
    ours = np.mean(m + s * np.sum(a_TT[i] * a_TT[i - d], -1))
    # theory's convention is y = A Σ a x for column vectors: A = A_hᵀ.
    assert np.trace(theory.cross_moment_prediction(a_TT, G, A.T, d)) == pytest.approx(ours,
                                                                                    rel=1e-9)


def own_attention_comparison(p, B=16, T=256, lags=(1, 2, 4, 8, 16, 32, 48, 64, 96, 128)):
  """Measured f(d) at the layer-0 mixer, the prediction from the layer's own attention, the
  tolerance and the alternatives (see the test below); the first B rows and T positions."""
  q, logits, a, _ = layer0_replica(p, B, T)
  y = p["y"][:B, :T]
  sums, counts = row_cosine_sums(y, lags)
  s_NN = np.einsum("nde,df,mfe->nm", p["A_NDD"], p["cov"], p["A_NDD"], optimize=True)
  mean_only = np.broadcast_to(p["mu"] @ p["A_NDD"].sum(0), y.shape)

  def predict(a_BNTT, tilt=True):
    ybar = attended_mean(p, a_BNTT, q) if tilt else mean_only
    pred_sums = predicted_cosine_sums(a_BNTT, ybar, s_NN, lags)
    _, stderr, _ = recency.mean_and_stderr(sums - pred_sums, counts)
    return pred_sums.sum(1) / counts.sum(1), stderr

  predicted, stderr = predict(a)
  independent, _ = predict(a, tilt=False)
  # Bounds on what the prediction leaves out (the test's docstring).
  P_NNDD = np.einsum("nde,df,mfg->nmeg", p["A_NDD"], p["cov"], p["A_NDD"], optimize=True)
  gram_BTNN = np.einsum("bnij,bmij->binm", a, a)
  tr_S = np.einsum("btnm,nm->bt", gram_BTNN, s_NN)
  tr_S2 = np.einsum("xtab,xtcd,abcd->xt", gram_BTNN, gram_BTNN,
                    np.einsum("abef,cdfe->abcd", P_NNDD, P_NNDD), optimize=True)
  jensen = 0.2 * np.max(tr_S2 / tr_S**2)
  tilt = 2 * np.mean(np.sum(a**2, -1)) * np.abs(predicted - independent)
  alternatives = {
      "independent": independent,
      "uniform": predict(softmax_in_window(np.zeros_like(logits), p["window"]), tilt=False)[0],
      "half window": predict(softmax_in_window(logits, p["window"] // 2))[0],
      "double window": predict(softmax_in_window(logits, p["window"] * 2))[0]}
  return dict(measured=sums.sum(1) / counts.sum(1), predicted=predicted, stderr=stderr,
              jensen=jensen, tilt=tilt, tolerance=3 * stderr + jensen + tilt,
              alternatives=alternatives)


def test_layer0_swa_profile_follows_the_cross_moment_prediction_from_its_own_attention(layer0):
  """f(d) at the layer-0 mixer against G_Y = Σ_hh' A_h [Σ_u g_hh'(d, u) G_X(u)] A_h'ᵀ built from
  the layer's own attention probabilities a^h (the replica) and its input's cross-moments.

  Prediction, per pair: with i.i.d. tokens G_X(0) = Cov + μμᵀ and G_X(u ≠ 0) = μμᵀ, so for
  attention independent of the values E[y_i · y_k | a] = |μ A|² + Σ_hh' s_hh' ⟨a^h_i, a^h'_k⟩
  (A = Σ_h A_h, s_hh' = tr(A_hᵀ Cov A_h')): the trace of G_Y for that pair. The cosine of a pair
  is predicted as that over sqrt(E|y_i|² E|y_k|²), averaged over the pairs f(d) averages.

  At init the attention is not independent of the values: a^h_ij = softmax_j(x_j · b^h_ij), so
  the tokens one query attends are tilted together towards b̄^h_i and share a mean shift
  Cov b̄^h_i (`attended_mean`). That replaces |μ A|² by ȳ_i · ȳ_k. At the demo shape (logit std
  ≈ 1, ≈ 29 effective keys, D = 128) it raises E|y_i|² by ≈ 12% and lowers f(1) by ≈ 0.06, about
  twice the tolerance: the independence form alone is rejected (asserted below).

  Approximation bounds, added to 3 standard errors of measured − predicted (over the independent
  rows):
    * cosine vs ratio of expectations: for Gaussian y (a sum of ≈ 29 independent tokens) the
      delta method gives E cos − r = −r(1 − r²) κ / 2 + O(κ²), κ = tr(S²) / tr(S)² of a query's
      value covariance S_i = Σ_hh' ⟨a^h_i, a^h'_i⟩ A_hᵀ Cov A_h'; bounded by 0.2 max_i κ_i.
    * what the first-order tilt leaves out (the query's own token as a key, the softmax
      normaliser, one key under two tilts) carries one more attention weight per term: relative
      O(Σ_j a_ij²) of the correction; bounded by 2 mean(Σ_j a_ij²) |tilt correction|.
  Power: the same tolerance rejects uniform attention, the window halved or doubled (attention
  recomputed from the same q, k), and the independence form.
  """
  r = own_attention_comparison(layer0)
  error = np.abs(r["measured"] - r["predicted"])
  assert np.all(error <= r["tolerance"]), r
  assert np.max(r["tolerance"]) < 0.05, r["tolerance"]  # tight enough to tell the alternatives
  for name, alternative in r["alternatives"].items():
    assert np.any(np.abs(r["measured"] - alternative) > r["tolerance"]), (name, r)


def uniform_swa_cosine_and_bias(m, S0, nu, w, d):
  """Uniform SWA over i.i.d. values with mean ν (m = |ν|²) and covariance S0, full windows: the
  ratio r(d) = E[y_i · y_{i−d}] / E|y|² = ρ + (1 − ρ) [1 − d/w]_+ with floor ρ = m / (m + tr S0/w),
  and the second-order (Gaussian delta method) bias of E cos(y_i, y_{i−d}) against r(d).

  y = ν + g with Cov g = S = S0/w, Cov(g_i, g_{i−d}) = c S, c = [1 − d/w]_+. With N = y_i · y_{i−d},
  D_1, D_2 the squared norms, τ = tr S, q = tr S², p = νᵀ S ν: E N = m + cτ, E D = m + τ,
  Cov(N, D) = 2(1 + c)p + 2cq, Var D = 4p + 2q, Cov(D_1, D_2) = 4cp + 2c²q, and
  E[N / sqrt(D_1 D_2)] − r = −Cov(N, D)/E D² + (3/4) E N Var D / E D³ + (1/4) E N Cov(D_1, D_2)/E D³
  (= −r(1 − r²) q / (2τ²) when ν = 0).
  """
  c = theory.swa_cosine(d, w)
  S = S0 / w
  tau, q, pp = np.trace(S), np.trace(S @ S), nu @ S @ nu
  rho = m / (m + tau)
  n0, d0 = m + c * tau, m + tau
  cov_nd, var_d, cov_dd = 2 * (1 + c) * pp + 2 * c * q, 4 * pp + 2 * q, 4 * c * pp + 2 * c**2 * q
  bias = -cov_nd / d0**2 + 0.75 * n0 * var_d / d0**3 + 0.25 * n0 * cov_dd / d0**3
  return rho + (1 - rho) * c, rho, bias


def zero_query_comparison(p, lags=(1, 2, 4, 8, 16, 24, 32, 48, 56, 64, 96, 128)):
  """Measured f(d) at the layer-0 mixer with W_Q = 0, over full-window pairs, against the law
  (see the test below)."""
  y = p["y_uniform"]
  B, T = y.shape[:2]
  w = p["window"]
  A = p["A_NDD"].sum(0)
  nu, S0 = p["mu"] @ A, A.T @ p["cov"] @ A
  # Pairs (i, i − d) whose earlier token has a full window, i − d >= w − 1: all pairs of the
  # rows with their first w − 1 positions cut off.
  measured, stderr, pairs = recency.mean_and_stderr(*row_cosine_sums(y[:, w - 1:], lags))
  d = np.array(lags)
  assert np.all(pairs == B * (T - (w - 1) - d))
  predicted, rho, bias = uniform_swa_cosine_and_bias(nu @ nu, S0, nu, w, d)
  return dict(lags=d, window=w, measured=np.array(measured), predicted=predicted, rho=rho,
              bias=bias, stderr=stderr, tolerance=3 * stderr + np.abs(bias), alternatives={
                  "no floor": theory.swa_cosine(d, w),
                  "half window": uniform_swa_cosine_and_bias(nu @ nu, S0, nu, w // 2, d)[0],
                  "double window": uniform_swa_cosine_and_bias(nu @ nu, S0, nu, 2 * w, d)[0]})


def test_layer0_swa_with_zero_queries_follows_one_minus_d_over_w(layer0):
  """With W_Q = 0 every head attends uniformly inside the window, so the mixer output is
  y_i = (1/n_i) Σ_{i−w<j<=i} x_j A with A = Σ_h A_h: a moving average of i.i.d. values.

  For pairs whose earlier token already has a full window (i − d >= w − 1) the ratio of
  expectations is exactly ρ + (1 − ρ) c_SWA(d), c_SWA(d) = [1 − d/w]_+ (theory.swa_cosine): the
  law holds for the mean-free part, and the input's mean component μ adds the floor
  ρ = |μA|² / (|μA|² + tr(Aᵀ Cov A)/w) ≈ 0.16, computed from the table. The first w − 1 positions
  average fewer keys (n_i = i + 1): a different, position-dependent overlap, so those pairs are
  left out (the rows lose their first w − 1 positions), not absorbed in the tolerance.
  Tolerance: 3 standard errors over the independent rows + the derived second-order bias of a
  mean cosine against the ratio (`uniform_swa_cosine_and_bias`, ≤ 0.004 here; it accounts for
  the small-lag deviations, where the standard error is ≈ 1e-4). Power: the same tolerance
  rejects the law with the window halved or doubled and the law without the mean's floor.
  """
  r = zero_query_comparison(layer0)
  d, w, rho = r["lags"], r["window"], r["rho"]
  np.testing.assert_allclose(r["predicted"], rho + (1 - rho) * theory.swa_cosine(d, w))
  assert 0.1 < rho < 0.35, rho  # ≈ w / (w + V) = 0.2 for a random table: no small effect
  assert np.max(np.abs(r["bias"])) < 0.005, r["bias"]
  assert np.all(np.abs(r["measured"] - r["predicted"]) <= r["tolerance"]), r
  for name, alternative in r["alternatives"].items():
    assert np.any(np.abs(r["measured"] - alternative) > r["tolerance"]), (name, r)


def logit_gaps(seeds, layer=1):
  """Per init seed, layer `layer`'s logit gap ℓ(1) − ℓ(L) averaged over heads, as initialised and
  with W_K = W_Q, on the demo's recency probe (the eval rows the hook picks): [seeds, 2]."""
  config = demo.get_config()
  rows = {k: np.concatenate([b[k] for b in pipeline.eval_batches(config)])
          for k in ("inputs", "positions", "segment_ids")}
  doc_ids = probe.document_ids(rows["segment_ids"], rows["positions"])
  chosen = probe.choose_rows(doc_ids, config.metrics.probe_batch_size)
  batch = {k: jnp.asarray(v[chosen]) for k, v in rows.items()}
  lags = (1, config.metrics.far_lag)
  model = LanguageModel(config.model, rngs=nnx.Rngs(0))
  assert model.kinds[layer] == "G" and model.blocks[layer].attn.position == "nope"
  graphdef = nnx.split(model)[0]
  x_of = observer(model, {(layer, "pre_mixer_norm")})

  @jax.jit
  def gaps(state):
    x = x_of(state, batch["inputs"], batch["positions"], batch["segment_ids"])
    x = x[f"{layer}/pre_mixer_norm"]  # the layer's actual normalised input
    attn = nnx.merge(graphdef, state).blocks[layer].attn
    wq, wk = attn.wq_DNH[...], attn.wk_DKH[...]
    out = []
    for wk_ in (wk, wq):
      profile = recency.logit_profile(x, wq, wk_, lags, segment_ids=batch["segment_ids"])
      out.append(jnp.mean(profile[:, 0] - profile[:, 1]))
    return jnp.stack(out)

  return np.array([np.asarray(gaps(nnx.state(LanguageModel(config.model, rngs=nnx.Rngs(s)))))
                   for s in seeds])


def test_logit_gap_of_a_global_nope_layer_is_zero_in_expectation_at_init():
  """E[M] = 0 under independent zero-mean W_Q, W_K: the logit gap ℓ(1) − ℓ(L) of layer 1 (global
  NoPE), measured on the demo's own eval probe (pairs inside one document) from the layer's
  actual normalised input, averages to 0 over init seeds.

  For a fixed x the gap is ⟨ΔG, M_h⟩ with ΔG = G_X(1) − G_X(L) of the probe, and E[M_h | x] = 0
  because layer 1's W_Q and W_K are drawn independently of each other and of everything that
  makes x: the per-seed gaps are independent with mean exactly 0 (heads of one seed share x, so
  they are averaged per seed and the standard error is over seeds). Power: the same estimator
  with W_K = W_Q (M_h = W_Q,h W_Q,hᵀ / sqrt(H), positive semi-definite: its gap is positive
  wherever ΔG's symmetric part is, as the recency of text and of layer 0 makes it) is many
  standard errors from 0.
  """
  seeds = 24
  per_seed = logit_gaps(range(seeds))
  mean = per_seed.mean(0)
  stderr = per_seed.std(0, ddof=1) / np.sqrt(seeds)
  assert abs(mean[0]) < 3 * stderr[0], (mean, stderr)
  assert mean[1] > 10 * stderr[1], (mean, stderr)
