"""The output head and its cross-entropy in blocks of positions (model.loss_block), so that no
[B, T, V] logits are ever held: at 64K tokens over Llama-3's 128,256-token vocabulary they are
78 GiB per chip with their float32 copies (docs/scaling.md).

Each block is `block` positions of every row, strided (block j holds positions j, j + n, j + 2n,
... of n blocks): a row split over mesh.sequence keeps each block split the same way, so no
block gathers a row. Blocks run in a `lax.scan`; a block's logits live for one iteration.

Training's objective has a custom VJP that computes its gradients in the forward pass, block by
block (the probabilities are at hand there): three head matmuls in all, as the full path's
forward and backward, where rematerialising each block in the backward pass would take four.
It keeps the head input's gradient ([B, T, D]) and the head's ([D, V], float32) as residuals.
This is the same idea as MaxText's vocabulary tiling and levanter's fused cross-entropy, in
plain XLA. The math of one token, weight w, logits l, z-loss coefficient z, lse = log Σ exp l:
  objective = w (lse − l_target) + z w lse²
  ∂/∂l      = w (softmax(l) (1 + 2 z lse) − onehot(target)).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from hybrid_nope.model.layers import BTD, BTV, constrain, mesh_axes, project


def head_logits(x_BTD: jax.Array, w_DV: jax.Array, scale: float, dtype) -> jax.Array:
  """Float32 logits (x · w) × scale, the matmul and the scale in `dtype` (the head dtype): the
  one definition of the head, for the full path and each block alike."""
  logits_BTV = project(x_BTD.astype(dtype), w_DV.astype(dtype))
  if scale != 1.0:
    logits_BTV = logits_BTV * scale
  return logits_BTV.astype(jnp.float32)


def _split(a_BT, block: int):
  """[B, T, ...] -> [n, B, block, ...]: block j holds positions j, j + n, ... (zero-padded to
  n × block positions where block does not divide T; callers give padding weight 0)."""
  rows, length = a_BT.shape[:2]
  n = -(-length // block)
  if n * block != length:
    a_BT = jnp.pad(a_BT, [(0, 0), (0, n * block - length)] + [(0, 0)] * (a_BT.ndim - 2))
  return jnp.moveaxis(a_BT.reshape(rows, block, n, *a_BT.shape[2:]), 2, 0)


def _unsplit(a_KBt, length: int):
  """The inverse of `_split`: [n, B, block, ...] -> [B, length, ...]."""
  n, rows, block = a_KBt.shape[:3]
  return jnp.moveaxis(a_KBt, 0, 2).reshape(rows, n * block, *a_KBt.shape[3:])[:, :length]


def _blocks(x_BTD, targets_BT, weights_BT, block: int):
  """The scan's inputs: x [n, B, b, D], targets and float32 weights [n, B, b]."""
  block = min(block, targets_BT.shape[1])
  x_KBtD = constrain(_split(x_BTD, block), (None, *BTD))
  return (x_KBtD, _split(targets_BT, block), _split(weights_BT.astype(jnp.float32), block))


def _block_terms(x_BtD, w_DV, targets_Bt, scale, dtype):
  """One block's (logits [B, b, V], log Z [B, b], token loss [B, b]), float32."""
  logits_BtV = constrain(head_logits(x_BtD, w_DV, scale, dtype), BTV)
  log_z_Bt = jax.nn.logsumexp(logits_BtV, axis=-1)
  target_Bt = jnp.take_along_axis(logits_BtV, targets_Bt[..., None], axis=-1)[..., 0]
  return logits_BtV, log_z_Bt, log_z_Bt - target_Bt


def token_losses(x_BTD, w_DV, targets_BT, weights_BT, *, block: int, scale: float = 1.0,
                 dtype=jnp.float32):
  """(token loss × weight [B, T], weight [B, T]) in float32, as loss.weighted_token_losses of
  the full logits: the forward pass of eval and the loss by position. Not for gradients (use
  `objective_sums`): autodiff through the scan would keep every block's logits."""
  blocks = _blocks(x_BTD, targets_BT, weights_BT, block)

  def body(_, blk):
    x_BtD, targets_Bt, weights_Bt = blk
    return None, _block_terms(x_BtD, w_DV, targets_Bt, scale, dtype)[2] * weights_Bt

  _, loss_KBt = jax.lax.scan(body, None, blocks)
  return _unsplit(loss_KBt, targets_BT.shape[1]), weights_BT.astype(jnp.float32)


def objective_sums(x_BTD, w_DV, targets_BT, weights_BT, *, z_loss: float, block: int,
                   scale: float = 1.0, dtype=jnp.float32):
  """(objective, sums): the objective Σ w (loss + z_loss · log²Z) to differentiate, and the
  float32 sums of loss.objective_sums ("loss", "weight", "z_loss"; constants to autodiff),
  computed in blocks of `block` positions per row. `x_BTD` is the final norm's output, `w_DV`
  the unembedding and `scale` its factor (model.LanguageModel.unembedding); `dtype` the head's."""
  objective, loss, z = _objective(*_blocks(x_BTD, targets_BT, weights_BT, block), w_DV,
                                  float(z_loss), float(scale), jnp.dtype(dtype))
  weight = jnp.sum(weights_BT.astype(jnp.float32))
  return objective, {"loss": jax.lax.stop_gradient(loss), "weight": weight,
                     "z_loss": jax.lax.stop_gradient(z)}


