"""AdamW with warmup + cosine decay, global-norm clipping, and decay only on projection matrices."""
from __future__ import annotations

import jax
import optax


def learning_rate_schedule(train_cfg) -> optax.Schedule:
  """Linear warmup to the peak, then cosine decay to min_learning_rate_ratio × peak."""
  peak = train_cfg.learning_rate
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=train_cfg.warmup_steps,
      decay_steps=train_cfg.steps, end_value=peak * train_cfg.min_learning_rate_ratio)


def weight_decay_mask(params):
  """True for matrices that project activations; False for norm gains and the embedding table.

  Path-based so it works on the plain nested dict of parameters the trainer keeps.
  """
  def decays(path, leaf):
    names = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    return leaf.ndim >= 2 and "embedding_VD" not in names
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(train_cfg) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(train_cfg.grad_clip),
      optax.adamw(learning_rate_schedule(train_cfg), b1=train_cfg.b1, b2=train_cfg.b2,
                  eps=train_cfg.eps, weight_decay=train_cfg.weight_decay,
                  mask=weight_decay_mask),
  )
