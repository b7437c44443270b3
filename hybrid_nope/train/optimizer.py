"""AdamW on train.schedule's learning rate, global-norm clipping, decay only on projection
matrices, and Adam's moments stored in train.opt_state_dtype."""
from __future__ import annotations

import jax
import optax

from hybrid_nope.model.transformer import DTYPES
from hybrid_nope.train.lr_schedule import learning_rate_schedule  # noqa: F401 (re-exported)


def weight_decay_mask(params):
  """True for matrices that project activations; False for norm gains and the embedding table.

  Path-based so it works on the plain nested dict of parameters the trainer keeps.
  """
  def decays(path, leaf):
    names = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    return leaf.ndim >= 2 and "embedding_VD" not in names
  return jax.tree_util.tree_map_with_path(decays, params)


def moments_in(dtype, tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` with its per-parameter state created in `dtype`, whatever the parameters' dtype.

  optax's Adam takes mu_dtype for the first moment only; the second moment is created like the
  parameters and then kept in the dtype it was created in (optax.tree.cast_like), so creating
  the state from parameters cast to `dtype` sets both moments' storage."""
  def init(params):
    return tx.init(jax.tree.map(lambda p: p.astype(dtype), params))
  return optax.GradientTransformation(init, tx.update)


def make_optimizer(train_cfg) -> optax.GradientTransformation:
  moments = DTYPES[train_cfg.opt_state_dtype]
  return optax.chain(
      optax.clip_by_global_norm(train_cfg.grad_clip),
      moments_in(moments, optax.adamw(
          learning_rate_schedule(train_cfg), b1=train_cfg.b1, b2=train_cfg.b2,
          eps=train_cfg.eps, weight_decay=train_cfg.weight_decay, mask=weight_decay_mask,
          mu_dtype=moments)),
  )