def _sums(loss_Bt, log_z_Bt, weights_Bt, z_loss):
  """One block's (Σ w · loss, z_loss · Σ w · log²Z)."""
  loss = jnp.sum(loss_Bt * weights_Bt)
  if not z_loss:
    return loss, jnp.zeros((), jnp.float32)
  return loss, z_loss * jnp.sum(jnp.square(log_z_Bt) * weights_Bt)


def _shard_groups(rows: int, block: int) -> tuple[int, int]:
  """(row groups, position groups): how many devices split a block's rows (act_batch) and its
  positions (act_length) under the trainer's mesh and rules; (1, 1) outside them, or where a
  count does not divide."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1, 1
  def size(logical):
    names = [a for axes in mesh_axes((logical,)) if axes
             for a in ((axes,) if isinstance(axes, str) else axes)]
    return math.prod(mesh.shape.get(a, 1) for a in names)
  groups = size("act_batch"), size("act_length")
  return (groups[0] if rows % groups[0] == 0 else 1, groups[1] if block % groups[1] == 0 else 1)


def _head_gradient(x_ND, dlogits_NV, rows: int, groups: tuple[int, int]):
  """x^T · dlogits [G_b, G_s, D, V] in float32, one partial sum per group of rows and positions:
  each device sums its own tokens, so the scan's carry needs no all-reduce per block (the
  partitioner cannot carry a partial sum through a loop); one sum after the scan."""
  g_b, g_s = groups
  x_gbstD = x_ND.reshape(g_b, rows // g_b, g_s, -1, x_ND.shape[-1])
  d_gbstV = dlogits_NV.reshape(g_b, rows // g_b, g_s, -1, dlogits_NV.shape[-1])
  dw_GSDV = jnp.einsum("gbstd,gbstv->gsdv", x_gbstD, d_gbstV, preferred_element_type=jnp.float32)
  return constrain(dw_GSDV, GROUPED_DV)


# The partial head gradients' axes: split over the devices of the rows and positions they sum.
GROUPED_DV = ("act_batch", "act_length", None, "act_vocab")


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _objective(x_KBtD, targets_KBt, weights_KBt, w_DV, z_loss, scale, dtype):
  """(objective, loss sum, z-loss sum) over the blocks; only the objective is differentiable
  (`objective_sums` stops the gradient of the other two)."""
  def body(carry, blk):
    x_BtD, targets_Bt, weights_Bt = blk
    _, log_z_Bt, loss_Bt = _block_terms(x_BtD, w_DV, targets_Bt, scale, dtype)
    return jax.tree.map(jnp.add, carry, _sums(loss_Bt, log_z_Bt, weights_Bt, z_loss)), None

  zero = jnp.zeros((), jnp.float32)
  (loss, z), _ = jax.lax.scan(body, (zero, zero), (x_KBtD, targets_KBt, weights_KBt))
  return loss + z, loss, z


def _objective_fwd(x_KBtD, targets_KBt, weights_KBt, w_DV, z_loss, scale, dtype):
  w_h = w_DV.astype(dtype)

  def body(carry, blk):
    sums, dw_GSDV = carry
    x_BtD, targets_Bt, weights_Bt = blk
    logits_BtV, log_z_Bt, loss_Bt = _block_terms(x_BtD, w_DV, targets_Bt, scale, dtype)
    coef_Bt = weights_Bt * (1.0 + 2.0 * z_loss * log_z_Bt) if z_loss else weights_Bt
    vocab = jax.lax.broadcasted_iota(targets_Bt.dtype, logits_BtV.shape, 2)
    dlogits_BtV = (jnp.exp(logits_BtV - log_z_Bt[..., None]) * coef_Bt[..., None]
                   - jnp.where(vocab == targets_Bt[..., None], weights_Bt[..., None], 0.0))
    # Back through the head's float32 cast, its scale and its matmul in the head dtype; the
    # head's gradient is accumulated in float32 whatever that dtype.
    dlogits_h = constrain((dlogits_BtV * scale).astype(dtype), BTV)
    dx_BtD = project(dlogits_h, w_h.T).astype(x_KBtD.dtype)
    x_ND = x_BtD.astype(dtype).reshape(-1, x_BtD.shape[-1])
    dw_GSDV = dw_GSDV + _head_gradient(x_ND, dlogits_h.reshape(x_ND.shape[0], -1), rows, groups)
    sums = jax.tree.map(jnp.add, sums, _sums(loss_Bt, log_z_Bt, weights_Bt, z_loss))
    return (sums, dw_GSDV), dx_BtD

  rows, block = x_KBtD.shape[1:3]
  groups = _shard_groups(rows, block)
  zero = jnp.zeros((), jnp.float32)
  ((loss, z), dw_GSDV), dx_KBtD = jax.lax.scan(
      body, ((zero, zero), constrain(jnp.zeros((*groups, *w_DV.shape), jnp.float32), GROUPED_DV)),
      (x_KBtD, targets_KBt, weights_KBt))
  dw_DV = jnp.sum(dw_GSDV, axis=(0, 1))
  return (loss + z, loss, z), (dx_KBtD, dw_DV.astype(w_DV.dtype))


def _objective_bwd(z_loss, scale, dtype, residuals, cotangents):
  del z_loss, scale, dtype
  dx_KBtD, dw_DV = residuals
  g = cotangents[0]  # The loss and z-loss sums are stop_gradient'ed by objective_sums.
  return ((dx_KBtD * g).astype(dx_KBtD.dtype), None, None, (dw_DV * g).astype(dw_DV.dtype))


_objective.defvjp(_objective_fwd, _objective_bwd)
