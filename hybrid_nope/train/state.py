"""Train state as plain pytrees (the model's graph and params: hybrid_nope.model.definition)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hybrid_nope.model.definition import ModelDef, abstract_model, init_model
from hybrid_nope.train import sharding
from hybrid_nope.run.checkpoint import TrainState
from hybrid_nope.train.fresh_opt_state import fresh_opt_state


def init_train_state(model_cfg, tx: optax.GradientTransformation, seed: int):
  """Unsharded, on the default device: for tests and single-device tools."""
  model_def, params = init_model(model_cfg, seed)
  return model_def, _fresh_state(params, tx)


def _fresh_state(params: dict, tx: optax.GradientTransformation) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def sharded_train_state(model_cfg, tx: optax.GradientTransformation, seed: int, mesh):
  """(model_def, state, shardings): the state initialised directly in its shards, so no host
  or device ever holds the whole model; values equal init_train_state's."""
  model_def, _, shardings = _abstract(model_cfg, tx, seed, mesh)
  # The model built eagerly, not as one jitted graph of every draw: model.layers.param
  # compiles a draw per distinct parameter shape and places it in its shards. The few values
  # not drawn in their shards (norm scales, gate constants) are moved there; the optimizer's
  # state is made in its shards on the host (fresh_opt_state), with no program per shape.
  with sharding.activation_rules(mesh):
    params = jax.device_put(init_model(model_cfg, seed)[1], shardings.params)
    state = TrainState(step=jax.device_put(np.zeros((), np.int32), shardings.step),
                       params=params,
                       opt_state=fresh_opt_state(tx, params, shardings.opt_state))
  return model_def, state, shardings


def abstract_train_state(model_cfg, tx: optax.GradientTransformation, seed: int, mesh):
  """(model_def, state, shardings) with the state as ShapeDtypeStructs carrying their
  shardings: what jax.export lowers a train step for, without allocating anything."""
  model_def, abstract_state, shardings = _abstract(model_cfg, tx, seed, mesh)
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       abstract_state, shardings)
  return model_def, state, shardings


def _abstract(model_cfg, tx, seed, mesh):
  model = abstract_model(model_cfg, seed)
  model_def = ModelDef(nnx.split(model)[0])
  param_shardings = sharding.param_shardings(sharding.logical_param_specs(model), mesh)
  replicated = sharding.replicated(mesh)

  def init():
    return init_train_state(model_cfg, tx, seed)[1]

  abstract_state = jax.eval_shape(init)
  shardings = TrainState(
      step=replicated, params=param_shardings,
      # Optimizer moments shard like their parameters; counters are replicated.
      opt_state=optax.tree_map_params(tx, lambda _, s: s, abstract_state.opt_state,
                                      param_shardings, transform_non_params=lambda _: replicated))
  return model_def, abstract_state, shardings
