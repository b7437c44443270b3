"""Gated linear attention forward as a Pallas TPU (Mosaic) kernel; backward from linear_xla.

The same chunked algorithm as linear_xla.py (read its docstring for the maths), laid out for
Mosaic: a grid (batch, query head, chunk) whose last axis runs in order ("arbitrary") and keeps
the [H, H] state in a VMEM scratch buffer, so states never go through HBM except the per-chunk
copies the backward needs. Every operation is a 2-d [C, H] or [C, C] tile op: the direct range
sums of the halving hierarchy come from dots with constant 0/1 matrices (HIGHEST precision, so
they stay float32 sums), and a constant block mask keeps each level's pairs, which costs MXU
work instead of the reshapes Mosaic lowers poorly. A query head recomputes its kv head's state
(G-fold redundant for GQA; fine for a forward kernel whose backward is XLA's).

Status: checked in interpret mode on CPU (tests) and lowered with jax.export for TPU; it has not
run on a TPU (none was available), so its speed there is unmeasured and kernels.linear_attention
"auto" does not pick it. The backward is linear_xla's custom VJP, fed with the per-chunk states
this kernel writes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hybrid_nope.kernels import linear_xla

try:  # Pallas APIs move between jax releases: without them impl="pallas" is off.
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu
except ImportError:  # pragma: no cover - depends on the jax build
  pl = pltpu = None

CHUNK = 64
_SQUEEZED = getattr(pl, "squeezed", None)  # A block dim of size 1 dropped in the kernel.
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b
_NN = (((1,), (0,)), ((), ()))


def available() -> bool:
  return pl is not None and pltpu is not None


@functools.lru_cache(maxsize=8)
def _constants(C: int) -> np.ndarray:
  """[3, L + 1, C, C] float32: per level (the diagonal first, then h = 1 .. C/2) the matrix of
  the q-side sum (from the second half's start to i), of the k-side sum (from j to the first
  half's end) and the mask of the level's pairs; the last level also gives P and U."""
  i, t = np.arange(C)[:, None], np.arange(C)[None, :]
  mats = [[np.zeros((C, C)), np.zeros((C, C)), np.eye(C)]]  # diagonal: weight 1
  h = 1
  while h <= C:
    block = lambda x, size: x // size
    pre = (block(t, h) == block(i, h)) & (t <= i)   # [start of i's h-block, i]
    suf = (block(t, h) == block(i, h)) & (t > i)    # (j, end of j's h-block]
    pairs = ((block(i, 2 * h) == block(t, 2 * h)) & (i % (2 * h) >= h) & (t % (2 * h) < h))
    mats.append([pre, suf, pairs])
    h *= 2
  return np.asarray(mats, np.float32).transpose(1, 0, 2, 3)  # last entry: h = C (P, U)


def _dot(a, b, dims=_NN, precision=None):
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32, precision=precision)


def _kernel(consts_ref, q_ref, k_ref, v_ref, g_ref, *rest, scale, levels, has_segments):
  if has_segments:
    pair_ref, read_ref, write_ref, carry_ref, out_ref, states_ref, S_ref = rest
  else:
    out_ref, states_ref, S_ref = rest

  @pl.when(pl.program_id(2) == 0)
  def _():
    S_ref[...] = jnp.zeros(S_ref.shape, jnp.float32)

  q, k, v, g = (r[...].astype(jnp.float32) for r in (q_ref, k_ref, v_ref, g_ref))
  # -inf (decay 0) would give 0 * -inf = NaN in the sum dots; -1e30 has the same exp, 0.
  g = jnp.maximum(g, -1e30)
  exact = lax.Precision.HIGHEST
  A = _dot(q, k, _NT) * consts_ref[2, 0]  # the diagonal
  for ell in range(1, levels + 1):  # pairs split at the midpoint of a 2h-block, h = 2^(ell-1)
    fq = jnp.exp(_dot(consts_ref[0, ell], g, precision=exact))
    fk = jnp.exp(_dot(consts_ref[1, ell], g, precision=exact))
    A = A + _dot(q * fq, k * fk, _NT) * consts_ref[2, ell]
  ep = jnp.exp(_dot(consts_ref[0, levels + 1], g, precision=exact))  # e^P (chunk prefix)
  eu = jnp.exp(_dot(consts_ref[1, levels + 1], g, precision=exact))  # e^U (chunk suffix)
  decay = jnp.exp(jnp.sum(g, axis=0, keepdims=True))  # [1, H]
  if has_segments:
    A = A * pair_ref[...]
    ep = ep * read_ref[...]
    eu = eu * write_ref[...]
    decay = decay * carry_ref[...]
  S = S_ref[...]
  states_ref[...] = S
  out = _dot(A, v) + _dot(q * ep, S)
  out_ref[...] = (out * scale).astype(out_ref.dtype)
  # diag(decay) S as a dot: the decay indexes S's rows, and a [1, H] row cannot be transposed
  # into a column cheaply.
  eye = (lax.broadcasted_iota(jnp.int32, S.shape, 0) ==
         lax.broadcasted_iota(jnp.int32, S.shape, 1)).astype(jnp.float32)
  S_ref[...] = _dot(eye * decay, S) + _dot(k * eu, v, _TN)


def _forward(q, k, v, g, segment_ids, C, interpret):
  """(out [B, T, N, H], per-chunk input states [n, B·K, H, H], linear_xla's operands)."""
  B, T, N, H = q.shape
  K = k.shape[2]
  G, n = N // K, -(-T // C)
  Tp = n * C
  pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  consts = jnp.asarray(_constants(C))
  levels = consts.shape[1] - 2
  tile = lambda head: pl.BlockSpec((_SQUEEZED, _SQUEEZED, C, H), lambda b, h, c: (b, head(h), c, 0))
  in_specs = [pl.BlockSpec(consts.shape, lambda b, h, c: (0, 0, 0, 0)),
              tile(lambda h: h), *[tile(lambda h: lax.div(h, jnp.int32(G)))] * 3]  # no sign op
  args = [consts, pad(q), pad(k), pad(v), pad(g)]
  if segment_ids is not None:
    # [n, B, ...]: one row per batch row.
    m = linear_xla.all_chunk_masks(segment_ids, B, 1, n, C)
    col = lambda x: x.swapaxes(0, 1).astype(jnp.float32)[..., None]
    args += [m.pair.swapaxes(0, 1).astype(jnp.float32), col(m.read), col(m.write),
             m.carry.swapaxes(0, 1).astype(jnp.float32)[..., None, None]]
    in_specs += [pl.BlockSpec((_SQUEEZED, _SQUEEZED, C, C), lambda b, h, c: (b, c, 0, 0)),
                 *[pl.BlockSpec((_SQUEEZED, _SQUEEZED, C, 1), lambda b, h, c: (b, c, 0, 0))] * 2,
                 pl.BlockSpec((_SQUEEZED, _SQUEEZED, 1, 1), lambda b, h, c: (b, c, 0, 0))]
  kernel = functools.partial(_kernel, scale=H**-0.5, levels=levels,
                             has_segments=segment_ids is not None)
  params = None if interpret else pltpu.CompilerParams(
      dimension_semantics=("parallel", "parallel", "arbitrary"))
  out, states = pl.pallas_call(
      kernel, grid=(B, N, n), in_specs=in_specs,
      out_specs=[tile(lambda h: h),
                 pl.BlockSpec((_SQUEEZED,) * 3 + (H, H), lambda b, h, c: (b, h, c, 0, 0))],
      out_shape=[jax.ShapeDtypeStruct((B, N, Tp, H), q.dtype),
                 jax.ShapeDtypeStruct((B, N, n, H, H), jnp.float32)],
      scratch_shapes=[pltpu.VMEM((H, H), jnp.float32)], compiler_params=params,
      interpret=interpret, name="gla_chunk_fwd")(*args)
  # The backward wants linear_xla's layout: one state per (chunk, batch row, kv head).
  S_in = states[:, ::G].transpose(2, 0, 1, 3, 4).reshape(n, B * K, H, H)
  return out.transpose(0, 2, 1, 3)[:, :T], S_in


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _gla(q, k, v, g, segment_ids, C, interpret):
  return _forward(q, k, v, g, segment_ids, C, interpret)[0]


def _gla_fwd(q, k, v, g, segment_ids, C, interpret):
  out, S_in = _forward(q, k, v, g, segment_ids, C, interpret)
  xs, masks = linear_xla.chunked_operands(q, k, v, g, segment_ids, C)
  return out, (xs, masks, (S_in,))


def _gla_bwd(C, interpret, residuals, dout):
  del interpret
  return linear_xla.gla_backward(C, residuals, dout)


_gla.defvjp(_gla_fwd, _gla_bwd)


def linear_attention(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, *, segment_ids=None,
                     chunk: int | None = None, interpret: bool = False):
  """Gated linear attention; arguments as kernels.linear_attention. `chunk`: a power of two,
  a multiple of 8 (the TPU sublane tile); `interpret=True` runs on any backend (tests)."""
  if not available():
    raise ValueError("impl='pallas' needs jax.experimental.pallas.tpu, which this jax build "
                     "lacks")
  C = chunk or CHUNK
  if C < 8 or C & (C - 1):
    raise ValueError(f"chunk={C}: expected a power of two >= 8")
  return _gla(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, segment_ids, C, interpret)
