"""Pure-XLA attention: masked dense attention through jax.nn.dot_product_attention.

Correct on every backend; O(T^2) in memory and compute, which is why faster kernels exist.
"""
from __future__ import annotations

import jax


def attention(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None):
  mask_B1TT = None
  if segment_ids is not None:
    mask_B1TT = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  # local_window_size=(w - 1, 0) keeps keys i - w < j <= i, the contract's window.
  local_window = None if window is None else (window - 1, 0)
  return jax.nn.dot_product_attention(
      q_BTNH, k_BTKH, v_BTKH, mask=mask_B1TT, is_causal=True,
      local_window_size=local_window, implementation="xla")
