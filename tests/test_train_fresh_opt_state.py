import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import demo

from hybrid_nope.train.fresh_opt_state import fresh_opt_state
from hybrid_nope.train.optimizer import make_optimizer

PARAMS = {"layer": {"w_DF": jnp.full((6, 10), 0.5), "w_FD": jnp.full((10, 6), -0.5),
                    "scale_D": jnp.ones((6,))},
          "embedding_VD": jnp.full((12, 6), 2.0)}
LOWERINGS = "/jax/core/compile/jaxpr_to_mlir_module_duration"


def _replicated_like(tree):
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda _: sharding, tree)


def _assert_same(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert (g.shape, g.dtype) == (w.shape, w.dtype)
    assert np.asarray(g).tobytes() == np.asarray(w).tobytes()


def _train_cfg(opt_state_dtype):
  config = demo.get_config()
  config.train.opt_state_dtype = opt_state_dtype
  return config.train


@pytest.mark.parametrize("opt_state_dtype", ["float32", "bfloat16"])
def test_the_trainers_optimizer_state_equals_tx_init(opt_state_dtype):
  tx = make_optimizer(_train_cfg(opt_state_dtype))
  want = tx.init(PARAMS)
  _assert_same(fresh_opt_state(tx, PARAMS, _replicated_like(want)), want)


def test_a_state_that_follows_the_parameters_is_built_by_tx_init():
  """A leaf equal to its parameter (an average of the weights, say) is not a constant fill."""
  tx = optax.chain(optax.adam(1e-3), optax.GradientTransformation(
      lambda params: jax.tree.map(lambda p: 2 * p, params), lambda u, s, p=None: (u, s)))
  want = tx.init(PARAMS)
  _assert_same(fresh_opt_state(tx, PARAMS, _replicated_like(want)), want)


def test_a_mask_that_sees_shapes_falls_back_to_tx_init():
  """The stand-ins have every dimension 1: a mask on sizes sees another tree there."""
  tx = optax.masked(optax.adam(1e-3), lambda params: jax.tree.map(lambda p: p.size > 50, params))
  want = tx.init(PARAMS)
  _assert_same(fresh_opt_state(tx, PARAMS, _replicated_like(want)), want)


def _lowerings_of_fresh_state(shapes: int) -> int:
  params = {f"w{i}": jnp.ones((3 + i, 4)) for i in range(shapes)}
  tx = optax.adam(1e-3)
  shardings = _replicated_like(jax.eval_shape(tx.init, params))
  lowered = []
  listener = lambda name, *_, **__: lowered.append(name) if name == LOWERINGS else None
  jax.clear_caches()
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    state = fresh_opt_state(tx, params, shardings)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  _assert_same(state, tx.init(params))
  return len(lowered)


def test_no_program_per_parameter_shape():
  """Built by tx.init eagerly, every distinct moment shape lowers a fill program."""
  assert _lowerings_of_fresh_state(3) == _lowerings_of_fresh_state(9)
