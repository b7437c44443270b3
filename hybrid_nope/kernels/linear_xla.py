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
factors are <= 1 and each is a direct product of decays a_t = e^{g_t} in [0, 1] (the log-space
sums exponentiated term by term, built by recursive doubling, never as a ratio or a difference
of prefixes), so nothing overflows and the relative error stays ~C·eps whatever the decay; a
product that underflows is a weight below 1e-38, where the true one is too. Level h is C/2h
batched [h, H] x [H, h] block dots whose products land in A: every pair j < i lies in exactly one
block, so the levels together do the q·k of the chunk's causal pairs and nothing more.

Segments: each maximal run of equal nonzero ids is its own sequence (run ids from a cumsum of id
changes); masks drop cross-run pairs, the state read before a run's first chunk position, the
state carried across a run start and the writes of every run but a chunk's last. Padding (id 0)
is a run that writes nothing and reads nothing, so it outputs 0 and its gradients are 0.

Backward: a custom VJP, a reverse scan over chunks that recomputes each chunk's level factors
from the saved per-chunk input states and intra-chunk weights A. The log-decay gradient needs no backprop through the
exponentials: out depends on g only through q ⊙ e^{G}, k ⊙ e^{-G} (G the in-run cumulative sum),
so dG = q ⊙ dq − k ⊙ dk (full gradients, through the state too) and dg is its in-run reverse
cumulative sum: within the chunk a masked triangular dot, from later chunks their in-run sum of
dG, carried by the reverse scan as one [H] vector per head (no S_out recomputed, no [H, H]
pass). The diagonal terms, which cancel exactly in dG, are left out of it so that a true dg of
~0 (decay near 0) is not buried in their rounding.

Data movement: each scan step slices its chunk straight out of the caller's [B, T, ., H] arrays
(a small in-cache transpose to heads-major [B·K, C, ., H]) and hands its outputs back as the
scan's stacked ys, which for B = 1 already are the caller's layout: no whole-array transposes in
or out, forward or backward, and no pad when T is a multiple of C. Segment masks are built per
chunk inside the loop from the [B, T] run ids. The per-level block totals are reductions of g
(decay_levels); taking them as the previous level's prefix at the half's end made XLA
re-evaluate the whole chain of levels inside every level's fusion (2^level loads per element).

How fast it is, what limits it on CPU, what changed since its first version and what was tried
and found slower: docs/performance.md, "CPU: gated linear attention".
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

CHUNK = 32  # Tuned on CPU (docs/performance.md): 16 and 64 are ~7% slower at T=8192.


