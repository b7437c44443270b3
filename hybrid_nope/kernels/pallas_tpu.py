"""TPU attention through splash attention (jax.experimental.pallas.ops.tpu.splash_attention).

Splash is the maintained TPU kernel for exactly this job: a static LocalMask / CausalMask tells
it which [block_q, block_kv] tiles are empty, so a sliding window costs O(T·w), and segment ids
are applied inside the tiles it visits. We only adapt layouts: it wants [heads, T, H] per
example with T a multiple of the block, unscaled logits, and GQA as fewer kv heads.

`interpret=True` runs the same kernel through the TPU interpreter on CPU for the tests.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from hybrid_nope.kernels import blocking

try:  # The module has moved between jax releases; without it impl="pallas" is off on TPU.
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
except ImportError:  # pragma: no cover - depends on the jax build
  splash = None


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Splash tiles: multiples of 128 (the TPU lane width); 512 is MaxText's usual choice."""
  block_q: int = 512
  block_kv: int = 512

  def splash(self):
    bq, bkv = self.block_q, self.block_kv
    return splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv,
                             block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                             block_q_dq=bq, block_kv_dq=bkv)


def available() -> bool:
  return splash is not None


_NO_MESH = jax.sharding.AbstractMesh((), ())


@functools.lru_cache(maxsize=64)
def _kernel(T: int, num_heads: int, window: int | None, sizes: BlockSizes, interpret: bool):
  """Mask preprocessing is numpy work proportional to (T / block)², so build each one once."""
  if window is None:
    mask = splash.CausalMask(shape=(T, T))
  else:  # Keys i - w < j <= i: w - 1 to the left, none to the right.
    mask = splash.LocalMask(shape=(T, T), window_size=(window - 1, 0), offset=0)
  mask = splash.MultiHeadMask([mask] * num_heads)
  # The kernel holds its mask tables as arrays; make them constants, not tracers of whichever
  # jit happened to build (and cache) the kernel first, and build them outside any mesh: built
  # inside a shard_map they would carry its Manual axes into every later trace that reuses them.
  with jax.ensure_compile_time_eval(), jax.sharding.use_abstract_mesh(_NO_MESH):
    return splash.make_splash_mha(mask, block_sizes=sizes.splash(), head_shards=1,
                                  q_seq_shards=1, interpret=interpret)


def attention(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None,
              block_sizes: BlockSizes | None = None, interpret: bool = False):
  """Causal (sliding-window, segment-masked, GQA) attention; arguments as kernels.attention."""
  if splash is None:
    raise ValueError("impl='pallas' on TPU needs jax.experimental.pallas.ops.tpu."
                     "splash_attention, which this jax build lacks")
  sizes = block_sizes or BlockSizes()
  B, T, N, H = q_BTNH.shape
  window = blocking.effective_window(window, T)
  # Splash tiles are multiples of 128 and must divide the (padded) sequence.
  T128 = blocking.cdiv(T, 128) * 128
  sizes = BlockSizes(min(sizes.block_q, T128), min(sizes.block_kv, T128))
  block = math.lcm(sizes.block_q, sizes.block_kv)
  Tp = blocking.cdiv(T, block) * block
  # Splash leaves the 1/sqrt(H) scale to the caller; tail padding lies in every real query's
  # future, so the causal / local mask already keeps it out.
  pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  q = pad(q_BTNH * jnp.asarray(H**-0.5, q_BTNH.dtype))
  k, v = pad(k_BTKH), pad(v_BTKH)
  if segment_ids is None:
    out = _without_x64(lambda q, k, v: jax.vmap(_kernel(Tp, N, window, sizes, interpret))(
        q, k, v))(q, k, v)
  else:
    seg = blocking.pad_segments(segment_ids, Tp).astype(jnp.int32)
    out = _without_x64(lambda q, k, v, s: jax.vmap(
        lambda q, k, v, s: _kernel(Tp, N, window, sizes, interpret)(
            q, k, v, splash.SegmentIds(q=s, kv=s)))(q, k, v, s))(q, k, v, seg)
  return out.transpose(0, 2, 1, 3)[:, :T]


def _without_x64(fn):
  """fn, with its forward and backward traced under jax_enable_x64=False: splash's index maps
  divide int32 program ids by Python ints, which x64 makes int64 (a lax.div dtype error).
  Every input and output here is 32-bit or narrower, so nothing changes but the tracing."""
  @jax.custom_vjp
  def wrapped(*args):
    with jax.enable_x64(False):
      return fn(*args)

  def forward(*args):
    with jax.enable_x64(False):
      return jax.vjp(fn, *args)

  def backward(vjp, cotangent):
    with jax.enable_x64(False):
      return vjp(cotangent)

  wrapped.defvjp(forward, backward)
  return wrapped
