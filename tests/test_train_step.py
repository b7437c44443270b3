import jax
import numpy as np

from hybrid_nope.data import pipeline
from hybrid_nope.train.optimizer import learning_rate_schedule, make_optimizer
from hybrid_nope.train.state import init_train_state
from hybrid_nope.train.step import make_eval_step, make_train_step
from tests.helpers import tiny_config


def test_steps_on_a_fixed_batch_reduce_loss():
  config = tiny_config(train__warmup_steps=0, train__learning_rate=3e-3, train__steps=30)
  tx = make_optimizer(config.train)
  model_def, state = init_train_state(config.model, tx, seed=0)
  batch = next(pipeline.train_iterator(config))
  step = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train)))
  eval_step = jax.jit(make_eval_step(model_def, np.zeros(config.data.seq_len, np.int32)))
  loss_sum, weight_sum = (float(a[0]) for a in eval_step(state.params, batch))
  losses = []
  for _ in range(15):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  # The first step's loss is the loss at init, as the eval step computes it.
  np.testing.assert_allclose(losses[0], loss_sum / weight_sum, rtol=1e-5)
  assert int(state.step) == 15
  assert losses[-1] < 0.7 * losses[0], losses


import pytest  # noqa: E402


@pytest.mark.parametrize("bad", [dict(train__b2=float("nan")),
                                 dict(train__weight_decay=float("nan")),
                                 dict(train__learning_rate=1e30)])
def test_a_non_finite_update_returns_the_old_state_and_says_so(bad):
  """The step-level guard that test_train_loop's end-to-end cases rely on: the update is taken
  only if the new params, optimizer state and loss are all finite."""
  config = tiny_config(train__warmup_steps=0, **bad)
  tx = make_optimizer(config.train)
  model_def, state = init_train_state(config.model, tx, seed=0)
  batch = next(pipeline.train_iterator(config))
  step = jax.jit(make_train_step(model_def, tx, learning_rate_schedule(config.train)))
  before = jax.tree.map(np.asarray, state)
  for _ in range(2):  # lr=1e30 overflows on the second step, once the moments hold a gradient.
    state, metrics = step(state, batch)
  assert not bool(metrics["update_finite"])
  after = jax.tree.map(np.asarray, state)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(after.params))
  assert int(after.step) <= 1
  if int(after.step) == 0:  # Refused from the first step: nothing moved.
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before.params),
                                                     jax.tree.leaves(after.params)))
