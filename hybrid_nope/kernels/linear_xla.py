"""Chunked gated linear attention in pure XLA: every backend, the CPU default.

Per (batch row, kv head) the recurrence S_t = diag(a_t) S_{t-1} + k_t v_tᵀ, out_t = s q_tᵀ S_t
(a_t = exp(g_t), s = H^-1/2) is run over chunks of C tokens by one lax.scan that carries the
[H, H] state. Within a chunk, with P_i = Σ_{t<=i} g_t (from the chunk start) and U_j = Σ_{t>j} g_t
(to its end):
  out_i  = s·[ (q_i ⊙ e^{P_i})ᵀ S_in + Σ_{j<=i} A_ij v_j ],  A_ij = Σ_d q_id k_jd e^{Σ_{j<t<=i} g_td}
  S_out  = e^{P_end} ⊙ S_in + Σ_j (k_j ⊙ e^{U_j}) v_jᵀ.
The intra-chunk weights are per channel, so A is not one matmul; e^{P_i} · e^{-P_j} overflows
when the decay is strong, and P_i − P_j loses its digits after one strong step. Instead each pair
j < i is split at the midpoint of the smallest aligned block holding both (a halving hierarchy:
levels h = 1, 2, ..., C/2): e^{Σ_{j<t<=i} g} = e^{pre_h(i)} · e^{suf_h(j)}, with pre_h(i) the
sum from the second half's start to i and suf_h(j) the sum from j to the first half's end. Both
factors are <= 1 and both exponents are direct sums of non-positive numbers (built by recursive
doubling, never as a difference of prefixes), so nothing overflows and the relative error stays
~C·eps whatever the decay. Each level is one [C/2, H] x [H, C/2] dot whose block-diagonal part
lands in A: log2(C)/4 times the FLOPs of a QKᵀ tile (1.5x at C = 64), in dots that run well.

Segments: each maximal run of equal nonzero ids is its own sequence (run ids from a cumsum of id
changes); masks drop cross-run pairs, the state read before a run's first chunk position, the
state carried across a run start and the writes of every run but a chunk's last. Padding (id 0)
is a run that writes nothing and reads nothing, so it outputs 0 and its gradients are 0.

Backward: a custom VJP, a reverse scan over chunks that recomputes each chunk's A and factors
from the saved per-chunk input states. The log-decay gradient needs no backprop through the
exponentials: out depends on g only through q ⊙ e^{G}, k ⊙ e^{-G} (G the in-run cumulative sum),
so dG = q ⊙ dq − k ⊙ dk and dg is its in-run reverse cumulative sum; the part from later chunks
is rowsum(S_out ⊙ dS_out). The diagonal terms, which cancel exactly in dG, are left out of it so
that a true dg of ~0 (decay near 0) is not buried in their rounding.

Measured on the 2-core AVX-512 CPU this was written on (T=8192, B=1, N=K=4, H=64, float32, one
device, a loaded machine): forward+backward 217 ms with this custom VJP against 396 ms by
autodiff through the forward scan (which stacks every chunk's intermediates); forward 105 vs
83 ms (noise-level: the same scan). Chunk 64 beat 32 (277 ms) and 128 (302 ms). Tried and
slower: full-chunk masked level dots instead of half-row ones (+50% forward), scan unrolling (no
gain). benchmarks/attention.py prints the current figures beside SWA and global attention.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

CHUNK = 64  # Tuned on CPU (module docstring): 32 loops more, 128 spends more in the levels.


def _mm(spec, a, b):
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _levels(g_RCH, C):
  """[(pre_h, suf_h) for h = 1, 2, ..., C/2], (P, U) for the whole chunk: pre_h[i] = Σ g over
  [start of i's aligned h-block, i], suf_h[j] = Σ g over (j, end of j's h-block]."""
  R, _, H = g_RCH.shape
  pre, suf, h, out = g_RCH, jnp.zeros_like(g_RCH), 1, []
  while h < C:
    out.append((pre, suf))
    shape = (R, C // (2 * h), 2, h, H)
    p, s = pre.reshape(shape), suf.reshape(shape)
    second = jnp.arange(2).reshape(1, 1, 2, 1, 1)
    # The first half's total is its prefix at its end; the second half's, likewise.
    pre = (p + jnp.where(second == 1, p[:, :, :1, -1:], 0.0)).reshape(R, C, H)
    suf = (s + jnp.where(second == 0, p[:, :, 1:, -1:], 0.0)).reshape(R, C, H)
    h *= 2
  return out, pre, suf


def _level_terms(q_RCGH, k_RCH, levels, C):
  """Per level h: (h, second-half q rows ⊙ e^pre, first-half k rows ⊙ e^suf, e^pre, e^suf)."""
  R, _, G, H = q_RCGH.shape
  for ell, (pre, suf) in enumerate(levels):
    h = 2**ell
    half = lambda x, i: x.reshape(R, C // (2 * h), 2, h, *x.shape[2:])[:, :, i].reshape(
        R, C // 2, *x.shape[2:])
    fq, fk = jnp.exp(half(pre, 1)), jnp.exp(half(suf, 0))  # rows i = (b, 1, i'), j = (b, 0, j')
    yield h, half(q_RCGH, 1) * fq[:, :, None], half(k_RCH, 0) * fk, fq, fk


def _block_diag(X, h, C):
  """Keep the pairs of [R, C/2, G, C/2] whose rows and columns lie in the same 2h-block."""
  R, _, G, _ = X.shape
  nb = C // (2 * h)
  X = X.reshape(R, nb, h, G, nb, h) * jnp.eye(nb, dtype=X.dtype)[:, None, None, :, None]
  return X


def _intra(q_RCGH, k_RCH, levels, C):
  """A [R, C, G, C] for j <= i (no segment mask): the diagonal plus each level's pairs."""
  R, _, G, _ = q_RCGH.shape
  diag = jnp.einsum("rigd,rid->rig", q_RCGH, k_RCH)
  A = diag[..., None] * jnp.eye(C, dtype=jnp.float32)[:, None, :]
  for h, qs, ks, _, _ in _level_terms(q_RCGH, k_RCH, levels, C):
    X = _block_diag(_mm("rigd,rjd->rigj", qs, ks), h, C)
    # Into A viewed as [R, (b, 2, h), G, (b, 2, h)]: rows of second halves, columns of first.
    X = jnp.pad(X[:, :, None, :, :, :, None, :],
                ((0, 0), (0, 0), (1, 0), (0, 0), (0, 0), (0, 0), (0, 1), (0, 0)))
    A = A + X.reshape(R, C, G, C)
  return A


