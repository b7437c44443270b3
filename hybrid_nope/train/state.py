"""Train state as plain pytrees: the model's graph is split off once; params are a nested dict."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from hybrid_nope.model import LanguageModel


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
  model_def, params = init_model(model_cfg, seed)
  return model_def, TrainState(step=jnp.zeros((), jnp.int32), params=params,
                               opt_state=tx.init(params))
