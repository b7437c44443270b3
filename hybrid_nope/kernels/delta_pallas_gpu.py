"""The gated delta rule for GPUs in Pallas (Triton lowering): chunked forward and backward,
three kernels under a custom VJP.

Math, layout and segment handling are delta_xla's (its docstring; chunk terms as in its
`_chunk_terms`); the chunk arithmetic itself, forward terms and hand-written gradient, is
delta_pallas_chunk's. The inputs are normalised and the segments folded into the gates in XLA
(elementwise, differentiated by autodiff), then:

  `delta_chunk_fwd`     per (batch row, kv head, block of value columns) one program walks the
                        chunks in order with the [Hk, block] slice of the state in registers,
                        writing the output and the state entering each chunk (kept for the
                        backward, as delta_xla keeps them: [Hk, Hv] per chunk and kv head).
  `delta_chunk_dstate`  the same walk in reverse: the cotangent of the state leaving each chunk,
                        dh = diag(Γ_C) dh' + Σ_g (Γ ⊙ Q_g)ᵀ dO_g − Wᵀ dU with
                        dU = Σ_g QK_gᵀ dO_g + (exp(suffix) ⊙ K) dh'.
  `delta_chunk_grads`   with every chunk's entering state and leaving cotangent known the chunks
                        are independent: one program per (batch row, kv head, chunk) gives its
                        dq, dk, dv, dlog_decay and dβ (delta_pallas_chunk.chunk_grads).

The state's value columns never mix (U = (I + β KK)⁻¹ β (V − (Γ ⊙ K) h) and
h' = diag(Γ_C) h + (exp(suffix) ⊙ K)ᵀ U act on each column alone), so the two walks run blocks
of BLOCK_V columns as independent programs, as fla's chunk_delta_h does; each program recomputes
its chunk's state-independent terms (redundant across value blocks, but nothing chunk-sized goes
through memory). The gradient kernel loops over the value blocks itself, summing their shares.

Unmeasured on a GPU: written and checked in interpret mode on a CPU, and lowered for cuda with
jax.export; block sizes, warps and the dots' precision (IEEE float32) are untuned.
`interpret=True` runs the same kernels through the Pallas interpreter on any backend; that is how
the CPU tests check them.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_nope.kernels import delta_xla
from hybrid_nope.kernels.delta_pallas_chunk import NT, TN, chunk_grads, chunk_terms, dot
from hybrid_nope.kernels.pallas_gpu import available, pl, plgpu

CHUNK = 32  # tokens per chunk (a power of two >= 16: Triton's smallest dot)
BLOCK_V = 64  # value columns per program of the walks: the state slice [Hk, BLOCK_V]
NUM_WARPS = 4

_SQUEEZED = getattr(pl, "squeezed", None)
_F32 = jnp.float32

__all__ = ["available", "delta_attention"]


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, out_ref, states_ref, *, C, G, n,
                    per_channel):
  def chunk(c, h):
    t = pl.ds(pl.multiple_of(c * C, C), C)
    terms, _ = chunk_terms(q_ref, k_ref, g_ref, beta_ref, t, C=C, G=G, per_channel=per_channel)
    states_ref[c] = h
    # Ũ − W h in two dots: solve (V − (Γ ⊙ K) h).
    u = dot(terms.solve, v_ref[t, :].astype(_F32) - dot(terms.gamma * terms.k, h))
    for head, q in enumerate(terms.qs):
      out = dot(terms.gamma * q, h) + dot(terms.qk[head], u)
      out_ref[t, head, :] = out.astype(out_ref.dtype)
    return terms.decay * h + dot(terms.after * terms.k, u, TN)

  lax.fori_loop(0, n, chunk, jnp.zeros(states_ref.shape[1:], _F32))


def _dstate_kernel(q_ref, k_ref, g_ref, beta_ref, dout_ref, dstates_ref, *, C, G, n,
                   per_channel):
  def chunk(r, dh):  # dh: the cotangent of the state leaving chunk c
    c = n - 1 - r
    t = pl.ds(pl.multiple_of(c * C, C), C)
    terms, _ = chunk_terms(q_ref, k_ref, g_ref, beta_ref, t, C=C, G=G, per_channel=per_channel)
    dstates_ref[c] = dh
    du = dot(terms.after * terms.k, dh)
    dh = terms.decay * dh
    for head, q in enumerate(terms.qs):
      dout = dout_ref[t, head, :].astype(_F32)
      du = du + dot(terms.qk[head], dout, TN)
      dh = dh + dot(terms.gamma * q, dout, TN)
    return dh - dot(terms.gamma * terms.k, dot(terms.solve, du, TN), TN)  # − Wᵀ dU

  lax.fori_loop(0, n, chunk, jnp.zeros(dstates_ref.shape[1:], _F32))


def _grads_kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, dout_ref, state_ref, dstate_ref,
                  dq_ref, dk_ref, dv_ref, dg_ref, dbeta_ref, *, C, G, BJ, per_channel):
  """One chunk's gradients from its entering state h and the cotangent dh' of its leaving one:
  the forward's dots transposed, per block of value columns, their shares summed."""
  t = pl.ds(0, C)
  terms, g = chunk_terms(q_ref, k_ref, g_ref, beta_ref, t, C=C, G=G, per_channel=per_channel)
  solve, k_state, k_write = terms.solve, terms.gamma * terms.k, terms.after * terms.k
  zeros = lambda shape: jnp.zeros(shape, _F32)
  d_qk, d_q_state = [zeros((C, C))] * G, [zeros(terms.k.shape)] * G
  d_k_state, d_k_write, d_solve = zeros(terms.k.shape), zeros(terms.k.shape), zeros((C, C))
  h_dh = zeros((terms.k.shape[1], 1))
  for block in range(v_ref.shape[-1] // BJ):
    cols = pl.ds(block * BJ, BJ)
    h, dh = state_ref[:, cols], dstate_ref[:, cols]
    x = v_ref[t, cols].astype(_F32) - dot(k_state, h)
    u = dot(solve, x)
    du = dot(k_write, dh)
    for head in range(G):
      dout = dout_ref[t, head, cols].astype(_F32)
      du = du + dot(terms.qk[head], dout, TN)
      d_qk[head] = d_qk[head] + dot(dout, u, NT)
      d_q_state[head] = d_q_state[head] + dot(dout, h, NT)
    d_k_write = d_k_write + dot(u, dh, NT)
    h_dh = h_dh + jnp.sum(h * dh, axis=1, keepdims=True)
    d_solve = d_solve + dot(du, x, NT)
    dx = dot(solve, du, TN)
    dv_ref[t, cols] = dx.astype(dv_ref.dtype)
    d_k_state = d_k_state - dot(dx, h, NT)
  dq, dk, dg, dbeta = chunk_grads(terms, g, C, d_qk=d_qk, d_q_state=d_q_state,
                                  d_k_state=d_k_state, d_k_write=d_k_write, d_solve=d_solve,
                                  h_dh=h_dh)
  for head in range(G):
    dq_ref[t, head, :] = dq[head].astype(dq_ref.dtype)
  dk_ref[t, :] = dk.astype(dk_ref.dtype)
  if per_channel:
    dg_ref[t, :] = dg.astype(dg_ref.dtype)
  else:
    dg_ref[t] = dg.astype(dg_ref.dtype)
  dbeta_ref[t] = dbeta.astype(dbeta_ref.dtype)


def _specs(rows, G, Hp, Jp, BJ, n, per_channel, *, walk: bool):
  """BlockSpecs of q, k, v, g, beta, the q-shaped output (and dout) and the [B, K, chunks, Hk,
  Hv] states. walk: over the grid (batch, kv head, value block), each program seeing its rows
  whole (rows = T) and n chunks of states; else over (batch, kv head, chunk), each program one
  chunk (rows = C) and its state."""
  if walk:
    cols, at = BJ, (lambda b, h, j: (b, 0, h, j))
    state_index = lambda b, h, j: (b, h, 0, 0, j)
    state_block = (_SQUEEZED, _SQUEEZED, n, Hp, BJ)
  else:
    cols, at = Jp, (lambda b, h, c: (b, c, h, 0))
    state_index = lambda b, h, c: (b, h, c, 0, 0)
    state_block = (_SQUEEZED, _SQUEEZED, _SQUEEZED, Hp, Jp)
  whole_cols = lambda *idx: at(*idx)[:3] + (0,)
  per_row = pl.BlockSpec((_SQUEEZED, rows, _SQUEEZED), lambda *idx: at(*idx)[:3])
  keys = pl.BlockSpec((_SQUEEZED, rows, _SQUEEZED, Hp), whole_cols)
  return dict(q=pl.BlockSpec((_SQUEEZED, rows, G, Hp), whole_cols), k=keys,
              v=pl.BlockSpec((_SQUEEZED, rows, _SQUEEZED, cols), at),
              g=keys if per_channel else per_row, beta=per_row,
              out=pl.BlockSpec((_SQUEEZED, rows, G, cols), at),
              states=pl.BlockSpec(state_block, state_index))


def _padded(x, cols):
  """x [B, T, heads, c] zero-padded to `cols` columns (zero columns change no dot)."""
  return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, cols - x.shape[3])))


