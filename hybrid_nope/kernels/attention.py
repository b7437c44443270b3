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
  "auto"   the best available for the backend, dtype and features; logs its pick once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import logging

from hybrid_nope.kernels import cudnn, pallas_gpu, pallas_tpu, per_shard, xla

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


def _unavailable_reason(impl: str, q_BTNH, segment_ids) -> str | None:
  backend = jax.default_backend()
  if impl == "xla":
    return None
  if impl == "pallas":
    if backend == "gpu":
      return None if pallas_gpu.available() else "jax.experimental.pallas.triton is missing"
    if backend == "tpu":
      return None if pallas_tpu.available() else "splash_attention is missing from jax"
    return (f"Pallas kernels compile for GPU or TPU only; the backend is {backend!r} "
            "(tests run them with interpret=True on the kernel modules)")
  if impl == "cudnn":
    return cudnn.unsupported_reason(q_BTNH, segment_ids)
  raise AssertionError(impl)


def available_impls(q_BTNH, segment_ids=None) -> tuple[str, ...]:
  """Concrete implementations that can run this case on the default backend."""
  return tuple(i for i in IMPLS[1:] if _unavailable_reason(i, q_BTNH, segment_ids) is None)


def _pick(q_BTNH, segment_ids) -> tuple[str, str]:
  """'auto': (impl, why)."""
  backend = jax.default_backend()
  available = available_impls(q_BTNH, segment_ids)
  if backend == "gpu":
    # cuDNN is NVIDIA's tuned kernel, but segment ids would cost it a dense T×T mask, which
    # our Pallas kernel avoids (it skips other documents' key blocks instead).
    if "cudnn" in available and segment_ids is None:
      return "cudnn", "GPU, no segment ids, dtype and head_dim cuDNN supports"
    if "pallas" in available:
      return "pallas", "GPU Triton kernel (segment ids, or a case cuDNN does not take)"
  if backend == "tpu" and "pallas" in available:
    return "pallas", "TPU splash attention"
  return "xla", f"the portable path on backend {backend!r}"


_LOGGED: set[tuple[str, str]] = set()


def resolve(impl: str, q_BTNH, segment_ids=None) -> str:
  """The concrete implementation `impl` means for this case; ValueError if unavailable."""
  if impl == "auto":
    impl, why = _pick(q_BTNH, segment_ids)
    if (impl, why) not in _LOGGED:  # Once per distinct decision, not once per layer call.
      _LOGGED.add((impl, why))
      logging.info("kernels.attention impl='auto' picked %r: %s", impl, why)
    return impl
  reason = _unavailable_reason(impl, q_BTNH, segment_ids)
  if reason is not None:
    raise ValueError(f"impl={impl!r} is not available here: {reason}. Available: "
                     f"{available_impls(q_BTNH, segment_ids)}")
  return impl


def _implementation(impl: str):
  if impl == "xla":
    return xla.attention
  if impl == "cudnn":
    return cudnn.attention
  return pallas_tpu.attention if jax.default_backend() == "tpu" else pallas_gpu.attention


def attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, *,
              window: int | None = None, segment_ids: jax.Array | None = None,
              impl: str = "auto", batch_axes=None, head_axes=None) -> jax.Array:
  """Causal (optionally sliding-window, segment-masked, GQA) attention; returns [B, T, N, H].

  `batch_axes` / `head_axes` name the axes of the context mesh (jax.set_mesh) that split the
  batch and the heads; given a multi-device mesh, each device runs the kernel on its own shard
  (per_shard.py).
  """
  _check(q_BTNH, k_BTKH, v_BTKH, window, segment_ids, impl)
  impl = resolve(impl, q_BTNH, segment_ids)
  fn = _implementation(impl)
  return per_shard.run(lambda q, k, v, seg: fn(q, k, v, window=window, segment_ids=seg),
                       q_BTNH, k_BTKH, v_BTKH, segment_ids, batch_axes=batch_axes,
                       head_axes=head_axes)
