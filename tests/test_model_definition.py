"""ModelDef and the model built concretely or abstractly: the same graph, the same shapes."""
import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.data.pipeline import loader
from hybrid_nope.model.definition import abstract_params, init_model, model_definition
from tests.helpers import tiny_config


def test_the_abstract_model_matches_the_initialised_one():
  config = tiny_config()
  model_def, params = init_model(config.model, seed=3)
  shapes = jax.tree.map(lambda x: (x.shape, x.dtype), params)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), abstract_params(config.model, 3)) == shapes
  batch = {k: jnp.asarray(v) for k, v in loader.eval_batches(config)[0].items()}
  # A graph built without parameters runs the initialised parameters identically.
  np.testing.assert_array_equal(model_definition(config.model).apply(params, batch),
                                model_def.apply(params, batch))
  other_seed = init_model(config.model, seed=4)[1]
  assert not np.array_equal(model_def.apply(other_seed, batch), model_def.apply(params, batch))
