"""The tile maths the GLA Triton kernels (linear_pallas_gpu.py) share, per chunk of C rows cut
into sub-chunks of SUB = 16 rows (Triton's smallest dot edge): decay factors, segment masks and
the intra-chunk weights. Every function runs inside a Pallas kernel on [SUB, H] tiles.

Stable intra-chunk decays. Every factor is e^{Σ g} over exactly the range it stands for, never
a ratio e^{P_i}e^{-P_j} (which overflows) nor a difference of prefixes P_i − P_j (which loses its
digits after one strong step): the sums are 0/1-matrix dots at HIGHEST precision (IEEE float32:
a direct sum of the selected terms, all <= 0). A pair j < i in sub-chunks J < I is split at I's
start:
  e^{Σ_{j<t<=i} g} = e^{pre_I(i)} · e^{suf_J(j)} · Π_{J<M<I} e^{tot_M},
pre the in-sub-chunk sum up to i, suf the one after j, tot a sub-chunk's sum; a pair inside one
sub-chunk is split by linear_xla's halving hierarchy (levels h = 1, 2, 4, 8, each a masked
16 x 16 dot). Every factor lies in [0, 1], so nothing overflows. The bound relied on: each
exponent is a sum of at most SUB same-signed terms, and a weight w = e^{-x} from an exponent
with relative error ~SUB·eps has relative error ~SUB·eps·x, so an absolute error at most
~SUB·eps·max_x(x e^{-x}) = SUB·eps/e (products of the factors add ~C/SUB·eps relative); a
product that underflows is a weight below ~1e-38, where the true one is too. log_decay is
clamped at -1e30 (same exp, 0) so that -inf makes no 0·inf NaN in the dots.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

try:  # Pallas APIs move between jax releases (linear_pallas_gpu.available() checks).
  from jax.experimental import pallas as pl
except ImportError:  # pragma: no cover - depends on the jax build
  pl = None

SUB = 16  # Sub-chunk rows: Triton's smallest dot edge.
NN = (((1,), (0,)), ((), ()))
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b


def dot(a, b, dims=NN, precision=None):
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32, precision=precision)


def _rows_cols():
  """int32 row and column indices of a [SUB, SUB] tile, [SUB, 1] and [1, SUB]."""
  i = jnp.arange(SUB, dtype=jnp.int32)
  return i[:, None], i[None, :]


def eye():
  i, j = _rows_cols()
  return jnp.where(i == j, 1.0, 0.0)


def _ranges(h):
  """0/1 [SUB, SUB] matrices (rows i, columns t) of t in [start of i's h-block, i] and of t in
  (i, end of i's h-block]: dotted with g, the direct range sums pre_h and suf_h."""
  i, t = _rows_cols()
  same = lax.div(i, jnp.int32(h)) == lax.div(t, jnp.int32(h))  # lax.div: Triton lowers it as is
  return jnp.where(same & (t <= i), 1.0, 0.0), jnp.where(same & (t > i), 1.0, 0.0)


def _level_mask(h):
  """[SUB, SUB] pairs of level h: i in the second half, j in the first, of one 2h-block."""
  i, j = _rows_cols()
  two = jnp.int32(2 * h)
  return ((lax.div(i, two) == lax.div(j, two)) & (lax.rem(i, two) >= h)
          & (lax.rem(j, two) < h))


class Sub(NamedTuple):
  """One sub-chunk's decay factors ([SUB, H] unless noted), all in [0, 1]."""
  pre: jax.Array     # e^{Σ g from the sub-chunk's start to i}
  suf: jax.Array     # e^{Σ g after j to the sub-chunk's end}
  tot: jax.Array     # [H] e^{Σ g over the sub-chunk}
  levels: tuple      # ((e^pre_h, e^suf_h, level mask) for h = 1, 2, 4, 8 < SUB)


def _sub_factors(g, levels):
  """Sub for one [SUB, H] tile of log decays (levels: the diagonal block's too)."""
  g = jnp.maximum(g.astype(jnp.float32), -1e30)  # -inf: 0·-inf in the dots would be NaN
  exact = lax.Precision.HIGHEST
  sums = lambda h: [jnp.exp(dot(m, g, precision=exact)) for m in _ranges(h)]
  levels = tuple((*sums(h), _level_mask(h)) for h in (1, 2, 4, 8)) if levels else ()
  pre, suf = sums(SUB)
  return Sub(pre, suf, jnp.exp(jnp.sum(g, axis=0)), levels)


class Chunk(NamedTuple):
  """A chunk's factors, per sub-chunk: e^P (chunk start to i), e^U (after j to chunk end), the
  off-diagonal k factors fk[I][J] (J < I), the state decay [H], and the sub-chunks' Sub."""
  ep: list
  eu: list
  fk: list
  decay: jax.Array
  subs: list


def chunk_factors(g_ref, start, n_sub, levels=True):
  """The factors of the chunk at `start` (levels: those of the diagonal sub-blocks too)."""
  subs = [_sub_factors(g_ref[pl.ds(start + I * SUB, SUB), :], levels) for I in range(n_sub)]
  prod = lambda Ms: functools.reduce(lambda a, M: a * subs[M].tot, Ms, jnp.ones_like(subs[0].tot))
  ep = [subs[I].pre * prod(range(I))[None, :] for I in range(n_sub)]
  eu = [subs[J].suf * prod(range(J + 1, n_sub))[None, :] for J in range(n_sub)]
  fk = [[subs[J].suf * prod(range(J + 1, I))[None, :] for J in range(I)] for I in range(n_sub)]
  return Chunk(ep, eu, fk, prod(range(n_sub)), subs)


class Flags(NamedTuple):
  """One sub-chunk's segment flags: run ids [SUB] and valid / read / write as [SUB, 1] 0/1."""
  run: jax.Array
  valid: jax.Array
  read: jax.Array
  write: jax.Array


def flags(refs, I):
  """Sub-chunk I's Flags from the chunk's (run, valid, read, write) refs."""
  run_ref, valid_ref, read_ref, write_ref = refs
  sl = pl.ds(I * SUB, SUB)
  return Flags(run_ref[sl], valid_ref[sl][:, None], read_ref[sl][:, None],
               write_ref[sl][:, None])


def _pair(fi, fj, diagonal):
  """[SUB, SUB] 0/1: j <= i in one run, i not padding (linear_xla's pair mask)."""
  m = (fi.run[:, None] == fj.run[None, :]) & (fi.valid > 0)
  if diagonal:
    i, j = _rows_cols()
    m &= j <= i
  return jnp.where(m, 1.0, 0.0)


def intra(q, k, ch, pair, precision):
  """A[I][J] (J <= I), masked by pair: the intra-chunk weights of one query head."""
  A = []
  for I in range(len(q)):
    qs = q[I] * ch.subs[I].pre
    row = [dot(qs, k[J] * ch.fk[I][J], NT, precision) for J in range(I)]
    diag = dot(q[I], k[I], NT, precision) * eye()
    for fq, fk, mask in ch.subs[I].levels:
      diag += jnp.where(mask, dot(q[I] * fq, k[I] * fk, NT, precision), 0.0)
    A.append([a * pair[I][J] for J, a in enumerate(row + [diag])])
  return A


def pairs(fl):
  """pair[I][J] (J <= I) from the sub-chunks' Flags."""
  return [[_pair(fl[I], fl[J], I == J) for J in range(I + 1)] for I in range(len(fl))]


def load(ref, start, n_sub, *index):
  """The n_sub float32 [SUB, ...] tiles of ref[start:start + n_sub·SUB, *index]."""
  return [ref[(pl.ds(start + I * SUB, SUB), *index)].astype(jnp.float32) for I in range(n_sub)]
