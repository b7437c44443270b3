import jax
import numpy as np
import pytest

from configs import demo
from hybrid_nope.model.definition import init_model
from hybrid_nope.train import sharding
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train.state import abstract_train_state, sharded_train_state


def _config(pattern):
  config = demo.get_config()
  config.model.pattern, config.model.num_layers = pattern, 2 * len(pattern)
  return config


@pytest.mark.parametrize("pattern", ["S", "G", "L", "D", "SGLD"])
def test_sharded_state_equals_the_one_graph_init_bit_for_bit(pattern):
  """The trainer's init, built eagerly, draws what one jitted graph of every draw (its
  `jit_init` before issue 48) drew for the same seed, in every layer kind."""
  config = _config(pattern)
  mesh = sharding.make_mesh(config)
  _, state, _ = sharded_train_state(config.model, make_optimizer(config.train), 5, mesh)
  reference = jax.jit(lambda: init_model(config.model, 5)[1])()
  leaves = jax.tree.leaves_with_path(reference)
  assert jax.tree.structure(state.params) == jax.tree.structure(reference)
  for (path, want), got in zip(leaves, jax.tree.leaves(state.params)):
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), jax.tree_util.keystr(path)


def test_sharded_state_has_its_shardings_and_a_zero_optimizer_state():
  config = _config("SG")
  tx = make_optimizer(config.train)
  mesh = sharding.make_mesh(config)
  _, state, shardings = sharded_train_state(config.model, tx, 0, mesh)
  _, abstract, _ = abstract_train_state(config.model, tx, 0, mesh)
  assert jax.tree.map(lambda x: x.sharding, state) == shardings
  assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == jax.tree.map(
      lambda x: (x.shape, x.dtype), abstract)
  assert int(state.step) == 0
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
  assert moments and all(not np.any(np.asarray(x)) for x in moments)