def _mm(spec, a, b):
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def decay_levels(g_RCH, C):
  """[(e^pre_h, e^suf_h) for h = 1, 2, ..., C/2] and (e^P, e^U) for the whole chunk: pre_h[i] =
  Σ g over [start of i's aligned h-block, i], suf_h[j] = Σ g over (j, end of j's h-block].

  All are products of the decays a = e^g (one exponential per element, not one per level and
  factor: those were ~9% of forward+backward), built from the aligned block products B_h
  (direct products): e^pre_2h = e^pre_h · (second half) B_h of the first half, e^suf_2h =
  e^suf_h · (first half) B_h of the second half. Every factor is a product of numbers in
  [0, 1], so nothing overflows and the relative error stays ~C·eps whatever the decay. Each
  level reads the previous one at the same position only, so XLA's fusion of the chain costs
  O(levels) per element (indexing the previous level's prefix at a half's end instead
  duplicated the whole chain at every level: exponential work inside one fusion)."""
  R, _, H = g_RCH.shape
  a = jnp.exp(g_RCH)
  pre, suf, h, out = a, jnp.ones_like(a), 1, []
  while h < C:
    out.append((pre, suf))
    total = jnp.prod(a.reshape(R, C // (2 * h), 2, h, H), axis=3, keepdims=True)
    first, second = total[:, :, :1], total[:, :, 1:]
    one = jnp.ones_like(first)
    shape = (R, C // (2 * h), 2, h, H)
    pre = pre * jnp.broadcast_to(jnp.concatenate([one, first], axis=2), shape).reshape(R, C, H)
    suf = suf * jnp.broadcast_to(jnp.concatenate([second, one], axis=2), shape).reshape(R, C, H)
    h *= 2
  return out, pre, suf


def _level_terms(q_RCGH, k_RCH, levels, C):
  """Per level h: (h, second-half q rows ⊙ e^pre, first-half k rows ⊙ e^suf, e^pre, e^suf)."""
  R, _, G, H = q_RCGH.shape
  for ell, (exp_pre, exp_suf) in enumerate(levels):
    h = 2**ell
    half = lambda x, i: x.reshape(R, C // (2 * h), 2, h, *x.shape[2:])[:, :, i].reshape(
        R, C // 2, *x.shape[2:])
    fq, fk = half(exp_pre, 1), half(exp_suf, 0)  # rows i = (b, 1, i'), j = (b, 0, j')
    yield h, half(q_RCGH, 1) * fq[:, :, None], half(k_RCH, 0) * fk, fq, fk


def _blocks(x, h):
  """[R, C/2, ...] half rows (b, i') -> [R, nb, h, ...]: one row block per 2h-block."""
  return x.reshape(x.shape[0], -1, h, *x.shape[2:])


def _embed(X_RbiGj, C):
  """Level-h block products [R, nb, h, G, h] (rows: the second half of each 2h-block, columns:
  its first half) at their places in an [R, C, G, C] matrix, zeros elsewhere."""
  R, nb, h, G, _ = X_RbiGj.shape
  X = X_RbiGj[:, :, :, :, None, :] * jnp.eye(nb, dtype=X_RbiGj.dtype)[:, None, None, :, None]
  # Into [R, (b, 2, h), G, (b, 2, h)]: rows of second halves, columns of first.
  X = jnp.pad(X[:, :, None, :, :, :, None, :],
              ((0, 0), (0, 0), (1, 0), (0, 0), (0, 0), (0, 0), (0, 1), (0, 0)))
  return X.reshape(R, C, G, C)


def _extract(dA, h, C):
  """The level-h blocks [R, nb, h, G, h] of an [R, C, G, C] cotangent (the adjoint of _embed)."""
  R, _, G, _ = dA.shape
  nb = C // (2 * h)
  X = dA.reshape(R, nb, 2, h, G, nb, 2, h)[:, :, 1, :, :, :, 0, :]
  return jnp.sum(X * jnp.eye(nb, dtype=dA.dtype)[:, None, None, :, None], axis=4)


def intra_chunk_weights(q_RCGH, k_RCH, levels, C):
  """A [R, C, G, C] for j <= i (no segment mask): the diagonal plus each level's pairs, each
  level's as nb = C/2h batched [h, H] x [H, h] block dots (one [C/2, C/2] dot per level kept
  only its block diagonal: 3% slower forward+backward)."""
  diag = jnp.einsum("rigd,rid->rig", q_RCGH, k_RCH)
  A = diag[..., None] * jnp.eye(C, dtype=jnp.float32)[:, None, :]
  for h, qs, ks, _, _ in _level_terms(q_RCGH, k_RCH, levels, C):
    A = A + _embed(_mm("rbigd,rbjd->rbigj", _blocks(qs, h), _blocks(ks, h)), C)
  return A


def _scatter_half(x, h, half, C):
  """[R, C/2, ...] rows back into the `half` rows of every 2h-block of [R, C, ...], zeros else."""
  R = x.shape[0]
  x = x.reshape(R, C // (2 * h), 1, h, *x.shape[2:])
  pad = [(0, 0)] * x.ndim
  pad[2] = (1, 0) if half else (0, 1)
  return jnp.pad(x, pad).reshape(R, C, *x.shape[4:])


class _Masks(NamedTuple):
  """Run masks of one chunk, [R, ...] (or [n, R, ...] for all chunks, from
  all_chunk_masks); None without segment ids: one run, all valid."""
  pair: jax.Array   # [R, C, C] j <= i in one run, i not padding
  read: jax.Array   # [R, C]    reads the state entering the chunk
  write: jax.Array  # [R, C]    writes the state leaving it (the chunk's last run)
  carry: jax.Array  # [R]       the entering state survives the chunk (no run starts in it)
  start: jax.Array  # [R, C]    a run starts here, or padding: dlog_decay is 0


def all_chunk_masks(segment_ids, B, K, n, C) -> _Masks:
  """All chunks' [n, B·K, ...] masks at once (linear_pallas's forward reads them)."""
  run_all, valid_all = run_ids(segment_ids, n * C)
  per_chunk = lambda x: jnp.repeat(x.reshape(B, n, C).swapaxes(0, 1), K, axis=1)
  change = jnp.concatenate([jnp.ones((B, 1), bool), run_all[:, 1:] != run_all[:, :-1]], axis=1)
  run, valid, change = per_chunk(run_all), per_chunk(valid_all), per_chunk(change)
  prev = jnp.concatenate([jnp.full((1, B * K), -1, jnp.int32), run[:-1, :, -1]], axis=0)
  tril = jnp.tril(jnp.ones((C, C), bool))
  pair = (run[..., :, None] == run[..., None, :]) & valid[..., :, None] & tril
  return _Masks(pair, valid & (run == prev[..., None]), valid & (run == run[..., -1:]),
                run[..., -1] == prev, change | ~valid)


def run_ids(segment_ids, Tp):
  """Run ids [B, Tp] (a cumsum of id changes; tail padding is id 0) and valid [B, Tp]."""
  B = segment_ids.shape[0]
  seg = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, Tp - segment_ids.shape[1])))
  change = jnp.concatenate([jnp.ones((B, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  return jnp.cumsum(change, axis=1, dtype=jnp.int32), seg != 0


def _chunk_masks(runs, c, C, K) -> _Masks:
  """The masks of chunk c (traced) from the [B, Tp] run ids, repeated over the K kv heads."""
  run_all, valid_all = runs
  B = run_all.shape[0]
  run = lax.dynamic_slice_in_dim(run_all, c * C, C, axis=1)
  valid = lax.dynamic_slice_in_dim(valid_all, c * C, C, axis=1)
  prev = lax.dynamic_slice_in_dim(run_all, jnp.maximum(c * C - 1, 0), 1, axis=1)
  prev = jnp.where(c > 0, prev, -1)  # [B, 1]: the run of the position before the chunk
  change = jnp.concatenate([run[:, :1] != prev, run[:, 1:] != run[:, :-1]], axis=1)
  rep = lambda x: jnp.broadcast_to(x[:, None], (B, K) + x.shape[1:]).reshape(
      (B * K,) + x.shape[1:])
  run, valid, change, prev = rep(run), rep(valid), rep(change), rep(prev)
  tril = jnp.tril(jnp.ones((C, C), bool))
  pair = (run[:, :, None] == run[:, None, :]) & valid[:, :, None] & tril
  return _Masks(pair, valid & (run == prev), valid & (run == run[:, -1:]),
                run[:, -1] == prev[:, 0], change | ~valid)


def _chunk(q, k, v, g, m, C, A=None):
  """One chunk's shared pieces in float32: the levels, A (masked; or the forward's, given), e^P
  where the state is read, e^U where it is written, the state decay (0 where a run starts in
  the chunk)."""
  q, k, v, g = (x.astype(jnp.float32) for x in (q, k, v, g))
  levels, ep, eu = decay_levels(g, C)
  if A is None:
    A = intra_chunk_weights(q, k, levels, C)
    if m is not None:
      A = jnp.where(m.pair[:, :, None, :], A, 0.0)
  decay = ep[:, -1]
  if m is not None:
    ep = jnp.where(m.read[..., None], ep, 0.0)
    eu = jnp.where(m.write[..., None], eu, 0.0)
    decay = jnp.where(m.carry[:, None], decay, 0.0)
  return (q, k, v), levels, A, ep, eu, decay


def _heads_major(x, B, K):
  """[B, C, K, (G,) H] -> [B·K, C, (G,) H]: one chunk, a small in-cache transpose."""
  x = jnp.moveaxis(x, 2, 1)
  return x.reshape(B * K, *x.shape[2:])


def _time_major(x, B, K):
  """Inverse of _heads_major, to [B, C, K·(G), H]."""
  x = x.reshape(B, K, *x.shape[1:])
  x = jnp.moveaxis(x, 1, 2)
  return x.reshape(B, x.shape[1], -1, x.shape[-1])


def _slices(arrays, c, C, B, K, G):
  """Chunk c of the caller-layout [B, Tp, ., H] arrays (q, k, v, g[, dout]), heads-major."""
  sl = lambda x: lax.dynamic_slice_in_dim(x, c * C, C, axis=1)
  q = _heads_major(sl(arrays[0]).reshape(B, C, K, G, -1), B, K)
  rest = [_heads_major(sl(x), B, K) for x in arrays[1:4]]
  extra = [_heads_major(sl(x).reshape(B, C, K, G, -1), B, K) for x in arrays[4:]]
  return (q, *rest, *extra)


def _forward(q, k, v, g, runs, C, scale):
  """Scan over chunks reading the caller's layout; returns out [B, Tp, N, H] and the backward's
  per-chunk residuals: the input states S_in [n, B·K, H, H] and the masked intra-chunk weights
  A [n, B·K, C, G, C] (saving A, a quarter of S_in's size at C = 32, spares the backward the
  levels' dots and A's assembly: ~10% of forward+backward)."""
  B, Tp, N, H = q.shape
  K = k.shape[2]
  G, n = N // K, Tp // C

  def body(S, c):
    qc, kc, vc, gc = _slices((q, k, v, g), c, C, B, K, G)
    m = None if runs is None else _chunk_masks(runs, c, C, K)
    (qc, kc, vc), _, A, ep, eu, decay = _chunk(qc, kc, vc, gc, m, C)
    out = scale * (_mm("rigj,rjh->righ", A, vc) + _mm("rigd,rde->rige", qc * ep[:, :, None], S))
    S_next = decay[..., None] * S + _mm("rjd,rje->rde", kc * eu, vc)
    return S_next, (_time_major(out, B, K).astype(q.dtype), (S, A))

  _, (out, chunk_residuals) = lax.scan(body, jnp.zeros((B * K, H, H), jnp.float32),
                                       jnp.arange(n))
  return _unstack(out), chunk_residuals


def _unstack(x):
  """Scan outputs [n, B, C, ...] -> [B, n·C, ...] (free for B = 1)."""
  n, B, C = x.shape[:3]
  return jnp.moveaxis(x, 0, 1).reshape(B, n * C, *x.shape[3:])


def _backward(xs, runs, chunk_residuals, dout, C, scale):
  """Reverse scan over chunks carrying dS, the gradient of the state leaving the chunk, and
  the gradient buffers (caller layout). chunk_residuals: (S_in, A) from _forward, or (S_in,)
  (linear_pallas's forward), A then recomputed."""
  B, Tp, N, H = xs[0].shape
  K = xs[1].shape[2]
  G = N // K

  def body(carry, x):
    dS, dg_later = carry  # dg_later: Σ dG over later chunks in this chunk's last run
    c, S, *A = x
    q0, k0, v0, g0, do = _slices((*xs, dout), c, C, B, K, G)
    m = None if runs is None else _chunk_masks(runs, c, C, K)
    (q, k, v), levels, A, ep, eu, decay = _chunk(q0, k0, v0, g0, m, C, *A)
    qt, kt = q * ep[:, :, None], k * eu
    do = scale * do.astype(jnp.float32)
    dA = _mm("righ,rjh->rigj", do, v)
    dA = jnp.where(m.pair[:, :, None, :], dA, 0.0) if m is not None else (
        dA * jnp.tri(C, dtype=jnp.float32)[:, None])
    dv = _mm("rigj,righ->rjh", A, do) + _mm("rjd,rde->rje", kt, dS)
    dq = _mm("righ,rdh->rigd", do, S) * ep[:, :, None]
    dk = _mm("rjh,rdh->rjd", v, dS) * eu
    for h, qs, ks, fq, fk in _level_terms(q, k, levels, C):
      dX = _extract(dA, h, C)
      dqs = _mm("rbigj,rbjd->rbigd", dX, _blocks(ks, h)).reshape(qs.shape)
      dks = _mm("rbigj,rbigd->rbjd", dX, _blocks(qs, h)).reshape(ks.shape)
      dq = dq + _scatter_half(dqs * fq[:, :, None], h, 1, C)
      dk = dk + _scatter_half(dks * fk, h, 0, C)
    # out depends on g through q ⊙ e^G and k ⊙ e^-G only: dG = q ⊙ dq - k ⊙ dk; dg is its
    # in-run reverse cumulative sum, the later chunks' part being dg_later.
    # The diagonal (i = j) terms cancel exactly in dG, so they join dq, dk only after it: else
    # their rounding would swamp a true dg of ~0 (decay near 0).
    dG = jnp.sum(q * dq, axis=2) - k * dk
    diag = jnp.diagonal(dA, axis1=1, axis2=3).transpose(0, 2, 1)  # [R, C, G]
    dq = dq + diag[..., None] * k[:, :, None]
    dk = dk + jnp.einsum("rig,rigd->rid", diag, q)
    suffix = jnp.swapaxes(m.pair, 1, 2) if m is not None else jnp.tri(C, dtype=bool).T
    dg = jnp.einsum("rit,rtd->rid", jnp.broadcast_to(suffix, dG.shape[:1] + (C, C)).astype(
        jnp.float32), dG, precision=lax.Precision.HIGHEST)
    if m is not None:
      dg = dg + jnp.where(m.write[..., None], dg_later[:, None], 0.0)
      dg_earlier = jnp.where(m.read[:, :1], dg[:, 0], 0.0)  # position 0 continues a run
      dg = jnp.where(m.start[..., None], 0.0, dg)
    else:  # g at t = 0 multiplies the zero initial state.
      dg = dg + dg_later[:, None]
      dg_earlier = dg[:, 0]
      dg = jnp.where((c == 0) & (jnp.arange(C) == 0)[None, :, None], 0.0, dg)
    dS_prev = decay[..., None] * dS + _mm("rigd,rige->rde", qt, do)
    return (dS_prev, dg_earlier), tuple(_time_major(x, B, K).astype(x0.dtype)
                                        for x, x0 in zip((dq, dk, dv, dg), xs))

  zeros = (jnp.zeros((B * K, H, H), jnp.float32), jnp.zeros((B * K, H), jnp.float32))
  _, grads = lax.scan(body, zeros,
                      (jnp.arange(chunk_residuals[0].shape[0]), *chunk_residuals), reverse=True)
  return tuple(_unstack(x) for x in grads)


def _pad(x, Tp):
  T = x.shape[1]
  return x if T == Tp else jnp.pad(x, ((0, 0), (0, Tp - T)) + ((0, 0),) * (x.ndim - 2))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _gla(q, k, v, g, segment_ids, C):
  return _gla_fwd(q, k, v, g, segment_ids, C)[0]


def chunked_operands(q, k, v, g, segment_ids, C):
  """(q, k, v, g padded to whole chunks, run ids or None): with the per-chunk residuals, what
  gla_backward takes (linear_pallas's forward builds them this way too)."""
  Tp = -(-q.shape[1] // C) * C
  xs = tuple(_pad(x, Tp) for x in (q, k, v, g))
  return xs, None if segment_ids is None else run_ids(segment_ids, Tp)


def _gla_fwd(q, k, v, g, segment_ids, C):
  B, T, N, H = q.shape
  xs, runs = chunked_operands(q, k, v, g, segment_ids, C)
  out, chunk_residuals = _forward(*xs, runs, C, H**-0.5)
  return out[:, :T], (xs, runs, chunk_residuals)


def gla_backward(C, residuals, dout):
  """_gla's custom-VJP backward from residuals (padded operands, run ids, per-chunk residuals:
  (S_in, A) from this forward, or (S_in,) from linear_pallas's, A then recomputed)."""
  xs, runs, chunk_residuals = residuals
  B, T, N, H = dout.shape
  grads = _backward(xs, runs, chunk_residuals, _pad(dout, xs[0].shape[1]), C, H**-0.5)
  return (*(x[:, :T] for x in grads), None)


_gla.defvjp(_gla_fwd, gla_backward)


def linear_attention(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, *, segment_ids=None,
                     chunk: int | None = None):
  """Gated linear attention; arguments as kernels.linear_attention. `chunk` (a power of two)
  overrides the tuned chunk size (tests, benchmarks)."""
  C = chunk or CHUNK
  if C < 1 or C & (C - 1):
    raise ValueError(f"chunk={C}: expected a power of two")
  return _gla(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, segment_ids, C)