def _unblock(dA, h, C):
  """The [R, C/2, G, C/2] level-h pairs of a [R, C, G, C] cotangent (inverse of the pad)."""
  R, _, G, _ = dA.shape
  nb = C // (2 * h)
  X = dA.reshape(R, nb, 2, h, G, nb, 2, h)[:, :, 1, :, :, :, 0, :]
  return _block_diag(X.reshape(R, C // 2, G, C // 2), h, C).reshape(R, C // 2, G, C // 2)


def _scatter_half(x, h, half, C):
  """[R, C/2, ...] rows back into the `half` rows of every 2h-block of [R, C, ...], zeros else."""
  R = x.shape[0]
  x = x.reshape(R, C // (2 * h), 1, h, *x.shape[2:])
  pad = [(0, 0)] * x.ndim
  pad[2] = (1, 0) if half else (0, 1)
  return jnp.pad(x, pad).reshape(R, C, *x.shape[4:])


class _Masks(NamedTuple):
  """Per chunk [n, R, ...] run masks (None without segment ids: one run, all valid)."""
  pair: jax.Array   # [n, R, C, C] j <= i in one run, i not padding
  read: jax.Array   # [n, R, C]    reads the state entering the chunk
  write: jax.Array  # [n, R, C]    writes the state leaving it (the chunk's last run)
  carry: jax.Array  # [n, R]       the entering state survives the chunk (no run starts in it)
  start: jax.Array  # [n, R, C]    a run starts here, or padding: dlog_decay is 0


def _masks(segment_ids, B, K, n, C) -> _Masks:
  """Runs of equal nonzero ids over the padded [B, n·C] ids (tail padding is id 0)."""
  seg = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, n * C - segment_ids.shape[1])))
  change = jnp.concatenate([jnp.ones((B, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  run = jnp.cumsum(change, axis=1, dtype=jnp.int32)
  per_chunk = lambda x: jnp.repeat(x.reshape(B, n, C).swapaxes(0, 1), K, axis=1)
  run, valid, change = per_chunk(run), per_chunk(seg != 0), per_chunk(change)
  prev = jnp.concatenate([jnp.full((1, B * K), -1, jnp.int32), run[:-1, :, -1]], axis=0)
  tril = jnp.tril(jnp.ones((C, C), bool))
  pair = (run[..., :, None] == run[..., None, :]) & valid[..., :, None] & tril
  return _Masks(pair, valid & (run == prev[..., None]), valid & (run == run[..., -1:]),
                run[..., -1] == prev, change | ~valid)


def _chunk(q, k, v, g, m, C):
  """One chunk's shared pieces in float32: the levels, A (masked), e^P where the state is read,
  e^U where it is written, the state decay (0 where a run starts in the chunk)."""
  q, k, v, g = (x.astype(jnp.float32) for x in (q, k, v, g))
  levels, P, U = _levels(g, C)
  A = _intra(q, k, levels, C)
  ep, eu, decay = jnp.exp(P), jnp.exp(U), jnp.exp(P[:, -1])
  if m is not None:
    A = jnp.where(m.pair[:, :, None, :], A, 0.0)
    ep = jnp.where(m.read[..., None], ep, 0.0)
    eu = jnp.where(m.write[..., None], eu, 0.0)
    decay = jnp.where(m.carry[:, None], decay, 0.0)
  return (q, k, v), levels, A, ep, eu, decay


def _forward(xs, masks, C, scale, S0):
  def body(S, x):
    q, k, v, g, m = x
    (q, k, v), _, A, ep, eu, decay = _chunk(q, k, v, g, m, C)
    out = scale * (_mm("rigj,rjh->righ", A, v) + _mm("rigd,rde->rige", q * ep[:, :, None], S))
    return decay[..., None] * S + _mm("rjd,rje->rde", k * eu, v), (out, S)
  return lax.scan(body, S0, (*xs, masks))[1]


def _backward(xs, masks, S_in, dout, C, scale):
  """Reverse scan over chunks carrying dS, the gradient of the state leaving the chunk."""
  def body(dS, x):
    q0, k0, v0, g0, m, S, do = x
    (q, k, v), levels, A, ep, eu, decay = _chunk(q0, k0, v0, g0, m, C)
    qt, kt = q * ep[:, :, None], k * eu
    do = scale * do.astype(jnp.float32)
    dA = _mm("righ,rjh->rigj", do, v)
    dA = jnp.where(m.pair[:, :, None, :], dA, 0.0) if m is not None else (
        dA * jnp.tri(C, dtype=jnp.float32)[:, None])
    dv = _mm("rigj,righ->rjh", A, do) + _mm("rjd,rde->rje", kt, dS)
    dq = _mm("righ,rdh->rigd", do, S) * ep[:, :, None]
    dk = _mm("rjh,rdh->rjd", v, dS) * eu
    for h, qs, ks, fq, fk in _level_terms(q, k, levels, C):
      dX = _unblock(dA, h, C)
      dq = dq + _scatter_half(_mm("rigj,rjd->rigd", dX, ks) * fq[:, :, None], h, 1, C)
      dk = dk + _scatter_half(_mm("rigj,rigd->rjd", dX, qs) * fk, h, 0, C)
    # out depends on g through q ⊙ e^G and k ⊙ e^-G only: dG = q ⊙ dq - k ⊙ dk; dg is its
    # in-run reverse cumulative sum, the later chunks' part being rowsum(S_out ⊙ dS_out).
    # The diagonal (i = j) terms cancel exactly in dG, so they join dq, dk only after it: else
    # their rounding would swamp a true dg of ~0 (decay near 0).
    dG = jnp.sum(q * dq, axis=2) - k * dk
    diag = jnp.diagonal(dA, axis1=1, axis2=3).transpose(0, 2, 1)  # [R, C, G]
    dq = dq + diag[..., None] * k[:, :, None]
    dk = dk + jnp.einsum("rig,rigd->rid", diag, q)
    S_out = decay[..., None] * S + _mm("rjd,rje->rde", kt, v)
    tail = jnp.sum(S_out * dS, axis=-1)
    suffix = jnp.swapaxes(m.pair, 1, 2) if m is not None else jnp.tri(C, dtype=bool).T
    dg = jnp.einsum("rit,rtd->rid", jnp.broadcast_to(suffix, dG.shape[:1] + (C, C)).astype(
        jnp.float32), dG, precision=lax.Precision.HIGHEST)
    if m is not None:
      dg = dg + jnp.where(m.write[..., None], tail[:, None], 0.0)
      dg = jnp.where(m.start[..., None], 0.0, dg)
    else:
      dg = dg + tail[:, None]
    dS_prev = decay[..., None] * dS + _mm("rigd,rige->rde", qt, do)
    grads = tuple(x.astype(x0.dtype) for x, x0 in zip((dq, dk, dv, dg), (q0, k0, v0, g0)))
    return dS_prev, grads
  R, H = S_in.shape[1], S_in.shape[-1]
  return lax.scan(body, jnp.zeros((R, H, H), jnp.float32), (*xs, masks, S_in, dout),
                  reverse=True)[1]


def _to_chunks(x, B, n, C, K):
  """[B, n·C, K, (G,) H] -> [n, B·K, C, (G,) H]."""
  x = x.reshape(B, n, C, K, *x.shape[3:])
  x = jnp.moveaxis(x, 3, 2).swapaxes(0, 1)
  return x.reshape(n, B * K, C, *x.shape[4:])


def _from_chunks(x, B, K):
  """Inverse of _to_chunks."""
  n, _, C = x.shape[:3]
  x = x.reshape(n, B, K, C, *x.shape[3:]).swapaxes(0, 1)
  return jnp.moveaxis(x, 2, 3).reshape(B, n * C, K, *x.shape[4:])


def _prepare(q, k, v, g, segment_ids, C):
  B, T, N, H = q.shape
  K = k.shape[2]
  n = -(-T // C)
  pad = lambda x: jnp.pad(x, ((0, 0), (0, n * C - T)) + ((0, 0),) * (x.ndim - 2))
  xs = (_to_chunks(pad(q).reshape(B, n * C, K, N // K, H), B, n, C, K),
        *(_to_chunks(pad(x), B, n, C, K) for x in (k, v, g)))
  masks = None if segment_ids is None else _masks(segment_ids, B, K, n, C)
  return xs, masks


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _gla(q, k, v, g, segment_ids, C):
  return _gla_fwd(q, k, v, g, segment_ids, C)[0]


def _gla_fwd(q, k, v, g, segment_ids, C):
  B, T, N, H = q.shape
  xs, masks = _prepare(q, k, v, g, segment_ids, C)
  out, S_in = _forward(xs, masks, C, H**-0.5, jnp.zeros((B * k.shape[2], H, H), jnp.float32))
  out = _from_chunks(out, B, k.shape[2]).reshape(B, -1, N, H)[:, :T].astype(q.dtype)
  return out, (xs, masks, S_in)


def _gla_bwd(C, residuals, dout):
  xs, masks, S_in = residuals
  B, T, N, H = dout.shape
  K = xs[1].shape[1] // B
  n = S_in.shape[0]
  dout = jnp.pad(dout, ((0, 0), (0, n * C - T), (0, 0), (0, 0))).reshape(B, n * C, K, N // K, H)
  dq, dk, dv, dg = _backward(xs, masks, S_in, _to_chunks(dout, B, n, C, K), C, H**-0.5)
  dq = _from_chunks(dq, B, K).reshape(B, n * C, N, H)[:, :T]
  dk, dv, dg = (_from_chunks(x, B, K)[:, :T] for x in (dk, dv, dg))
  if masks is None:  # g at t = 0 multiplies the zero initial state.
    dg = dg.at[:, 0].set(0)
  return dq, dk, dv, dg, None


_gla.defvjp(_gla_fwd, _gla_bwd)


def linear_attention(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, *, segment_ids=None,
                     chunk: int | None = None):
  """Gated linear attention; arguments as kernels.linear_attention. `chunk` (a power of two)
  overrides the tuned chunk size (tests, benchmarks)."""
  C = chunk or CHUNK
  if C < 1 or C & (C - 1):
    raise ValueError(f"chunk={C}: expected a power of two")
  return _gla(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, segment_ids, C)
