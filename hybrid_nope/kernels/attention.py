"""`attention(q, k, v, window=, segment_ids=, impl=)`: input checks and dispatch to an implementation.

Semantics shared by every implementation:
  window None  -> causal global attention (keys j <= i);
  window w     -> keys j with i - w < j <= i (w = 1 attends to itself only);
  segment_ids  -> int [B, T]; a query attends only to keys of its own segment;
  GQA          -> query head n reads key/value head n // (N / K).

Implementations (`impl=`):
  "xla"    pure jax.numpy flash attention (xla.py); every backend, the CPU default.
  "pallas" Pallas kernels: our Triton kernel on GPU (pallas_gpu.py), splash attention on TPU
           (pallas_tpu.py). Both also run in interpret mode, which is how the CPU tests reach
           them (call the modules with interpret=True).
  "cudnn"  cuDNN flash attention on CUDA GPUs, bfloat16 / float16 (cudnn.py).
  "auto"   decided when the function is lowered (jax.lax.platform_dependent): splash attention
           on TPU, xla elsewhere, and on CUDA the kernel measured faster for the layer (our
           Triton kernel for windows, cuDNN for global bfloat16 layers without segment ids from
           T = 8192). One jitted or exported step thus carries the right kernel for each
           platform and layer.

Which implementation runs where, and why one cannot, is dispatch.py's table (shared with
linear_attention and delta_attention); availability follows its target platform.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hybrid_nope.kernels import context_parallel, dispatch, per_shard

IMPLS = dispatch.TABLE["attention"].impls


def check_qkv(q_BTNH, k_BTKH, v_BTKH, window, segment_ids):
  """attention()'s rules for q, k, v, window and segment_ids (linear_attention and
  delta_attention share them); ValueError naming the argument."""
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
  if not jnp.issubdtype(q_BTNH.dtype, jnp.floating):
    raise ValueError(f"q, k, v dtypes must be floating point; got {q_BTNH.dtype}")
  if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
    raise ValueError(f"window={window!r}: expected None (global causal) or an int >= 1")
  if segment_ids is not None:
    if tuple(segment_ids.shape) != (B, T):
      raise ValueError(f"segment_ids shape {tuple(segment_ids.shape)}: expected [batch, time] = {(B, T)}")
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
      raise ValueError(f"segment_ids dtype {segment_ids.dtype}: expected an integer dtype")


def available_impls(q_BTNH, segment_ids=None) -> tuple[str, ...]:
  """Concrete implementations that can run this case on the target platform."""
  return dispatch.available_impls("attention", q_BTNH, segment_ids)


def resolve(impl: str, q_BTNH, segment_ids=None, window: int | None = None) -> str:
  """The concrete implementation `impl` means on the target platform for a layer with this
  window; ValueError if unavailable. ("auto" is xla on CPU and other platforms, pallas on TPU,
  and the per-layer pick on CUDA.)"""
  return dispatch.resolve("attention", impl, q_BTNH, segment_ids, window)


def _sequence_form(window: int | None):
  """Attention over a sequence split across devices (context_parallel.py): a halo of keys from
  the previous shard for a window, every key all-gathered for global attention."""
  if window is None:
    return lambda kernel, q, k, v, segment_ids, *, axis, axis_size: (
        context_parallel.global_causal(q, k, v, segment_ids, axis=axis))
  return functools.partial(context_parallel.sliding_window, window=window)


def attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, *,
              window: int | None = None, segment_ids: jax.Array | None = None,
              impl: str = "auto", batch_axes=None, head_axes=None,
              sequence_axes=None) -> jax.Array:
  """Causal (optionally sliding-window, segment-masked, GQA) attention; returns [B, T, N, H].

  `batch_axes` / `head_axes` / `sequence_axes` name the axes of the context mesh
  (jax.set_mesh) that split the batch, the heads and the sequence; given a multi-device mesh,
  each device runs the kernel on its own shard (per_shard.py).
  """
  dispatch.check_impl("attention", impl)
  check_qkv(q_BTNH, k_BTKH, v_BTKH, window, segment_ids)
  resolve(impl, q_BTNH, segment_ids)
  return per_shard.run_on_platforms(dispatch.branches("attention", impl),
                                    (q_BTNH, k_BTKH, v_BTKH), segment_ids, batch_axes=batch_axes, head_axes=head_axes,
                                    sequence_axes=sequence_axes,
                                    sequence_form=_sequence_form(window), window=window)
