"""Pure-XLA flash attention: runs on every backend, the CPU default.

Loops, outermost first: over (batch row, kv head); over query blocks of `block_q` tokens; over
the key chunks of `chunk_k` tokens the block can reach, newest first, with an online softmax.
The window and the segment ids bound the chunks a block visits (blocking.py), so a sliding
window costs O(T·(w + block_q)) time and global attention O(T²/2 + T·chunk_k), and nothing
bigger than one [G·block_q, chunk_k] score tile is live: memory is O(T) per head plus one tile,
forward and backward. When a window fits one chunk (the usual SWA case) the chunk loop is gone
and each block is one plain softmax over [block_q + ~w] keys.

Why this shape, measured on a 2-core AVX-512 CPU (benchmarks/attention.py, T=8192, w=256):
  * XLA:CPU runs these small dots on one thread and does not overlap independent ops (two
    independent loops take the sum of their times), so the game is single-core efficiency:
    plain 2-d [G·c, H] x [H, S] dots, the G query heads of a kv head stacked as rows. Looping
    over heads outside the blocks measured ~15% faster than batching the heads into each dot.
  * Queries, outputs and their gradients are sliced from / written into the caller's
    [B, T, N, H] arrays inside the loop (a small in-cache transpose per block) instead of
    whole-array transposes, which cost passes over memory that no longer fits in cache at
    T >= 8k (~13% faster at T=8192). Only k and v are laid out heads-major once, in the
    forward, and kept for the backward.
  * The backward is a custom VJP in the FlashAttention-2 style: it keeps only out and the
    log-sum-exp, recomputes each tile's probabilities and accumulates dk, dv per head.
    Autodiff through the scans stacks every tile's probabilities and measured ~2x slower;
    saving just the probabilities (O(T·w) memory) instead of recomputing them, ~15% slower.
Scores are base 2 (log2(e)/sqrt(H) folded into q) so the softmax uses exp2.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hybrid_nope.kernels import blocking
from hybrid_nope.kernels.blocking import LOG2E, MASKED

# Tuned with benchmarks/attention.py (float32, H=64): 64-query blocks keep a sliding window's
# masked waste at 64 / w while the dots still run near the core's matmul rate; global layers
# use 256 x 256 tiles (larger chunks waste more on the diagonal, smaller ones loop more).
SWA_BLOCK_Q = 64
GLOBAL_BLOCK_Q = 256
GLOBAL_CHUNK_K = 256
MAX_SINGLE_CHUNK = 2048  # Wider windows are walked in GLOBAL_CHUNK_K chunks instead.


@dataclasses.dataclass(frozen=True)
class Tiling:
  """Static block layout of one call."""
  block_q: int     # queries per block (c)
  chunk_k: int     # keys per chunk (s), a multiple of block_q
  max_chunks: int  # most chunks any block reads
  num_blocks: int  # query blocks: T padded up to num_blocks * block_q

  @property
  def front(self) -> int:  # Keys are padded in front so every chunk slice stays in bounds.
    return self.chunk_k - self.block_q


def tiling(T: int, window: int | None, *, block_q: int | None = None,
           chunk_k: int | None = None) -> Tiling:
  window = blocking.effective_window(window, T)
  if window is not None and block_q is None and chunk_k is None:
    c = min(SWA_BLOCK_Q, T)
    span = c + blocking.cdiv(window - 1, c) * c
    if span <= MAX_SINGLE_CHUNK:
      return Tiling(c, span, 1, blocking.cdiv(T, c))
  c = min(block_q or GLOBAL_BLOCK_Q, T)
  nb = blocking.cdiv(T, c)
  s = min(max(c, (chunk_k or GLOBAL_CHUNK_K) // c * c), nb * c)
  # Block i reads keys [(i+1)c - reach, (i+1)c): all of the past, or its c + w - 1 keys.
  reach = nb * c if window is None else min(nb * c, window + c - 1)
  return Tiling(c, s, blocking.cdiv(reach, s), nb)


class Operands(NamedTuple):
  """What both passes read; also the VJP's residuals, so the backward redoes no layout work."""
  q_BTNH: jax.Array    # tail-padded to num_blocks * block_q
  k_BKLH: jax.Array    # heads-major, front- and tail-padded: L = front + num_blocks * block_q
  v_BKLH: jax.Array
  seg_BL: jax.Array | None
  counts_Bn: jax.Array  # [B or 1, num_blocks]: key chunks each query block visits


