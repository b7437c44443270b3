"""An optimizer's initial state made in its shards on the host, with no compile per shape.

Built eagerly, `tx.init` compiles a fill program for every distinct moment shape (0.1 s each on
a loaded CPU, 0.7 s at 120m); jitted whole, one program of every moment (0.5 s). Yet optax's
states start as constants: zeros for the moments, 0 for the counters. So `tx.init` runs once on
stand-ins of each parameter's rank with every dimension 1 (a path- or rank-based mask sees what
it sees on the real tree), twice, with the stand-ins filled with different values: a leaf equal
in both is a constant, made per shard on the host at its full shape. A state whose structure
differs on the stand-ins, or with a leaf that follows the parameters, is built by `tx.init`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

# Two stand-in parameter values: a state leaf that follows its parameter differs between them.
_STAND_IN_FILLS = (0.0, 1.5)


def fresh_opt_state(tx: optax.GradientTransformation, params, shardings):
  """tx.init(params), bit for bit, placed in `shardings` (a tree like the state's)."""
  abstract = jax.eval_shape(tx.init, params)
  ranks = jax.tree.map(lambda p: jax.ShapeDtypeStruct((1,) * p.ndim, p.dtype), params)

  @jax.jit
  def stand_in_states():  # one small program, not an eager fill per rank and dtype
    return [tx.init(jax.tree.map(lambda p, fill=fill: jnp.full(p.shape, fill, p.dtype), ranks))
            for fill in _STAND_IN_FILLS]

  stand_ins = stand_in_states()
  fills = _constant_fills(abstract, stand_ins)
  if fills is None:
    return jax.device_put(tx.init(params), shardings)
  return jax.tree.map(_filled, abstract, fills, shardings)


def _constant_fills(abstract, stand_ins):
  """Each leaf's constant fill value, or None where a leaf is not a constant of the shape."""
  structure = jax.tree.structure(abstract)
  if any(jax.tree.structure(s) != structure for s in stand_ins):
    return None
  fills = []
  for want, *seen in zip(jax.tree.leaves(abstract), *map(jax.tree.leaves, stand_ins)):
    values = [np.asarray(s) for s in seen]
    if any(v.dtype != want.dtype or v.ndim != len(want.shape) for v in values):
      return None
    first = values[0].reshape(-1)[:1]
    if any(v.size != 1 or v.tobytes() != values[0].tobytes() for v in values):
      return None
    fills.append(first[0])
  return jax.tree.unflatten(structure, fills)


def _filled(abstract: jax.ShapeDtypeStruct, fill, sharding) -> jax.Array:
  """A constant array made shard by shard on the host: no device program, no whole copy."""
  shard = sharding.shard_shape(abstract.shape)
  return jax.make_array_from_callback(
      abstract.shape, sharding, lambda _: np.full(shard, fill, abstract.dtype))
