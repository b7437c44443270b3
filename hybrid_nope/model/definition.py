"""The model as training and analysis both hold it: a static graph and a params dict."""
from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from hybrid_nope.model.transformer import LanguageModel


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


def abstract_model(model_cfg, seed: int = 0) -> LanguageModel:
  """The model with shapes and dtypes only (nnx.eval_shape): cheap at any size."""
  return nnx.eval_shape(lambda: LanguageModel(model_cfg, rngs=nnx.Rngs(params=seed)))


def model_definition(model_cfg) -> ModelDef:
  """The model's graph without its parameters."""
  return ModelDef(nnx.split(abstract_model(model_cfg))[0])


def abstract_params(model_cfg, seed: int = 0) -> dict:
  """Shapes and dtypes of the params `init_model` builds, without allocating them."""
  return jax.eval_shape(lambda: init_model(model_cfg, seed)[1])
