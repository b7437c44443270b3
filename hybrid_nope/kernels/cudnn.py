"""cuDNN flash attention through jax.nn.dot_product_attention(implementation="cudnn").

cuDNN takes the sliding window natively (local_window_size → sliding_window_length) and GQA,
but has no segment ids: those become a dense [B, 1, T, T] boolean mask (O(T²) memory, which is
why "auto" prefers the Pallas kernel when segments are given).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_nope.kernels import blocking

DTYPES = (jnp.bfloat16, jnp.float16)


def unsupported_reason(q_BTNH, segment_ids) -> str | None:
  """Why cuDNN cannot run this case on the default backend, or None if it can."""
  if jax.default_backend() != "gpu":
    return f"cuDNN needs a CUDA GPU; the default backend is {jax.default_backend()!r}"
  platform_version = getattr(jax.devices()[0].client, "platform_version", "")
  if "cuda" not in platform_version.lower():
    return f"cuDNN needs CUDA; this GPU runtime is {platform_version!r}"
  if q_BTNH.dtype not in DTYPES:
    return f"cuDNN flash attention takes bfloat16 or float16, not {q_BTNH.dtype}"
  H = q_BTNH.shape[-1]
  if H % 8 or H > 128:
    return f"cuDNN flash attention needs head_dim a multiple of 8 and <= 128, not {H}"
  return None


def attention(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None):
  T = q_BTNH.shape[1]
  mask = None
  if segment_ids is not None:
    mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  window = blocking.effective_window(window, T)
  local = None if window is None else (window - 1, 0)
  return jax.nn.dot_product_attention(q_BTNH, k_BTKH, v_BTKH, mask=mask, is_causal=True,
                                      local_window_size=local, implementation="cudnn")
