"""`attention(q, k, v, window=, segment_ids=, impl=)`: input checks and dispatch to an implementation.

Semantics shared by every implementation:
  window None  -> causal global attention (keys j <= i);
  window w     -> keys j with i - w < j <= i (w = 1 attends to itself only);
  segment_ids  -> int [B, T]; a query attends only to keys of its own segment;
  GQA          -> query head n reads key/value head n // (N / K).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_nope.kernels import xla

IMPLS = ("auto", "xla")


def _check(q_BTNH, k_BTKH, v_BTKH, window, segment_ids, impl):
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r}: expected one of {IMPLS}")
  if q_BTNH.ndim != 4 or k_BTKH.ndim != 4 or v_BTKH.ndim != 4:
    raise ValueError(
        "q, k, v must be rank 4 [batch, time, heads, head_dim]; got shapes "
        f"q={q_BTNH.shape} k={k_BTKH.shape} v={v_BTKH.shape}")
  if k_BTKH.shape != v_BTKH.shape:
    raise ValueError(f"k and v must have the same shape; got k={k_BTKH.shape} v={v_BTKH.shape}")
  B, T, N, H = q_BTNH.shape
  if k_BTKH.shape[:2] != (B, T) or k_BTKH.shape[3] != H:
    raise ValueError(f"k shape {k_BTKH.shape} does not match q shape {q_BTNH.shape} "
                     "in batch, time or head_dim")
  K = k_BTKH.shape[2]
  if N % K:
    raise ValueError(f"q heads N={N} must be a multiple of k/v heads K={K} (GQA)")
  if not (q_BTNH.dtype == k_BTKH.dtype == v_BTKH.dtype):
    raise ValueError(f"q, k, v dtypes must match; got q={q_BTNH.dtype} k={k_BTKH.dtype} "
                     f"v={v_BTKH.dtype}")
  if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
    raise ValueError(f"window={window!r}: expected None (global causal) or an int >= 1")
  if segment_ids is not None:
    if tuple(segment_ids.shape) != (B, T):
      raise ValueError(f"segment_ids shape {tuple(segment_ids.shape)}: expected [batch, time] = {(B, T)}")
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
      raise ValueError(f"segment_ids dtype {segment_ids.dtype}: expected an integer dtype")


def _resolve(impl: str) -> str:
  if impl == "auto":
    return "xla"  # The only implementation so far; faster ones plug in here per backend.
  return impl


def attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, *,
              window: int | None = None, segment_ids: jax.Array | None = None,
              impl: str = "auto") -> jax.Array:
  """Causal (optionally sliding-window, segment-masked, GQA) attention; returns [B, T, N, H]."""
  _check(q_BTNH, k_BTKH, v_BTKH, window, segment_ids, impl)
  impl = _resolve(impl)
  return xla.attention(q_BTNH, k_BTKH, v_BTKH, window=window, segment_ids=segment_ids)