def _kernels(q, k, v, g, beta, C, interpret):
  """(forward, dstate, grads): the three pallas_calls on prepared operands (`_chunked`), head
  dims zero-padded to powers of two >= 16 (Triton's tiles)."""
  (B, T, N, H), (K, J) = q.shape, v.shape[2:]
  Hp, Jp = (max(16, pl.next_power_of_2(d)) for d in (H, J))
  G, BJ, n, per_channel = N // K, min(BLOCK_V, Jp), T // C, g.ndim == 4
  walk = _specs(T, G, Hp, Jp, BJ, n, per_channel, walk=True)
  each = _specs(C, G, Hp, Jp, BJ, n, per_channel, walk=False)
  params = None
  if not interpret and plgpu is not None:
    params = plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1)
  call = lambda kernel, name, grid, specs, ins, outs, shapes: pl.pallas_call(
      functools.partial(kernel, C=C, G=G, per_channel=per_channel), grid=grid,
      in_specs=[specs[x] for x in ins], out_specs=[specs[x] for x in outs], out_shape=shapes,
      compiler_params=params, interpret=interpret, name=name)
  shape = lambda *dims: jax.ShapeDtypeStruct(dims, _F32)
  states = shape(B, K, n, Hp, Jp)
  operands = dict(q=_padded(q, Hp), k=_padded(k, Hp), v=_padded(v, Jp),
                  g=_padded(g, Hp) if per_channel else g, beta=beta)
  pick = lambda *names: [operands[x] for x in names]
  walk_grid, each_grid = (B, K, Jp // BJ), (B, K, n)

  def forward():
    out, states_ = call(functools.partial(_forward_kernel, n=n), "delta_chunk_fwd", walk_grid,
                        walk, ("q", "k", "v", "g", "beta"),
                        ("out", "states"), [shape(B, T, N, Jp), states])(
                            *pick("q", "k", "v", "g", "beta"))
    return out[..., :J], states_

  def dstate(dout):
    return call(functools.partial(_dstate_kernel, n=n), "delta_chunk_dstate", walk_grid, walk,
                ("q", "k", "g", "beta", "out"), ("states",), [states])(
                    *pick("q", "k", "g", "beta"), _padded(dout, Jp))[0]

  def grads(dout, states_, dstates):
    shapes = [shape(*x.shape) for x in pick("q", "k", "v", "g", "beta")]
    dq, dk, dv, dg, dbeta = call(
        functools.partial(_grads_kernel, BJ=BJ), "delta_chunk_grads", each_grid, each,
        ("q", "k", "v", "g", "beta", "out", "states", "states"),
        ("q", "k", "v", "g", "beta"), shapes)(*pick("q", "k", "v", "g", "beta"),
                                              _padded(dout, Jp), states_, dstates)
    return dq[..., :H], dk[..., :H], dv[..., :J], dg[..., :H] if per_channel else dg, dbeta

  return forward, dstate, grads


# The prepared operands (`delta_attention`): q [B, T, N, H], k [B, T, K, H] unit or zero,
# v [B, T, K, J], g [B, T, K(, H)] floored at LOG_ZERO, beta [B, T, K], float32, T a multiple of C.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _chunked(q, k, v, g, beta, C, interpret):
  return _kernels(q, k, v, g, beta, C, interpret)[0]()[0]


def _chunked_fwd(q, k, v, g, beta, C, interpret):
  out, states = _kernels(q, k, v, g, beta, C, interpret)[0]()
  return out, (q, k, v, g, beta, states)


def _chunked_bwd(C, interpret, residuals, dout):
  *operands, states = residuals
  _, dstate, grads = _kernels(*operands, C, interpret)
  return grads(dout, states, dstate(dout))


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
    runs = (x[:, :, None, None] for x in delta_xla.run_starts(segment_ids))
    q, k, v, g, beta = delta_xla.fold_segments(q, k, v, g, beta, *runs)
  g = jnp.maximum(g, delta_xla.LOG_ZERO)
  if g.shape[-1] == 1:
    g = g[..., 0]
  # The tail pads to whole chunks with zeros, which neither read nor write (β = k = 0).
  Tp = -(-T // C) * C
  pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T)) + ((0, 0),) * (x.ndim - 2))
  out = _chunked(*(pad(x) for x in (q, k, v, g, beta[..., 0])), C, interpret)
  return out[:, :T].astype(q_BTNH.dtype)
