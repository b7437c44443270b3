"""The model as training and analysis both hold it: a static graph and a params dict."""
from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from hybrid_nope.model import head, loss
from hybrid_nope.model.transformer import LanguageModel


@dataclasses.dataclass(frozen=True)
class ModelDef:
  """The model's static structure; `apply` runs it on a params dict."""
  graphdef: nnx.GraphDef

  def bind(self, params: dict) -> LanguageModel:
    return nnx.merge(self.graphdef, params)

  def apply(self, params: dict, batch: dict, observe=None) -> jax.Array:
    """Float32 logits [B, T, V]; `observe` as LanguageModel's (a hook or an intervention)."""
    return self.bind(params)(batch["inputs"], positions_BT=batch["positions"],
                             segment_ids_BT=batch["segment_ids"], observe=observe)

  def objective_sums(self, params: dict, batch: dict, z_loss: float = 0.0):
    """(objective, sums): the train step's objective Σ weight · (loss + z_loss · log²Z) to
    differentiate, and loss.objective_sums' float32 sums. model.loss_block > 0 runs the head
    and loss in blocks of that many positions (model/head.py), never holding [B, T, V]."""
    model = self.bind(params)
    if not model.loss_block:
      sums = loss.objective_sums(self.apply(params, batch), batch["targets"], batch["weights"],
                                 z_loss)
      return sums["loss"] + sums["z_loss"], sums
    w_DV, scale = model.unembedding()
    return head.objective_sums(self._features(model, batch), w_DV, batch["targets"],
                               batch["weights"], z_loss=z_loss, block=model.loss_block,
                               scale=scale, dtype=model.head_dtype)

  def token_losses(self, params: dict, batch: dict, observe=None):
    """(token loss × weight [B, T], weight [B, T]) in float32, the forward pass only; in
    blocks where model.loss_block says so (eval, checkpoint analysis and its interventions,
    through `observe`, alike)."""
    model = self.bind(params)
    if not model.loss_block:
      return loss.weighted_token_losses(self.apply(params, batch, observe), batch["targets"],
                                        batch["weights"])
    w_DV, scale = model.unembedding()
    return head.token_losses(self._features(model, batch, observe), w_DV, batch["targets"],
                             batch["weights"], block=model.loss_block, scale=scale,
                             dtype=model.head_dtype)

  @staticmethod
  def _features(model: LanguageModel, batch: dict, observe=None) -> jax.Array:
    return model.features(batch["inputs"], positions_BT=batch["positions"],
                          segment_ids_BT=batch["segment_ids"], observe=observe)


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
