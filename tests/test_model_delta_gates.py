"""The D layer's published gate forms against their formulas written out in numpy, their
initialisation against the papers' ranges, the query scale against the norm's eps, and the
option checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_nope.model.delta import DeltaAttention, check_shape

D, N, K, H = 16, 2, 2, 4


def layer(**options):
  options.setdefault("gate", {"kda": "channel"}.get(options.get("gate_form"), "head"))
  return DeltaAttention(d_model=D, num_heads=N, num_kv_heads=K, head_dim=H, norm_eps=1e-5,
                        impl="xla", dtype=jnp.float32, rngs=nnx.Rngs(3), **options)


def softplus(x):
  return np.logaddexp(0.0, x)


def x_input(T=6, seed=0):
  return np.random.default_rng(seed).normal(size=(2, T, D)).astype(np.float32)


def test_mamba2_gate_is_minus_exp_a_log_times_softplus():
  m, x = layer(gate_form="mamba2"), x_input()
  want = (-np.exp(np.asarray(m.a_log_K[...]))
          * softplus(x @ np.asarray(m.w_decay_DK[...]) + np.asarray(m.dt_bias_K[...])))
  np.testing.assert_allclose(m.log_decay(jnp.asarray(x)), want, rtol=2e-6, atol=1e-7)


def test_kda_gate_is_per_channel_low_rank_with_a_per_head():
  m, x = layer(gate_form="kda"), x_input()
  logits = x @ np.asarray(m.w_decay_down_DR[...]) @ np.asarray(m.w_decay_up_RKH[...]).reshape(
      H, K * H)
  want = (-np.exp(np.asarray(m.a_log_K[...]))[:, None]
          * softplus(logits.reshape(2, -1, K, H) + np.asarray(m.dt_bias_KH[...])))
  got = m.log_decay(jnp.asarray(x))
  assert got.shape == (2, 6, K, H)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["mamba2", "kda"])
def test_the_published_init_spans_mamba2s_ranges(form):
  """A ~ U(1, 16) and softplus(dt_bias) = dt in [1e-3, 1e-1] (the inverse softplus is exact),
  so with a zero input α = exp(−A dt) lies in [exp(−1.6), exp(−1e-3)] = [0.20, 0.999]."""
  ms = [DeltaAttention(d_model=D, num_heads=8, num_kv_heads=8, head_dim=H, norm_eps=1e-5,
                       impl="xla", dtype=jnp.float32, rngs=nnx.Rngs(seed), gate_form=form,
                       gate="channel" if form == "kda" else "head") for seed in range(8)]
  a = np.exp(np.concatenate([np.asarray(m.a_log_K[...]).ravel() for m in ms]))
  bias = np.concatenate([np.asarray((m.dt_bias_KH if form == "kda" else m.dt_bias_K)[...]).ravel()
                         for m in ms])
  dt = softplus(bias.astype(np.float64))
  assert a.min() >= 1.0 and a.max() <= 16.0 and a.max() - a.min() > 10
  assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
  assert np.log(dt).max() - np.log(dt).min() > 0.8 * np.log(100)  # log-uniform over 2 decades
  for m in ms:
    a_h = np.exp(np.asarray(m.a_log_K[...], np.float64))
    dt_h = softplus(np.asarray((m.dt_bias_KH if form == "kda" else m.dt_bias_K)[...], np.float64))
    want = np.exp(-(a_h[:, None] if form == "kda" else a_h) * dt_h)
    alpha0 = np.exp(np.asarray(m.log_decay(jnp.zeros((1, 1, D)))[0, 0], np.float64))
    np.testing.assert_allclose(alpha0, want, rtol=1e-5)
    assert 0.19 < alpha0.min() and alpha0.max() < 0.9991


def test_kda_output_gate_is_a_low_rank_sigmoid_with_bias():
  m, x = layer(gate_form="kda"), x_input()
  m.out_gate_bias_NH[...] = jnp.asarray(np.random.default_rng(1).normal(size=(N, H)),
                                        jnp.float32)
  from hybrid_nope.model import delta_gates
  low = x @ np.asarray(m.w_out_gate_down_DR[...])
  want = 1 / (1 + np.exp(-(low @ np.asarray(m.w_out_gate_up_RNH[...]).reshape(H, N * H)
                           ).reshape(2, -1, N, H) - np.asarray(m.out_gate_bias_NH[...])))
  np.testing.assert_allclose(delta_gates.output_gate(m, "kda", jnp.asarray(x), jnp.float32),
                             want, rtol=1e-5, atol=1e-6)
  assert not hasattr(m, "w_out_gate_DNH")


def test_the_query_scale_acts_before_the_output_norm():
  """o ↦ RMSNorm(s·o; eps) equals RMSNorm(o; eps / s²): a layer with the published scale
  1/sqrt(d_k) equals the unscaled layer whose norm eps is d_k times larger, and differs from
  the unscaled layer itself (the scale is not a no-op under the norm)."""
  x = jnp.asarray(x_input(T=12) * 1e-2)  # low-norm outputs, where eps matters
  scaled, plain = layer(qk_scale="1/sqrt(d_k)"), layer()
  y_scaled = scaled(x, positions_BT=None, segment_ids_BT=None)
  plain.norm_eps = 1e-5 * H
  np.testing.assert_allclose(y_scaled, plain(x, positions_BT=None, segment_ids_BT=None),
                             rtol=2e-4, atol=1e-7)
  plain.norm_eps = 1e-5
  assert not np.allclose(y_scaled, plain(x, positions_BT=None, segment_ids_BT=None), rtol=1e-3)


def test_allow_neg_eigval_doubles_beta():
  x = jnp.asarray(x_input())
  twice, once = layer(allow_neg_eigval=True), layer()
  np.testing.assert_allclose(twice.beta(x), 2 * once.beta(x), rtol=1e-7)
  assert float(twice.beta(x).max()) > 1.0


@pytest.mark.parametrize("options, key", [
    (dict(gate_form="mamba2", gate="channel"), "model.delta_gate="),
    (dict(gate_form="kda", gate="head"), "model.delta_gate="),
    (dict(gate_form="mamba"), "model.delta_gate_form="),
    (dict(qk_scale="sqrt"), "model.delta_qk_scale="),
    (dict(expand_v=0), "model.delta_expand_v="),
    (dict(v_heads=3), "model.delta_v_heads="),
    (dict(v_heads=4, num_heads=4), "model.delta_v_heads="),  # GVA beside GQA
])
def test_bad_options_are_refused_naming_the_key(options, key):
  args = dict(gate_form="gla", gate="head", num_heads=2, num_kv_heads=2, v_heads=0, expand_v=1,
              qk_scale="1")
  args.update(options)
  with pytest.raises(ValueError, match=key.replace(".", r"\.")):
    check_shape(**args)


def test_config_validation_names_the_delta_key():
  from hybrid_nope.errors import ConfigError
  from hybrid_nope.validate import validate
  from tests.helpers import tiny_config
  config = tiny_config(model__pattern="DG", model__num_layers=2,
                       model__delta_gate_form="mamba2", model__delta_gate="channel")
  with pytest.raises(ConfigError, match=r"model\.delta_gate="):
    validate(config, check_paths=False)
  # Options of a D layer do not matter to a pattern without one.
  validate(tiny_config(model__pattern="SG", model__num_layers=2, model__delta_v_heads=3),
           check_paths=False)


def test_the_published_configs_build_their_forms():
  from configs import gdn_120m, kda_120m
  gdn, kda = gdn_120m.get_config().model, kda_120m.get_config().model
  assert (gdn.delta_gate_form, gdn.delta_expand_v, gdn.delta_qk_scale) == (
      "mamba2", 2, "1/sqrt(d_k)")
  assert (kda.delta_gate_form, kda.delta_gate, kda.pattern) == ("kda", "channel", "DDDG")
  from configs import small
  assert small.get_config("gdn").model.delta_gate_form == "gla"  # comparable with its sweep
