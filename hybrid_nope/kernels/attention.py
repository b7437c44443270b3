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
           on TPU, xla elsewhere, and on CUDA the kernel measured faster for the layer
           (gpu_choice.py, the one table: our Triton kernel for windows, cuDNN for global
           bfloat16 layers without segment ids from T = 8192). One jitted or exported step thus
           carries the right kernel for each platform and layer.

Availability is checked against the target platform: this machine's backend, or the one set
by `target_platform(...)` (launch/lower.py exports for TPU or CUDA from a CPU machine).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp

from absl import logging

from hybrid_nope.kernels import (blocking, context_parallel, cudnn, gpu_choice, pallas_gpu,
                                 pallas_tpu, per_shard, xla)

IMPLS = ("auto", "xla", "pallas", "cudnn")


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
  if not jnp.issubdtype(q_BTNH.dtype, jnp.floating):
    raise ValueError(f"q, k, v dtypes must be floating point; got {q_BTNH.dtype}")
  if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
    raise ValueError(f"window={window!r}: expected None (global causal) or an int >= 1")
  if segment_ids is not None:
    if tuple(segment_ids.shape) != (B, T):
      raise ValueError(f"segment_ids shape {tuple(segment_ids.shape)}: expected [batch, time] = {(B, T)}")
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
      raise ValueError(f"segment_ids dtype {segment_ids.dtype}: expected an integer dtype")


_TARGET = contextvars.ContextVar("attention_target_platform", default=None)


@contextlib.contextmanager
def target_platform(platform: str):
  """Check kernel availability against `platform` ("cpu", "tpu", "cuda") instead of this
  machine's backend: how launch/lower.py exports a train step for hardware it does not have."""
  token = _TARGET.set(platform)
  try:
    yield
  finally:
    _TARGET.reset(token)


def _platform() -> str:
  """The platform the traced function is meant for: the target, else the default backend
  (a GPU backend is named by its runtime, cuda or rocm, as platform_dependent names it)."""
  if _TARGET.get() is not None:
    return _TARGET.get()
  backend = jax.default_backend()
  if backend == "gpu":
    version = getattr(jax.devices()[0].client, "platform_version", "").lower()
    return "rocm" if "rocm" in version else "cuda"
  return backend


def _unavailable_reason(impl: str, q_BTNH, segment_ids) -> str | None:
  platform = _platform()
  if impl in ("xla", "auto"):
    return None
  if impl == "pallas":
    if platform == "cuda":
      return None if pallas_gpu.available() else "jax.experimental.pallas.triton is missing"
    if platform == "tpu":
      return None if pallas_tpu.available() else "splash_attention is missing from jax"
    return (f"Pallas kernels compile for TPU and CUDA GPUs only; the platform is {platform!r} "
            "(tests run them with interpret=True on the kernel modules)")
  if impl == "cudnn":
    if _TARGET.get() not in (None, "cuda"):
      return f"cuDNN runs on CUDA GPUs only; the target platform is {_TARGET.get()!r}"
    return cudnn.unsupported_reason(q_BTNH, segment_ids)
  raise AssertionError(impl)


def available_impls(q_BTNH, segment_ids=None) -> tuple[str, ...]:
  """Concrete implementations that can run this case on the target platform (`_platform`)."""
  return tuple(i for i in IMPLS[1:] if _unavailable_reason(i, q_BTNH, segment_ids) is None)


def _cuda_choice(q_BTNH, segment_ids, window) -> gpu_choice.Choice:
  return gpu_choice.cuda_attention(
      window=blocking.effective_window(window, q_BTNH.shape[1]), seq_len=q_BTNH.shape[1],
      dtype=q_BTNH.dtype, has_segments=segment_ids is not None,
      cudnn_unavailable=cudnn.unsupported_reason(q_BTNH, segment_ids))


def _cuda_auto(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None):
  """"auto" on CUDA: the kernel gpu_choice picks for this call's (per-shard) shapes."""
  choice = _cuda_choice(q_BTNH, segment_ids, window)
  if _platform() == "cuda":  # platform_dependent traces this branch on every platform
    logging.info("attention on cuda, T=%d, window=%s: %s (%s)", q_BTNH.shape[1], window,
                 choice.impl, choice.why)
  kernel = cudnn.attention if choice.impl == gpu_choice.CUDNN else pallas_gpu.attention
  return kernel(q_BTNH, k_BTKH, v_BTKH, window=window, segment_ids=segment_ids)


def _per_platform(impl: str) -> dict:
  """platform -> kernel for jax.lax.platform_dependent, which keeps only the branch of the
  platform a function is lowered for: one jitted or exported step carries XLA on CPU, splash
  attention on TPU and, on CUDA, the kernel gpu_choice picks per layer."""
  if impl == "xla":
    return {"default": xla.attention}
  if impl == "cudnn":
    return {"default": cudnn.attention}
  tpu = {"tpu": pallas_tpu.attention} if pallas_tpu.available() else {}
  if not pallas_gpu.available():
    cuda = {}
  else:
    cuda = {"cuda": _cuda_auto if impl == "auto" else pallas_gpu.attention}
  return {**tpu, **cuda, "default": xla.attention} if impl == "auto" else {**tpu, **cuda}


def resolve(impl: str, q_BTNH, segment_ids=None, window: int | None = None) -> str:
  """The concrete implementation `impl` means on the target platform for a layer with this
  window; ValueError if unavailable. ("auto" is xla on CPU and other platforms, pallas on TPU,
  and gpu_choice's pick on CUDA.)"""
  reason = _unavailable_reason(impl, q_BTNH, segment_ids)
  if reason is not None:
    raise ValueError(f"impl={impl!r} is not available here: {reason}. Available: "
                     f"{available_impls(q_BTNH, segment_ids)}")
  if impl == "auto":
    if _platform() not in _per_platform("auto"):
      return "xla"
    return _cuda_choice(q_BTNH, segment_ids, window).impl if _platform() == "cuda" else "pallas"
  return impl


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
  _check(q_BTNH, k_BTKH, v_BTKH, window, segment_ids, impl)
  resolve(impl, q_BTNH, segment_ids)
  return per_shard.run_on_platforms(_per_platform(impl), (q_BTNH, k_BTKH, v_BTKH), segment_ids,
                                    batch_axes=batch_axes, head_axes=head_axes,
                                    sequence_axes=sequence_axes,
                                    sequence_form=_sequence_form(window), window=window)
