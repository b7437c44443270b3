"""Jittable train and eval steps."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

import numpy as np

from hybrid_nope.model.loss import cross_entropy_by_bucket, cross_entropy_sums
from hybrid_nope.model.definition import ModelDef
from hybrid_nope.train.state import TrainState


def all_finite(tree) -> jax.Array:
  """True where every element of every leaf is finite (a scalar bool)."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def make_train_step(model_def: ModelDef, tx: optax.GradientTransformation, schedule):
  """(state, batch) -> (state, metrics). An update whose parameters or optimizer state would
  not be finite is refused: the state comes back unchanged and `update_finite` is False, so a
  checkpoint never holds non-finite values; the loop stops on it before saving."""
  def loss_fn(params, batch):
    logits_BTV = model_def.apply(params, batch)
    loss_sum, weight_sum = cross_entropy_sums(logits_BTV, batch["targets"], batch["weights"])
    return loss_sum / jnp.maximum(weight_sum, 1.0)

  def train_step(state: TrainState, batch: dict):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = all_finite((params, opt_state)) & jnp.isfinite(loss)
    keep = lambda new, old: jnp.where(finite, new, old)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "learning_rate": schedule(state.step), "update_finite": finite}
    return state.replace(step=state.step + finite.astype(state.step.dtype),
                         params=jax.tree.map(keep, params, state.params),
                         opt_state=jax.tree.map(keep, opt_state, state.opt_state)), metrics

  return train_step


def make_eval_step(model_def: ModelDef, bucket_T: np.ndarray):
  """Eval returns per-position-bucket sums (loss, weight); `bucket_T` maps index -> bucket."""
  num_buckets = int(bucket_T.max()) + 1

  def eval_step(params, batch):
    logits_BTV = model_def.apply(params, batch)
    return cross_entropy_by_bucket(logits_BTV, batch["targets"], batch["weights"],
                                   jnp.asarray(bucket_T), num_buckets)
  return eval_step
