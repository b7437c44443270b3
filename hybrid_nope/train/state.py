"""Train state as plain pytrees: the model's graph is split off once; params are a nested dict."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from hybrid_nope.model import LanguageModel
from hybrid_nope.train import sharding


@struct.dataclass
class TrainState:
  step: jax.Array          # Number of optimizer updates applied so far.
  params: dict
  opt_state: optax.OptState


@dataclasses.dataclass(frozen=True)
class ModelDef:
  """The model's static structure; `apply` runs it on a params dict."""
  graphdef: nnx.GraphDef

  def bind(self, params: dict) -> LanguageModel:
    return nnx.merge(self.graphdef, params)

  def apply(self, params: dict, batch: dict) -> jax.Array:
    return self.bind(params)(batch["inputs"], positions_BT=batch["positions"],
                             segment_ids_BT=batch["segment_ids"])


def init_model(model_cfg, seed: int) -> tuple[ModelDef, dict]:
  model = LanguageModel(model_cfg, rngs=nnx.Rngs(params=seed))
  graphdef, state = nnx.split(model)
  return ModelDef(graphdef), nnx.to_pure_dict(state)


def init_train_state(model_cfg, tx: optax.GradientTransformation, seed: int):
  """Unsharded, on the default device: for tests and single-device tools."""
  model_def, params = init_model(model_cfg, seed)
  return model_def, TrainState(step=jnp.zeros((), jnp.int32), params=params,
                               opt_state=tx.init(params))


def sharded_train_state(model_cfg, tx: optax.GradientTransformation, seed: int, mesh):
  """(model_def, state, shardings): the state initialised directly in its shards, so no host
  or device ever holds the whole model; values equal init_train_state's."""
  model_def, _, shardings, init = _abstract(model_cfg, tx, seed, mesh)
  return model_def, jax.jit(init, out_shardings=shardings)(), shardings


def abstract_train_state(model_cfg, tx: optax.GradientTransformation, seed: int, mesh):
  """(model_def, state, shardings) with the state as ShapeDtypeStructs carrying their
  shardings: what jax.export lowers a train step for, without allocating anything."""
  model_def, abstract_state, shardings, _ = _abstract(model_cfg, tx, seed, mesh)
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       abstract_state, shardings)
  return model_def, state, shardings


def _abstract(model_cfg, tx, seed, mesh):
  abstract_model = nnx.eval_shape(lambda: LanguageModel(model_cfg, rngs=nnx.Rngs(params=seed)))
  model_def = ModelDef(nnx.split(abstract_model)[0])
  param_shardings = sharding.param_shardings(sharding.logical_param_specs(abstract_model), mesh)
  replicated = sharding.replicated(mesh)

  def init():
    return init_train_state(model_cfg, tx, seed)[1]

  abstract_state = jax.eval_shape(init)
  shardings = TrainState(
      step=replicated, params=param_shardings,
      # Optimizer moments shard like their parameters; counters are replicated.
      opt_state=optax.tree_map_params(tx, lambda _, s: s, abstract_state.opt_state,
                                      param_shardings, transform_non_params=lambda _: replicated))
  return model_def, abstract_state, shardings, init
