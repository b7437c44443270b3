import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hybrid_nope.train.optimizer import learning_rate_schedule, make_optimizer, weight_decay_mask
from hybrid_nope.model.definition import init_model
from tests.helpers import tiny_config


def test_schedule_warms_up_then_decays_to_the_floor():
  c = tiny_config(train__steps=100, train__warmup_steps=10, train__learning_rate=1e-3,
                  train__min_learning_rate_ratio=0.1).train
  lr = learning_rate_schedule(c)
  assert float(lr(0)) == 0.0
  assert float(lr(10)) == pytest.approx(1e-3)
  assert float(lr(5)) == pytest.approx(5e-4)
  values = [float(lr(s)) for s in range(10, 101)]
  assert all(a >= b for a, b in zip(values, values[1:]))
  assert values[-1] == pytest.approx(1e-4)


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
  c = tiny_config(train__weight_decay=0.5, train__warmup_steps=0, train__learning_rate=0.1).train
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
