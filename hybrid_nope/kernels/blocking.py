"""Which keys a block of queries can reach: the bounds that let kernels skip whole key blocks.

A query at position i may read key j only if j <= i, j > i - window and seg[j] == seg[i]. For a
block of queries the reachable keys lie in [lowest_key, block end); for a block of keys the
queries that read them lie in [block start, highest_query]. Both bounds are exact for packed
documents (contiguous segments) and stay correct for any integer segment ids, since they come
from the first / last occurrence of each query's or key's segment id.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# The flash kernels' softmax in base 2 (exp2 is the cheap instruction): logits times LOG2E.
LOG2E = float(np.log2(np.e))
# A masked logit: finite, so exp2(MASKED - m) is 0 rather than NaN; every row sees its own key
# (the diagonal block, visited first), so no row's running max is MASKED.
MASKED = -0.7 * float(np.finfo(np.float32).max)


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _occurrence(seg_BT: jax.Array, last: bool) -> jax.Array:
  """Per position, the first (or last) position in its row holding the same segment id."""
  B, T = seg_BT.shape
  if last:  # The last occurrence is the first occurrence in the reversed row.
    return T - 1 - _occurrence(seg_BT[:, ::-1], last=False)[:, ::-1]
  order_BT = jnp.argsort(seg_BT, axis=1, stable=True)  # Equal ids stay in position order.
  sorted_BT = jnp.take_along_axis(seg_BT, order_BT, axis=1)
  run_start_BT = jnp.concatenate(
      [jnp.ones((B, 1), bool), sorted_BT[:, 1:] != sorted_BT[:, :-1]], axis=1)
  # Index (in sorted order) of the start of each run of equal ids; its original position is
  # the id's first occurrence because the sort is stable.
  start_BT = jax.lax.cummax(jnp.where(run_start_BT, jnp.arange(T), 0), axis=1)
  first_sorted_BT = jnp.take_along_axis(order_BT, start_BT, axis=1)
  inverse_BT = jnp.argsort(order_BT, axis=1)
  return jnp.take_along_axis(first_sorted_BT, inverse_BT, axis=1)


def effective_window(window: int | None, T: int) -> int | None:
  """None (global causal) for a window that covers the whole sequence, else the window."""
  return None if window is None or window >= T else window


def pad_segments(segment_ids: jax.Array, T_padded: int) -> jax.Array:
  """Tail padding joins the last segment: its queries then read real keys, but their outputs
  are dropped and their zero cotangents add nothing to dk, dv, and every bound below stays
  exact for the real rows."""
  T = segment_ids.shape[1]
  return jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, T_padded - T)), mode="edge")


def query_block_key_start(T: int, block: int, window: int | None,
                          segment_ids: jax.Array | None) -> jax.Array:
  """[B or 1, T // block] int32: no query of block i reads a key before this position.

  T must be a multiple of block (pad with pad_segments first).
  """
  nb = T // block
  lo_bn = jnp.zeros((1, nb), jnp.int32)
  if window is not None:
    lo_bn = jnp.maximum(lo_bn, jnp.arange(nb, dtype=jnp.int32) * block - window + 1)
  if segment_ids is not None:
    first_BT = _occurrence(segment_ids, last=False).astype(jnp.int32)
    lo_bn = jnp.maximum(lo_bn, first_BT.reshape(-1, nb, block).min(axis=2))
  return lo_bn


def key_block_query_end(T: int, block: int, window: int | None,
                        segment_ids: jax.Array | None) -> jax.Array:
  """[B or 1, T // block] int32: no query after this position reads a key of block j."""
  nb = T // block
  hi_bn = jnp.full((1, nb), T - 1, jnp.int32)
  if window is not None:
    end_n = jnp.arange(1, nb + 1, dtype=jnp.int32) * block - 1
    hi_bn = jnp.minimum(hi_bn, end_n + window - 1)
  if segment_ids is not None:
    last_BT = _occurrence(segment_ids, last=True).astype(jnp.int32)
    hi_bn = jnp.minimum(hi_bn, last_BT.reshape(-1, nb, block).max(axis=2))
  return hi_bn
