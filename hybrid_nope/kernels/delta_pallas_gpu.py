"""The gated delta rule for GPUs in Pallas (Triton lowering): the chunked form's two sequential
passes as kernels, the rest of the gradient by XLA autodiff.

Math, layout and segment handling are delta_xla's (its docstring; chunk terms as in its
`_chunk_terms`): the inputs are normalised and the segments folded into the gates in XLA
(elementwise), then per (batch row, kv head, block of value columns) one program walks the chunks
in order with the [Hk, block] slice of the state in registers. The state's value columns never
mix (U = (I + β KK)⁻¹ β (V − (Γ ⊙ K) h) and h' = diag(Γ_C) h + (exp(suffix) ⊙ K)ᵀ U act on each
column alone), so blocks of BLOCK_V columns are independent programs, as in fla's chunk_delta_h.
Each program recomputes its chunk's state-independent terms (decayed q·kᵀ and k·kᵀ, the
unit-lower-triangular inverse by forward substitution): redundant across value blocks, but
nothing chunk-sized goes through memory.

  forward   `delta_chunk_fwd`: the output and the state entering each chunk (kept for the backward,
            as delta_xla keeps them: [Hk, Hv] per chunk and kv head).
  backward  `delta_chunk_dstate`: the reverse pass, the cotangent of the state leaving each chunk,
            dh = diag(Γ_C) dh' + Σ_g (Γ ⊙ Q_g)ᵀ dO_g − Wᵀ dU with dU = Σ_g QK_gᵀ dO_g + K_w dh'.
            With every chunk's entering state and leaving cotangent known, the chunks are
            independent: XLA autodiff of delta_xla.chunk_rows over all chunks at once gives
            dq, dk, dv, dlog_decay and dβ. That part is XLA, not Pallas (an interim: a
            hand-written Pallas kernel for the per-chunk gradient, fla's chunk_bwd_dqkwg and
            prepare_wy_repr_bwd, would replace it).

Decay factors inside a chunk are exponentials of direct sums of log gates, never differences of
prefixes (a reset floors a gate at LOG_ZERO = −1e30, which a difference would cancel): sums are
dots with 0/1 matrices at IEEE float32 precision. One gate per head: the pairwise sums
Σ_{j<s<=i} g_s as one [C, C] dot. One per key channel: delta_xla's (linear_xla's) halving
hierarchy, each level's pairs (i in the upper half of a 2s-block, j in its lower half) a dot of
q_i exp(Σ_{b<s<=i} g_s) and k_j exp(Σ_{j<s<=b} g_s), both factors <= 1, b the halves' boundary.

Every dot is float32 at Precision.HIGHEST (IEEE; Triton's default for float32 is TF32, whose
10-bit mantissa the triangular solve amplifies). Unmeasured on a GPU: this was written and
checked in interpret mode on a CPU, and lowered for cuda with jax.export; block sizes and the
precision are untuned.

`interpret=True` runs the same kernels through the Pallas interpreter on any backend; that is
how the CPU tests check them.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_nope.kernels import delta_xla
from hybrid_nope.kernels.pallas_gpu import available, pl, plgpu

CHUNK = 32  # tokens per chunk (a power of two >= 16: Triton's smallest dot)
BLOCK_V = 64  # value columns per program: the state slice [Hk, BLOCK_V] stays in registers
NUM_WARPS = 4

_SQUEEZED = getattr(pl, "squeezed", None)
_NN = (((1,), (0,)), ((), ()))  # a @ b
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b
_F32 = jnp.float32

__all__ = ["available", "delta_attention"]


def _dot(a, b, dims=_NN):
  return lax.dot_general(a, b, dims, precision=(lax.Precision.HIGHEST,) * 2,
                         preferred_element_type=_F32)


def _grid(C):
  """(row index i [C, 1], column index j [1, C]) int32."""
  return jnp.arange(C, dtype=jnp.int32)[:, None], jnp.arange(C, dtype=jnp.int32)[None, :]


def _ones_where(mask):
  return jnp.where(mask, 1.0, 0.0).astype(_F32)


def _scalar_gate_terms(qs, k, g, C):
  """One gate per head, g [C]: (qk per query head, kk, Γ [C, 1], exp(suffix) [C, 1], Γ_C)."""
  i, j = _grid(C)
  upto = jnp.where(j <= i, g[None, :], 0.0)  # [i, s]: g_s for s <= i
  pairwise = _dot(upto, _ones_where(i > j))  # Σ_{j<s<=i} g_s (0 for j >= i)
  decay = jnp.where(j <= i, jnp.exp(pairwise), 0.0)
  prefix = jnp.sum(upto, axis=1)
  suffix = jnp.sum(jnp.where(i > j, g[:, None], 0.0), axis=0)  # Σ_{s>j} g_s, s the row
  qk = [_dot(q, k, _NT) * decay for q in qs]
  kk = _dot(k, k, _NT) * jnp.where(j < i, decay, 0.0)
  return qk, kk, jnp.exp(prefix)[:, None], jnp.exp(suffix)[:, None], jnp.exp(jnp.sum(g))


def _channel_gate_terms(qs, k, g, C):
  """One gate per key channel, g [C, Hk]: as _scalar_gate_terms, Γ and exp(suffix) [C, Hk],
  Γ_C [Hk, 1]."""
  i, j = _grid(C)
  # q·k on the diagonal (no decay); k·k has none (strictly lower).
  rows = [jnp.where(i == j, _dot(q, k, _NT), 0.0) for q in qs] + [jnp.zeros((C, C), _F32)]
  s = 1
  while s < C:
    block_i, block_j = lax.div(i, jnp.int32(s)), lax.div(j, jnp.int32(s))
    same = block_i == block_j
    into = _dot(_ones_where(same & (j <= i)), g)  # Σ g over i's s-block up to i
    after = _dot(_ones_where(same & (j > i)), g)  # Σ g over the rest of i's s-block
    k_lower = k * jnp.exp(after)
    pair = (block_i == block_j + 1) & (lax.rem(block_i, jnp.int32(2)) == 1)
    upper = jnp.exp(into)
    rows[:-1] = [a + jnp.where(pair, _dot(q * upper, k_lower, _NT), 0.0)
                 for a, q in zip(rows[:-1], qs)]
    rows[-1] = rows[-1] + jnp.where(pair, _dot(k * upper, k_lower, _NT), 0.0)
    s *= 2
  prefix = _dot(_ones_where(j <= i), g)
  suffix = _dot(_ones_where(j > i), g)
  total = jnp.sum(g, axis=0)
  return rows[:-1], rows[-1], jnp.exp(prefix), jnp.exp(suffix), jnp.exp(total)[:, None]


def _unit_lower_inverse(a, C):
  """(I + a)⁻¹ for strictly lower triangular a [C, C], by forward substitution: row i of the
  inverse is e_i − Σ_{j<i} a_ij (row j), one row per step (rows as masked reductions: Triton
  values have no dynamic indexing)."""
  i, j = _grid(C)
  eye = _ones_where(i == j)

  def row(r, inverse):
    a_r = jnp.sum(jnp.where(i == r, a, 0.0), axis=0)  # row r of a, as a vector over j
    new = eye - jnp.sum(a_r[:, None] * inverse, axis=0)[None, :]
    return jnp.where(i == r, new, inverse)

  return lax.fori_loop(1, C, row, eye)


def _chunk_terms(q_ref, k_ref, g_ref, beta_ref, t, *, C, G, per_channel):
  """A chunk's state-independent terms from the refs at rows t: (qk per query head, Γ ⊙ q per
  query head, Γ ⊙ k, solve = (I + β KK)⁻¹ β, exp(suffix) ⊙ k, Γ_C) as delta_xla._chunk_terms
  (W = solve (Γ ⊙ k), Ũ = solve V)."""
  k = k_ref[t, :].astype(_F32)
  qs = [q_ref[t, h, :].astype(_F32) for h in range(G)]
  g = g_ref[t, :] if per_channel else g_ref[t]
  beta = beta_ref[t].astype(_F32)
  terms = _channel_gate_terms if per_channel else _scalar_gate_terms
  qk, kk, gamma, after, decay = terms(qs, k, g.astype(_F32), C)
  solve = _unit_lower_inverse(beta[:, None] * kk, C) * beta[None, :]
  return qk, [gamma * q for q in qs], gamma * k, solve, after * k, decay


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, out_ref, states_ref, *, C, G, n,
                    per_channel):
  def chunk(c, h):
    t = pl.ds(pl.multiple_of(c * C, C), C)
    qk, q_state, k_state, solve, k_write, decay = _chunk_terms(
        q_ref, k_ref, g_ref, beta_ref, t, C=C, G=G, per_channel=per_channel)
    states_ref[c] = h
    u = _dot(solve, v_ref[t, :].astype(_F32) - _dot(k_state, h))  # Ũ − W h in two dots
    for head in range(G):
      out_ref[t, head, :] = (_dot(q_state[head], h) + _dot(qk[head], u)).astype(out_ref.dtype)
    return decay * h + _dot(k_write, u, _TN)

  lax.fori_loop(0, n, chunk, jnp.zeros(states_ref.shape[1:], _F32))


def _dstate_kernel(q_ref, k_ref, g_ref, beta_ref, dout_ref, dstates_ref, *, C, G, n,
                   per_channel):
  def chunk(r, dh):  # dh: the cotangent of the state leaving chunk c
    c = n - 1 - r
    t = pl.ds(pl.multiple_of(c * C, C), C)
    qk, q_state, k_state, solve, k_write, decay = _chunk_terms(
        q_ref, k_ref, g_ref, beta_ref, t, C=C, G=G, per_channel=per_channel)
    dstates_ref[c] = dh
    du = _dot(k_write, dh)
    dh = decay * dh
    for head in range(G):
      dout = dout_ref[t, head, :].astype(_F32)
      du = du + _dot(qk[head], dout, _TN)
      dh = dh + _dot(q_state[head], dout, _TN)
    return dh - _dot(k_state, _dot(solve, du, _TN), _TN)  # − Wᵀ dU

  lax.fori_loop(0, n, chunk, jnp.zeros(dstates_ref.shape[1:], _F32))


def _specs(T, G, Hp, BJ, n, per_channel):
  """BlockSpecs over the grid (batch, kv head, value block) of q, k, v, g, beta, the q-shaped
  output (and dout) and the [B, K, chunks, Hk, Hv] states: a program sees its rows whole and
  loads one chunk at a time."""
  seq = lambda cols, col: pl.BlockSpec((_SQUEEZED, T, _SQUEEZED, cols),
                                       lambda b, h, j: (b, 0, h, col(j)))
  group = lambda cols, col: pl.BlockSpec((_SQUEEZED, T, G, cols),
                                         lambda b, h, j: (b, 0, h, col(j)))
  per_row = pl.BlockSpec((_SQUEEZED, T, _SQUEEZED), lambda b, h, j: (b, 0, h))
  whole, block = (lambda j: 0), (lambda j: j)
  return dict(q=group(Hp, whole), k=seq(Hp, whole), v=seq(BJ, block),
              g=seq(Hp, whole) if per_channel else per_row, beta=per_row,
              out=group(BJ, block),
              states=pl.BlockSpec((_SQUEEZED, _SQUEEZED, n, Hp, BJ),
                                  lambda b, h, j: (b, h, 0, 0, j)))


def _call(kernel, name, grid, in_specs, out_specs, out_shape, interpret):
  params = None
  if not interpret and plgpu is not None:
    params = plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1)
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, compiler_params=params, interpret=interpret,
                        name=name)


def _padded(x, T, cols):
  """x [B, T', heads, c] zero-padded to T rows and `cols` columns."""
  return jnp.pad(x, ((0, 0), (0, T - x.shape[1]), (0, 0), (0, cols - x.shape[3])))


def _pass(kernel, name, q, k, v, g, beta, C, interpret, *, dout=None):
  """One of the two kernels over the grid (batch, kv head, value block) on the prepared operands
  (`_chunked`), head dims zero-padded to powers of two >= 16 (Triton's tiles; zero columns
  change no dot): the forward (out [B, T, N, Jp], states [B, K, n, Hp, Jp]) or, given dout, the
  reverse pass (the states' cotangents [B, K, n, Hp, Jp])."""
  (B, T, N, H), (K, J) = q.shape, v.shape[2:]
  Hp, Jp = (max(16, pl.next_power_of_2(d)) for d in (H, J))
  BJ, n, per_channel = min(BLOCK_V, Jp), T // C, g.ndim == 4
  specs = _specs(T, N // K, Hp, BJ, n, per_channel)
  states = jax.ShapeDtypeStruct((B, K, n, Hp, Jp), _F32)
  qp, kp, gp = _padded(q, T, Hp), _padded(k, T, Hp), _padded(g, T, Hp) if per_channel else g
  if dout is None:
    roles, args = ("q", "k", "v", "g", "beta"), (qp, kp, _padded(v, T, Jp), gp, beta)
    outs = [specs["out"], specs["states"]]
    out_shape = [jax.ShapeDtypeStruct((B, T, N, Jp), _F32), states]
  else:
    roles, args = ("q", "k", "g", "beta", "out"), (qp, kp, gp, beta, _padded(dout, T, Jp))
    outs, out_shape = specs["states"], states
  kernel = functools.partial(kernel, C=C, G=N // K, n=n, per_channel=per_channel)
  return _call(kernel, name, (B, K, Jp // BJ), [specs[r] for r in roles], outs, out_shape,
               interpret)(*args)


def _rows(x, B, K, n, C):
  """[B, T, K, (G,) X] -> [B·K·n, (G,) C, X]: delta_xla.chunk_rows's rows, every chunk one."""
  x = x.reshape(B, n, C, K, *x.shape[3:])
  x = jnp.moveaxis(x, 3, 1)  # [B, K, n, C, (G,) X]
  x = x.reshape(B * K * n, *x.shape[3:])
  return jnp.moveaxis(x, 1, -2) if x.ndim == 4 else x


def _unrows(x, B, K, n, C):
  """The inverse of _rows for [R, G, C, X] (q-shaped) or [R, C, X]."""
  if x.ndim == 4:
    x = jnp.moveaxis(x, -2, 1)  # [R, C, G, X]
  x = jnp.moveaxis(x.reshape(B, K, n, *x.shape[1:]), 1, 3)  # [B, n, C, K, (G,) X]
  x = x.reshape(B, n * C, *x.shape[3:])
  return x.reshape(*x.shape[:2], -1, x.shape[-1]) if x.ndim == 5 else x


# The prepared operands (`delta_attention`): q [B, T, N, H], k [B, T, K, H] unit or zero,
# v [B, T, K, J], g [B, T, K, X] floored at LOG_ZERO, beta [B, T, K], float32, T a multiple of C.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _chunked(q, k, v, g, beta, C, interpret):
  return _pass(_forward_kernel, "delta_chunk_fwd", q, k, v, g, beta, C, interpret)[0][
      ..., :v.shape[-1]]


def _chunked_fwd(q, k, v, g, beta, C, interpret):
  out, states = _pass(_forward_kernel, "delta_chunk_fwd", q, k, v, g, beta, C, interpret)
  return out[..., :v.shape[-1]], (q, k, v, g, beta, states)


def _chunked_bwd(C, interpret, residuals, dout):
  q, k, v, g, beta, states = residuals
  (B, T, N, H), (K, J) = q.shape, v.shape[2:]
  n = T // C
  dstates = _pass(_dstate_kernel, "delta_chunk_dstate", q, k, v, g, beta, C, interpret,
                  dout=dout)
  # Every chunk's entering state and leaving cotangent known, the chunks' gradients are
  # independent: one autodiff of delta_xla's chunk over all of them.
  rows = lambda x: _rows(x, B, K, n, C)
  grouped = lambda x: x.reshape(B, T, K, N // K, x.shape[-1])
  state_rows = lambda s: s[..., :H, :J].reshape(B * K * n, H, J)
  g4 = g if g.ndim == 4 else g[..., None]
  operands = [rows(grouped(q)), rows(k), rows(v), rows(g4), rows(beta[..., None])[..., 0]]
  step = lambda *xs: delta_xla.chunk_rows(xs[-1], *xs[:-1], C)
  _, vjp = jax.vjp(step, *operands, state_rows(states))
  dq, dk, dv, dg, dbeta, _ = vjp((state_rows(dstates), rows(grouped(dout))))
  dq, dk, dv, dg, dbeta = (_unrows(x, B, K, n, C) for x in (dq, dk, dv, dg, dbeta[..., None]))
  return dq, dk, dv, dg.reshape(g.shape), dbeta[..., 0]


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def delta_attention(q_BTNH, k_BTKH, v_BTKJ, g_BTKX, beta_BTK1, *, segment_ids=None,
                    chunk: int | None = None, interpret: bool = False):
  """The gated delta rule; arguments as delta_xla.delta_attention (GQA layout: v [B, T, K,
  Hv], g [B, T, K, Hk or 1], beta [B, T, K, 1]); returns [B, T, N, Hv] in q's dtype. `chunk`
  (a power of two >= 16) overrides CHUNK."""
  if pl is None or (not interpret and plgpu is None):
    raise ValueError("impl='pallas' for the delta rule needs jax.experimental.pallas (and its "
                     "triton module), which this jax build lacks")
  C = chunk or CHUNK
  if C < 16 or C & (C - 1):
    raise ValueError(f"chunk={C}: expected a power of two >= 16 (Triton's smallest dot)")
  B, T = q_BTNH.shape[:2]
  q, k = delta_xla.l2norm(q_BTNH), delta_xla.l2norm(k_BTKH)
  v, g, beta = (x.astype(_F32) for x in (v_BTKJ, g_BTKX, beta_BTK1))
  if segment_ids is not None:
    runs = (x[:, :, None, None] for x in delta_xla._runs(segment_ids))
    q, k, v, g, beta = delta_xla._gate(q, k, v, g, beta, *runs)
  g = jnp.maximum(g, delta_xla.LOG_ZERO)
  if g.shape[-1] == 1:
    g = g[..., 0]
  # The tail pads to whole chunks with zeros, which neither read nor write (β = k = 0).
  Tp = -(-T // C) * C
  pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T)) + ((0, 0),) * (x.ndim - 2))
  out = _chunked(*(pad(x) for x in (q, k, v, g, beta[..., 0])), C, interpret)
  return out[:, :T].astype(q_BTNH.dtype)
