"""Jittable train and eval steps."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

import numpy as np

from hybrid_nope.model.loss import OBJECTIVE_SUMS, sums_by_bucket
from hybrid_nope.model.definition import ModelDef
from hybrid_nope.train.optimizer import learning_rate_schedule
from hybrid_nope.train.state import TrainState


def all_finite(tree) -> jax.Array:
  """True where every element of every leaf is finite (a scalar bool)."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def microbatches(batch: dict, count: int) -> dict:
  """Each [B, T] array as [count, B / count, T]: microbatch i holds rows i, i + count, ...
  Rows of a batch sharded over devices in contiguous blocks then keep each microbatch spread
  over every device (given B / count divisible by the data-parallel size), not on a few."""
  def split(x):
    rows = x.shape[0]
    return jnp.moveaxis(x.reshape(rows // count, count, *x.shape[1:]), 1, 0)
  return {k: split(v) for k, v in batch.items()}


def make_train_step(model_def: ModelDef, tx: optax.GradientTransformation, schedule,
                    grad_accum_steps: int = 1, z_loss: float = 0.0):
  """(state, batch) -> (state, metrics). An update whose parameters or optimizer state would
  not be finite is refused: the state comes back unchanged and `update_finite` is False, so a
  checkpoint never holds non-finite values; the loop stops on it before saving.

  `grad_accum_steps` > 1 splits the batch into that many microbatches (`microbatches`), scanned
  in one step, for one update. The loss and its gradient are token-weighted over the whole
  batch: sums over every microbatch, divided once by the batch's total weight, so microbatches
  holding different token counts (documents, padding) weigh as their tokens do, exactly as
  with grad_accum_steps = 1. Gradients are summed and handed to the optimizer in float32
  whatever model.param_dtype stores the parameters in.

  `z_loss` > 0 adds train.z_loss's term to the objective (model/loss.py), logged as `z_loss`;
  `loss` stays the cross-entropy, comparable across runs. The head and loss run in blocks of
  model.loss_block positions where the model says so (ModelDef.objective_sums)."""
  sums_and_grads = jax.grad(functools.partial(model_def.objective_sums, z_loss=z_loss),
                            has_aux=True)
  as_f32 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)

  def accumulated(params, batch):
    """(sums, float32 gradient of the objective's sum) over the whole batch."""
    if grad_accum_steps == 1:
      grads, sums = sums_and_grads(params, batch)
      return sums, as_f32(grads)

    def add(carry, micro):
      grads, sums = sums_and_grads(params, micro)
      return jax.tree.map(jnp.add, carry, (sums, as_f32(grads))), None

    zero = ({k: jnp.zeros((), jnp.float32) for k in OBJECTIVE_SUMS},
            jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
    return jax.lax.scan(add, zero, microbatches(batch, grad_accum_steps))[0]

  def train_step(state: TrainState, batch: dict):
    sums, grad_sums = accumulated(state.params, batch)
    tokens = jnp.maximum(sums["weight"], 1.0)
    loss = sums["loss"] / tokens
    grads = jax.tree.map(lambda g: g / tokens, grad_sums)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = all_finite((params, opt_state)) & jnp.isfinite(loss)
    keep = lambda new, old: jnp.where(finite, new, old)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "learning_rate": schedule(state.step), "update_finite": finite}
    if z_loss:
      metrics["z_loss"] = sums["z_loss"] / tokens
    return state.replace(step=state.step + finite.astype(state.step.dtype),
                         params=jax.tree.map(keep, params, state.params),
                         opt_state=jax.tree.map(keep, opt_state, state.opt_state)), metrics

  return train_step


def train_step_for(config, model_def: ModelDef, tx: optax.GradientTransformation):
  """The train step a config asks for: its schedule, train.grad_accum_steps and train.z_loss."""
  return make_train_step(model_def, tx, learning_rate_schedule(config.train),
                         config.train.grad_accum_steps, config.train.z_loss)


def make_eval_step(model_def: ModelDef, bucket_T: np.ndarray):
  """Eval returns per-position-bucket sums (loss, weight); `bucket_T` maps index -> bucket.
  In blocks where model.loss_block says so, as training (model/head.py)."""
  num_buckets = int(bucket_T.max()) + 1

  def eval_step(params, batch):
    return sums_by_bucket(*model_def.token_losses(params, batch), jnp.asarray(bucket_T),
                          num_buckets)
  return eval_step
