"""`linear_attention(q, k, v, log_decay, segment_ids=, impl=)`: input checks and dispatch.

Gated linear attention (GLA), per batch row and kv head, state S_t of shape [H, H]:
  S_t = diag(exp(log_decay_t)) S_{t-1} + k_t v_tᵀ,   out_t = H^(-1/2) q_tᵀ S_t,
with S_{t-1} = 0 where a maximal run of equal nonzero segment ids starts; segment 0 is padding,
which outputs 0 and neither reads nor writes the state. GQA: query head n reads the key, value
and decay of kv head n // (N / K). log_decay <= 0 is the caller's contract (a positive one is
not checked, it cannot be on traced values, and may overflow); any log_decay <= 0, down to -inf,
gives finite outputs and gradients.

Implementations (`impl=`):
  "xla"    the chunked form in pure jax.numpy (linear_xla.py); every backend, the CPU default.
  "pallas" Pallas kernels, as attention()'s "pallas": on TPU a Mosaic forward kernel
           (linear_pallas.py) that keeps the state in VMEM across the chunks, its backward the
           XLA chunked one; on CUDA Triton kernels for forward and backward
           (linear_pallas_gpu.py). TPU and CUDA only (tests run both with interpret=True on
           their modules).
  "auto"   decided when the function is lowered (jax.lax.platform_dependent), as attention()
           does: today XLA on every platform. Neither Pallas kernel has run on its hardware (no
           accelerator was available where they were written: they are checked in interpret
           mode and lowered with jax.export only), so "auto" will not choose one until it has
           been measured faster there; the `auto` of dispatch.py's table is the one place to
           change that.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from hybrid_nope.kernels import context_parallel as cp
from hybrid_nope.kernels import dispatch, per_shard
# q, k, v and segment_ids obey attention()'s rules.
from hybrid_nope.kernels.attention import check_qkv

IMPLS = dispatch.TABLE["linear_attention"].impls


def _check(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, segment_ids, impl):
  dispatch.check_impl("linear_attention", impl)
  check_qkv(q_BTNH, k_BTKH, v_BTKH, None, segment_ids)
  if tuple(log_decay_BTKH.shape) != tuple(k_BTKH.shape):
    raise ValueError(f"log_decay shape {tuple(log_decay_BTKH.shape)} must match k shape "
                     f"{tuple(k_BTKH.shape)} [batch, time, kv heads, head_dim]")
  if not jnp.issubdtype(log_decay_BTKH.dtype, jnp.floating):
    raise ValueError(f"log_decay dtype must be floating point; got {log_decay_BTKH.dtype}")


def linear_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                     log_decay_BTKH: jax.Array, *, segment_ids: jax.Array | None = None,
                     impl: str = "auto", batch_axes=None, head_axes=None,
                     sequence_axes=None) -> jax.Array:
  """Gated linear attention (segment-reset, GQA); returns [B, T, N, H] in q's dtype.

  `batch_axes` / `head_axes` / `sequence_axes` name the context mesh axes that split the batch,
  the heads and the sequence; given a multi-device mesh each device runs the kernel on its own
  shard (per_shard.py), a split sequence carrying the state across shards
  (context_parallel.recurrent; out = H^(-1/2) qᵀS is read back with √H).
  """
  _check(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, segment_ids, impl)
  dispatch.resolve("linear_attention", impl)
  form = functools.partial(cp.recurrent, roles=(cp.QUERY, cp.KEY, cp.VALUE, cp.GATE),
                           read_scale=math.sqrt(q_BTNH.shape[-1]))
  return per_shard.run_on_platforms(dispatch.branches("linear_attention", impl),
                                    (q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH), segment_ids,
                                    batch_axes=batch_axes, head_axes=head_axes,
                                    sequence_axes=sequence_axes, sequence_form=form)
