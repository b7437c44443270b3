"""Jittable train and eval steps."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

import numpy as np

from hybrid_nope.train.loss import cross_entropy_by_bucket, cross_entropy_sums
from hybrid_nope.train.state import ModelDef, TrainState


def make_train_step(model_def: ModelDef, tx: optax.GradientTransformation, schedule):
  def loss_fn(params, batch):
    logits_BTV = model_def.apply(params, batch)
    loss_sum, weight_sum = cross_entropy_sums(logits_BTV, batch["targets"], batch["weights"])
    return loss_sum / jnp.maximum(weight_sum, 1.0)

  def train_step(state: TrainState, batch: dict):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "learning_rate": schedule(state.step)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def make_eval_step(model_def: ModelDef, bucket_T: np.ndarray):
  """Eval returns per-position-bucket sums (loss, weight); `bucket_T` maps index -> bucket."""
  num_buckets = int(bucket_T.max()) + 1

  def eval_step(params, batch):
    logits_BTV = model_def.apply(params, batch)
    return cross_entropy_by_bucket(logits_BTV, batch["targets"], batch["weights"],
                                   jnp.asarray(bucket_T), num_buckets)
  return eval_step
