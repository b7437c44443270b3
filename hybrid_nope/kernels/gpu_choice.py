"""Which attention kernel "auto" runs for one layer on a CUDA GPU: the one table, and the
figures it rests on.

Measured on one H200 (docs/performance.md, "GPU: one H200", at 40073bc: bfloat16 fwd+bwd, B = 1,
12 heads x 64, no segment ids). cuDNN's time over our Triton kernel's (pallas_gpu.py), at
T = 2048, 4096, 8192, 16384, 32768:

  window 64     1.68  0.92  1.47  1.39  1.56
  window 256    2.22  1.36  1.31  1.22  1.20
  window 1024   1.01  3.74  0.80  0.88  0.98
  global        1.63  1.03  0.79  0.71  0.67

So our kernel for windows (the faster one at w <= 256, within 20% at 1024; wider windows short of
T are unmeasured and keep the incumbent), and cuDNN for global layers from T = 8192, where it is
1.3-1.5x faster, but only for the case that was measured:
  - bfloat16 or float16, head_dim a multiple of 8 up to 128 (cuDNN takes no float32);
  - no segment ids. cuDNN has none: they become a dense [B, 1, T, T] mask (O(T^2) memory),
    while our kernel skips the key blocks of other documents (O(sum of len^2)). The paper
    configs train with data.document_masking, so their global layers keep our kernel; cuDNN's
    packed layout (query and key offsets) has not been measured.
  - a CUDA GPU in this process: cuDNN cannot be traced without one, so launch/lower.py, which
    exports for cuda from a CPU machine, gets our kernel in global layers too (and says so).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

PALLAS, CUDNN = "pallas", "cudnn"
CUDNN_GLOBAL_FROM_T = 8192  # The shortest sequence at which cuDNN's global layer was faster.
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class Choice:
  impl: str  # PALLAS or CUDNN
  why: str


def cuda_attention(*, window: int | None, seq_len: int, dtype, has_segments: bool,
                   cudnn_unavailable: str | None) -> Choice:
  """The kernel for one layer's call on CUDA. `window` is the effective one (None: every key of
  the sequence); `cudnn_unavailable` is cudnn.unsupported_reason's answer for this call."""
  if window is not None:
    return Choice(PALLAS, f"window {window}: our kernel (as fast or faster for windows)")
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in CUDNN_DTYPES]:
    return Choice(PALLAS, f"global, {jnp.dtype(dtype).name}: cuDNN takes bfloat16/float16 only")
  if has_segments:
    return Choice(PALLAS, "global with segment ids: cuDNN would need a dense T x T mask")
  if seq_len < CUDNN_GLOBAL_FROM_T:
    return Choice(PALLAS, f"global at T = {seq_len} < {CUDNN_GLOBAL_FROM_T}: our kernel is "
                          "as fast or faster there")
  if cudnn_unavailable is not None:
    return Choice(PALLAS, f"global: cuDNN unavailable ({cudnn_unavailable})")
  return Choice(CUDNN, f"global at T = {seq_len} >= {CUDNN_GLOBAL_FROM_T}, "
                       f"{jnp.dtype(dtype).name}, no segment ids: cuDNN 1.3-1.5x faster")
