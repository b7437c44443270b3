import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hybrid_nope.train.optimizer import make_optimizer, weight_decay_mask
from hybrid_nope.model.definition import init_model
from tests.helpers import tiny_config


def test_decay_only_on_projection_matrices():
  _, params = init_model(tiny_config(model__tie_embeddings=False).model, seed=0)
  mask = weight_decay_mask(params)
  assert mask["embed"]["embedding_VD"] is False
  assert mask["final_norm"]["scale_D"] is False
  block = mask["blocks"][0]
  assert block["attn_norm"]["scale_D"] is False and block["mlp_norm"]["scale_D"] is False
  assert block["attn"]["wq_DNH"] is True and block["mlp"]["w_down_FD"] is True
  assert mask["head_DV"] is True


def test_weight_decay_applies_where_masked():
  c = tiny_config(train__weight_decay=0.5, train__warmup_steps=0, train__learning_rate=0.1,
                  train__schedule="constant").train
  _, params = init_model(tiny_config().model, seed=0)
  tx = make_optimizer(c)
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  # With zero gradients, Adam's part is 0 and only decoupled weight decay moves parameters.
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  norm_update = updates["final_norm"]["scale_D"]
  proj_update = updates["blocks"][0]["attn"]["wq_DNH"]
  np.testing.assert_array_equal(norm_update, 0.0)
  expected = -0.1 * 0.5 * params["blocks"][0]["attn"]["wq_DNH"]
  np.testing.assert_allclose(proj_update, expected, rtol=1e-5)


def test_gradients_are_clipped_to_global_norm():
  c = tiny_config(train__grad_clip=1.0).train
  grads = {"a": jnp.full((10,), 100.0)}
  clipped, _ = optax.clip_by_global_norm(c.grad_clip).update(grads, None)
  assert float(optax.tree.norm(clipped)) == pytest.approx(1.0)
  # The optimizer's first transformation is that clip: a huge gradient gives a bounded update.
  _, params = init_model(tiny_config().model, seed=0)
  tx = make_optimizer(tiny_config(train__warmup_steps=0).train)
  huge = jax.tree.map(lambda p: jnp.full_like(p, 1e6), params)
  state = tx.init(params)
  _, state_after = tx.update(huge, state, params)
  first_moment = state_after[1][0].mu
  total = optax.tree.norm(first_moment)
  assert float(total) == pytest.approx((1 - 0.9) * 1.0, rel=1e-4)


def moments(state):
  adam = state[1][0]
  return jax.tree.leaves(adam.mu) + jax.tree.leaves(adam.nu)


@pytest.mark.parametrize("param_dtype, opt_state_dtype", [("float32", "bfloat16"),
                                                         ("bfloat16", "float32")])
def test_adams_moments_are_stored_in_opt_state_dtype_whatever_the_params(param_dtype,
                                                                         opt_state_dtype):
  config = tiny_config(model__param_dtype=param_dtype, train__opt_state_dtype=opt_state_dtype)
  _, params = init_model(config.model, seed=0)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(param_dtype)}
  tx = make_optimizer(config.train)
  state = tx.init(params)
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e-3, jnp.float32), params)
  for _ in range(2):  # Stays so across updates (optax casts the moments back each time).
    assert {x.dtype for x in moments(state)} == {jnp.dtype(opt_state_dtype)}
    updates, state = jax.jit(tx.update)(grads, state, params)
    params = optax.apply_updates(params, updates)
  assert {x.dtype for x in moments(state)} == {jnp.dtype(opt_state_dtype)}
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(param_dtype)}
  # The first moment after two equal gradients g: (1 - b1²)·g, rounded to the storage dtype.
  mu = jax.tree.leaves(state[1][0].mu)[0]
  np.testing.assert_allclose(np.asarray(mu, np.float64), (1 - 0.9 ** 2) * 1e-3, rtol=1e-2)
