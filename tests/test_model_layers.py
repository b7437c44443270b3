import numpy as np
import pytest
import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_nope.model.layers import (RMSNorm, SwiGLU, apply_rope, default_init, logical_axes,
                                      param, project)


def test_rmsnorm_matches_numpy():
  norm = RMSNorm(16, eps=1e-6, rngs=nnx.Rngs(0))
  norm.scale_D[...] = jnp.linspace(0.5, 2.0, 16)
  x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32) * 5
  want = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.linspace(0.5, 2.0, 16)
  np.testing.assert_allclose(norm(jnp.asarray(x)), want, rtol=1e-5, atol=1e-6)


def test_rmsnorm_scale_gradient_matches_numpy():
  norm = RMSNorm(16, eps=1e-6, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  x, g = (rng.standard_normal((2, 3, 16)).astype(np.float32) for _ in range(2))
  grads = nnx.grad(lambda m: jnp.sum(m(jnp.asarray(x)) * g))(norm)
  want = (g * x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)).sum((0, 1))
  np.testing.assert_allclose(grads.scale_D[...], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape,w_shape,contract,spec", [
    ((2, 5, 4), (4, 3, 2), 1, "btd,dnh->btnh"),
    ((2, 5, 3, 2), (3, 2, 4), 2, "btnh,nhd->btd"),
    ((1, 7, 4), (4, 6), 1, "btd,dv->btv"),
])
def test_project_matches_einsum(x_shape, w_shape, contract, spec):
  rng = np.random.default_rng(2)
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal(w_shape).astype(np.float32)
  np.testing.assert_allclose(project(jnp.asarray(x), jnp.asarray(w), contract),
                             np.einsum(spec, x, w), rtol=1e-5, atol=1e-5)


def test_swiglu_matches_numpy():
  mlp = SwiGLU(8, 12, dtype=jnp.float32, rngs=nnx.Rngs(1))
  x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
  g = x @ np.asarray(mlp.w_gate_DF[...])
  u = x @ np.asarray(mlp.w_up_DF[...])
  want = (g / (1 + np.exp(-g)) * u) @ np.asarray(mlp.w_down_FD[...])
  np.testing.assert_allclose(mlp(jnp.asarray(x)), want, rtol=1e-5, atol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)

  def score(i, j):
    qi = apply_rope(q, jnp.array([[i]]), 10000.0)
    kj = apply_rope(k, jnp.array([[j]]), 10000.0)
    return float(jnp.sum(qi * kj))

  assert score(5, 2) == pytest.approx(score(105, 102), rel=1e-4)
  assert score(5, 2) != pytest.approx(score(5, 4), rel=1e-2)
  # Position 0 is the identity rotation, and rotations preserve norms.
  np.testing.assert_allclose(apply_rope(q, jnp.array([[0]]), 1e4), q, rtol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(apply_rope(q, jnp.array([[37]]), 1e4)),
                             jnp.linalg.norm(q), rtol=1e-5)


def test_param_fan_in_over_several_axes():
  p = param(nnx.Rngs(0), default_init, (64, 32, 16), ("heads", "kv", "embed"), in_axes=(0, 1))
  assert logical_axes(p) == ("heads", "kv", "embed")
  assert p[...].dtype == jnp.float32
  # Fan-in is 64*32, so the variance is about 1/2048, not 1/64.
  assert np.var(np.asarray(p[...])) == pytest.approx(1 / 2048, rel=0.1)


def test_param_draws_compile_once_per_distribution_whatever_the_depth_or_shapes():
  """Built eagerly, a model compiles one draw per distribution (truncated normal for weights,
  normal for the embedding), not per layer or shape (issue 48: one jitted graph of every draw
  compiled in 9 CPU-seconds at 120m)."""
  from configs import demo
  from hybrid_nope.model import param_draw
  from hybrid_nope.model.definition import init_model

  def programs(num_layers, pattern):
    config = demo.get_config().model
    config.pattern, config.num_layers = pattern, num_layers
    param_draw._block.clear_cache()
    init_model(config, 0)
    return param_draw._block._cache_size()

  assert programs(2, "SG") == programs(8, "SG") == programs(4, "SGLD") == 2


def test_param_draw_is_the_same_traced_or_not():
  """The cached draw gives the values of the draw inlined into a jitted graph, bit for bit."""
  def draw():
    return param(nnx.Rngs(params=3), default_init, (8, 2, 4), ("heads", "kv", "embed"),
                 in_axes=(0, 1))[...]

  np.testing.assert_array_equal(draw(), jax.jit(draw)())