def _pad_time(x, before, after):
  pad = [(0, 0)] * x.ndim
  pad[1] = (before, after)
  return jnp.pad(x, pad) if before or after else x


def _prepare(q_BTNH, k_BTKH, v_BTKH, segment_ids, window, t: Tiling) -> Operands:
  T = q_BTNH.shape[1]
  Tp = t.num_blocks * t.block_q
  k_BKLH, v_BKLH = (_pad_time(x, t.front, Tp - T).transpose(0, 2, 1, 3) for x in (k_BTKH, v_BTKH))
  seg_BL = seg_BT = None
  if segment_ids is not None:
    seg_BT = blocking.pad_segments(segment_ids, Tp)
    seg_BL = _pad_time(seg_BT, t.front, 0)  # Front padding is masked by position.
  lo_Bn = blocking.query_block_key_start(Tp, t.block_q, window, seg_BT)
  end_n = jnp.arange(1, t.num_blocks + 1, dtype=jnp.int32) * t.block_q
  counts_Bn = jnp.clip((end_n - lo_Bn + t.chunk_k - 1) // t.chunk_k, 1, t.max_chunks)
  return Operands(_pad_time(q_BTNH, 0, Tp - T), k_BKLH, v_BKLH, seg_BL, counts_Bn)


# Index operands of one dynamic slice must share a dtype, also under jax_enable_x64.
_ZERO = np.int32(0)


def _mm(a, b, contract):
  """2-d matmul with float32 accumulation; contract = (lhs dim, rhs dim)."""
  dims = (((contract[0],), (contract[1],)), ((), ()))
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


class _Head(NamedTuple):
  """One (batch row, kv head): where its keys and values are, its segment ids and chunk counts."""
  b: jax.Array
  kh: jax.Array
  k_BKLH: jax.Array  # All heads: slicing spans in place beats copying out one head's keys.
  v_BKLH: jax.Array
  seg_L: jax.Array | None
  counts_n: jax.Array

  def span(self, x_BKLH, start, s):
    H = x_BKLH.shape[-1]
    return lax.dynamic_slice(x_BKLH, (self.b, self.kh, start, _ZERO), (1, 1, s, H))[0, 0]


def _head(ops: Operands, r, K) -> _Head:
  b, kh = r // K, r % K
  pick = lambda x, i: lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
  seg_L = None if ops.seg_BL is None else pick(ops.seg_BL, b)
  counts_n = pick(ops.counts_Bn, b if ops.counts_Bn.shape[0] > 1 else 0)
  return _Head(b, kh, ops.k_BKLH, ops.v_BKLH, seg_L, counts_n)


def _rows(x_BTNH, h: _Head, i, c, G, scale=None):
  """Block i of head h's G query heads as [G·c, H], rows ordered (g, c); times `scale` if given."""
  H = x_BTNH.shape[-1]
  x_CGH = lax.dynamic_slice(x_BTNH, (h.b, i * c, h.kh * G, _ZERO), (1, c, G, H))[0]
  if scale is not None:
    x_CGH = x_CGH * jnp.asarray(scale, x_CGH.dtype)
  return x_CGH.transpose(1, 0, 2).reshape(G * c, H)


def _write_rows(x_BTNH, rows_MH, h: _Head, i, c, G):
  """Inverse of _rows: write [G·c, H] into block i of head h."""
  H = rows_MH.shape[-1]
  block = rows_MH.reshape(G, c, H).transpose(1, 0, 2).astype(x_BTNH.dtype)[None]
  return lax.dynamic_update_slice(x_BTNH, block, (h.b, i * c, h.kh * G, _ZERO))


def _tile(q_MH, h: _Head, i, j, window, t: Tiling):
  """Masked base-2 scores [G·c, s] of block i against its chunk j, and the chunk's values."""
  c, s = t.block_q, t.chunk_k
  start = i * c - j * s  # Chunk j holds keys [(i+1)c - (j+1)s, (i+1)c - js): padded index.
  k_SH = h.span(h.k_BKLH, start, s)
  v_SH = h.span(h.v_BKLH, start, s)
  scores_MS = _mm(q_MH, k_SH, (1, 1))
  qpos_C = i * c + jnp.arange(c)
  kpos_S = start - t.front + jnp.arange(s)
  allowed_CS = (kpos_S[None, :] <= qpos_C[:, None]) & (kpos_S[None, :] >= 0)
  if window is not None:
    allowed_CS &= kpos_S[None, :] > qpos_C[:, None] - window
  if h.seg_L is not None:
    seg_C = lax.dynamic_slice_in_dim(h.seg_L, t.front + i * c, c)
    allowed_CS &= seg_C[:, None] == lax.dynamic_slice_in_dim(h.seg_L, start, s)[None, :]
  M = q_MH.shape[0]
  scores = jnp.where(allowed_CS, scores_MS.reshape(M // c, c, s), MASKED)
  return scores.reshape(M, s), v_SH, k_SH, start


def _forward(ops: Operands, window, t: Tiling, out_dtype):
  B, Tp, N, H = ops.q_BTNH.shape
  K = ops.k_BKLH.shape[1]
  G, c = N // K, t.block_q
  scale = LOG2E * H**-0.5

  def per_head(out_BTNH, r):
    h = _head(ops, r, K)

    def per_block(out_BTNH, xs):
      i, count = xs
      q_MH = _rows(ops.q_BTNH, h, i, c, G, scale)
      if t.max_chunks == 1:
        scores_MS, v_SH, _, _ = _tile(q_MH, h, i, 0, window, t)
        m_M = scores_MS.max(-1)
        p_MS = jnp.exp2(scores_MS - m_M[:, None])
        l_M = p_MS.sum(-1)
        acc_MH = _mm(p_MS.astype(v_SH.dtype), v_SH, (1, 0))
      else:
        def per_chunk(j, carry):
          m_M, l_M, acc_MH = carry
          scores_MS, v_SH, _, _ = _tile(q_MH, h, i, j, window, t)
          m_new = jnp.maximum(m_M, scores_MS.max(-1))
          p_MS = jnp.exp2(scores_MS - m_new[:, None])
          correction = jnp.exp2(m_M - m_new)
          acc_MH = acc_MH * correction[:, None] + _mm(p_MS.astype(v_SH.dtype), v_SH, (1, 0))
          return m_new, l_M * correction + p_MS.sum(-1), acc_MH
        init = (jnp.full((G * c,), MASKED, jnp.float32), jnp.zeros((G * c,), jnp.float32),
                jnp.zeros((G * c, H), jnp.float32))
        m_M, l_M, acc_MH = lax.fori_loop(0, count, per_chunk, init)
      out_BTNH = _write_rows(out_BTNH, acc_MH / l_M[:, None], h, i, c, G)
      return out_BTNH, m_M + jnp.log2(l_M)

    xs = (jnp.arange(t.num_blocks, dtype=jnp.int32), h.counts_n)
    return lax.scan(per_block, out_BTNH, xs)

  out_BTNH = jnp.zeros((B, Tp, N, H), out_dtype)
  out_BTNH, lse_RnM = lax.scan(per_head, out_BTNH, jnp.arange(B * K, dtype=jnp.int32))
  return out_BTNH, lse_RnM


def _backward(ops: Operands, out_BTNH, lse_RnM, dout_BTNH, window, t: Tiling):
  B, Tp, N, H = ops.q_BTNH.shape
  K = ops.k_BKLH.shape[1]
  L = ops.k_BKLH.shape[2]
  G, c, s = N // K, t.block_q, t.chunk_k
  scale = LOG2E * H**-0.5

  def per_head(dq_BTNH, xs):
    r, lse_nM = xs
    h = _head(ops, r, K)

    def per_block(carry, xs):
      dq_BTNH, dk_LH, dv_LH = carry
      i, count, lse_M = xs
      q_MH = _rows(ops.q_BTNH, h, i, c, G, scale)
      do_MH = _rows(dout_BTNH, h, i, c, G)
      # delta = rowsum(out · dout) = sum_j p_ij dp_ij: the softmax backward's row term.
      delta_M = jnp.sum(_rows(out_BTNH, h, i, c, G).astype(jnp.float32)
                        * do_MH.astype(jnp.float32), -1)

      def per_chunk(j, carry):
        dq_MH, dk_LH, dv_LH = carry
        scores_MS, v_SH, k_SH, start = _tile(q_MH, h, i, j, window, t)
        p_MS = jnp.exp2(scores_MS - lse_M[:, None])  # Masked entries underflow to exactly 0.
        dv_SH = _mm(p_MS.astype(do_MH.dtype), do_MH, (0, 0))
        ds_MS = (p_MS * (_mm(do_MH, v_SH, (1, 1)) - delta_M[:, None])).astype(q_MH.dtype)
        dq_MH = dq_MH + _mm(ds_MS, k_SH, (1, 0))
        dk_SH = _mm(ds_MS, q_MH, (0, 0))
        add = lambda acc, d: lax.dynamic_update_slice_in_dim(
            acc, lax.dynamic_slice_in_dim(acc, start, s, 0) + d, start, 0)
        return dq_MH, add(dk_LH, dk_SH), add(dv_LH, dv_SH)

      init = (jnp.zeros((G * c, H), jnp.float32), dk_LH, dv_LH)
      if t.max_chunks == 1:
        dq_MH, dk_LH, dv_LH = per_chunk(0, init)
      else:
        dq_MH, dk_LH, dv_LH = lax.fori_loop(0, count, per_chunk, init)
      # q was scaled by log2(e)/sqrt(H) inside the scores: dq carries 1/sqrt(H) only.
      dq_BTNH = _write_rows(dq_BTNH, dq_MH * H**-0.5, h, i, c, G)
      return (dq_BTNH, dk_LH, dv_LH), None

    zeros_LH = jnp.zeros((L, H), jnp.float32)
    xs = (jnp.arange(t.num_blocks, dtype=jnp.int32), h.counts_n, lse_nM)
    (dq_BTNH, dk_LH, dv_LH), _ = lax.scan(per_block, (dq_BTNH, zeros_LH, zeros_LH), xs)
    # dk came from log2(e)-scaled scores and log2(e)/sqrt(H)-scaled q: keep 1/sqrt(H).
    return dq_BTNH, (dk_LH[t.front:] / LOG2E, dv_LH[t.front:])

  dq_BTNH = jnp.zeros((B, Tp, N, H), out_BTNH.dtype)
  xs = (jnp.arange(B * K, dtype=jnp.int32), lse_RnM)
  dq_BTNH, (dk_RTH, dv_RTH) = lax.scan(per_head, dq_BTNH, xs)
  dk_BTKH, dv_BTKH = (x.reshape(B, K, Tp, H).transpose(0, 2, 1, 3).astype(out_BTNH.dtype)
                      for x in (dk_RTH, dv_RTH))
  return dq_BTNH, dk_BTKH, dv_BTKH


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q_BTNH, k_BTKH, v_BTKH, segment_ids, window, t):
  return _flash_fwd(q_BTNH, k_BTKH, v_BTKH, segment_ids, window, t)[0]


def _flash_fwd(q_BTNH, k_BTKH, v_BTKH, segment_ids, window, t):
  T = q_BTNH.shape[1]
  ops = _prepare(q_BTNH, k_BTKH, v_BTKH, segment_ids, window, t)
  out_BTNH, lse_RnM = _forward(ops, window, t, q_BTNH.dtype)
  return out_BTNH[:, :T], (ops, out_BTNH, lse_RnM)


def _flash_bwd(window, t, residuals, dout_BTNH):
  ops, out_BTNH, lse_RnM = residuals
  T = dout_BTNH.shape[1]
  dout_BTNH = _pad_time(dout_BTNH, 0, out_BTNH.shape[1] - T)
  dq, dk, dv = _backward(ops, out_BTNH, lse_RnM, dout_BTNH, window, t)
  return dq[:, :T], dk[:, :T], dv[:, :T], None


_flash.defvjp(_flash_fwd, _flash_bwd)


def attention(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None, block_q=None,
              chunk_k=None):
  """Causal attention; `block_q` / `chunk_k` override the tuned tiling (tests, benchmarks)."""
  T = q_BTNH.shape[1]
  window = blocking.effective_window(window, T)
  t = tiling(T, window, block_q=block_q, chunk_k=chunk_k)
  return _flash(q_BTNH, k_BTKH, v_BTKH, segment_ids, window, t)
