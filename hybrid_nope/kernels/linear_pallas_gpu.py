"""Gated linear attention for GPUs in Pallas (Triton lowering): chunked forward and backward.

The maths is linear_xla's (read its docstring): per (batch row, kv head) the [H, H] state runs
over chunks of C = 64 tokens, and within a chunk out_i = s·[(q_i ⊙ e^{P_i})ᵀ S_in + Σ_{j<=i} A_ij
v_j] with A_ij = Σ_d q_id k_jd e^{Σ_{j<t<=i} g_td}. Four pallas_calls, as fla's chunk_gla splits
the work (state passing sequential over chunks, everything else parallel over chunks):
  gla_chunk_states   grid (B, K, H/BV), a loop over chunks: the state entering each chunk;
  gla_chunk_out      grid (B, K, n): the chunk's outputs for the G query heads of a kv head;
  gla_chunk_dstates  grid (B, K, H/BV), a reverse loop: the gradient of each chunk's out state;
  gla_chunk_grads    grid (B, K, n): dq, dk, dv and the chunk-local part of dlog_decay.
The later chunks' share of dlog_decay is one [H] vector per chunk, carried by an associative
scan in XLA (_dlog_decay), as linear_xla's reverse scan carries it.

Stable intra-chunk decays: every factor is e^{Σ g} over exactly the range it stands for, a
product of numbers in [0, 1] (linear_pallas_gpu_tiles.py says how and what bound it gives).

Backward: dq, dk, dv by the chain rule through the same factors; dlog_decay as linear_xla's, the
in-run reverse cumulative sum of dG = q ⊙ dq − k ⊙ dk (full gradients, the i = j terms left
out: they cancel exactly), chunk-locally a masked 0/1 dot at HIGHEST, across chunks the scan.

Layout stays [B, T, heads, H] (no transposes): a chunk's program owns one kv head and the G
query heads that read it (so dk, dv need no atomics). T is padded to whole chunks, H to a power
of two >= 16 (zero columns change nothing). Segments become per-position run ids and read /
write flags (linear_xla's masks) computed once in XLA. Data dots of float32 inputs run at
HIGHEST (IEEE; Triton's default is TF32, which missed float32's 1e-4 in the attention kernel on
the H200), of bfloat16 at the default; accumulation and all gate maths are float32.

Status: checked in interpret mode on CPU (tests/test_kernels_linear_pallas_gpu.py) and lowered
for CUDA with jax.export; not yet run or timed on a GPU, so linear_attention's "auto" does not
pick it (the `auto` of dispatch.py's table). BV = 32 (value columns per state program) and
C = 64 are fla's sizes, not tuned here.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_nope.kernels import linear_xla
from hybrid_nope.kernels.linear_pallas_gpu_tiles import (
    NT, SUB, TN, chunk_factors, dot, eye, flags, intra, load, pairs)

try:  # Pallas APIs move between jax releases: without them impl="pallas" is off on CUDA.
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover - depends on the jax build
  pl = plgpu = None

CHUNK = 64
VALUE_BLOCK = 32  # Value columns per state program (more programs for the sequential passes).
_SQUEEZED = getattr(pl, "squeezed", None)


def available() -> bool:
  """Whether the compiled (Triton) kernels can be built; interpret mode needs only Pallas."""
  return pl is not None and plgpu is not None


def _states_kernel(k_ref, v_ref, g_ref, write_ref, carry_ref, states_ref, *, C, precision):
  """The state entering each chunk (value columns of this program's block), in order."""
  n_sub, H = C // SUB, k_ref.shape[-1]

  def step(c, S):
    states_ref[c] = S
    start = c * C
    ch = chunk_factors(g_ref, start, n_sub, levels=False)
    k, v = load(k_ref, start, n_sub, slice(None)), load(v_ref, start, n_sub, slice(None))
    write = [write_ref[pl.ds(start + J * SUB, SUB)][:, None] for J in range(n_sub)]
    S = (ch.decay * carry_ref[c])[:, None] * S
    for J in range(n_sub):
      S += dot(k[J] * ch.eu[J] * write[J], v[J], TN, precision)
    return S

  lax.fori_loop(0, states_ref.shape[0], step,
                jnp.zeros((H, states_ref.shape[-1]), jnp.float32))


def _dstates_kernel(q_ref, do_ref, g_ref, read_ref, carry_ref, dstates_ref, *, C, G, scale,
                    precision):
  """The gradient of the state leaving each chunk, in reverse order."""
  n_sub, H, n = C // SUB, q_ref.shape[-1], dstates_ref.shape[0]

  def step(t, dS):
    c = n - 1 - t
    dstates_ref[c] = dS
    start = c * C
    ch = chunk_factors(g_ref, start, n_sub, levels=False)
    read = [read_ref[pl.ds(start + I * SUB, SUB)][:, None] for I in range(n_sub)]
    dS = (ch.decay * carry_ref[c])[:, None] * dS
    for g in range(G):
      q, do = load(q_ref, start, n_sub, g, slice(None)), load(do_ref, start, n_sub, g, slice(None))
      for I in range(n_sub):
        dS += dot(q[I] * ch.ep[I] * read[I], do[I] * scale, TN, precision)
    return dS

  lax.fori_loop(0, n, step, jnp.zeros((H, dstates_ref.shape[-1]), jnp.float32))


def _out_kernel(q_ref, k_ref, v_ref, g_ref, S_ref, *rest, C, G, scale, precision):
  """One chunk's outputs for the G query heads of a kv head, from the state entering it."""
  flag_refs, (out_ref,) = rest[:4], rest[4:]
  n_sub = C // SUB
  ch = chunk_factors(g_ref, 0, n_sub)
  fl = [flags(flag_refs, I) for I in range(n_sub)]
  pair = pairs(fl)
  k, v = load(k_ref, 0, n_sub, slice(None)), load(v_ref, 0, n_sub, slice(None))
  S = S_ref[...]
  for g in range(G):
    q = load(q_ref, 0, n_sub, g, slice(None))
    A = intra(q, k, ch, pair, precision)
    for I in range(n_sub):
      out = dot(q[I] * ch.ep[I] * fl[I].read, S, precision=precision)
      for J in range(I + 1):
        out += dot(A[I][J], v[J], precision=precision)
      out_ref[pl.ds(I * SUB, SUB), g, :] = (out * scale).astype(out_ref.dtype)


def _grads_kernel(q_ref, k_ref, v_ref, g_ref, do_ref, S_ref, dS_ref, *rest, C, G, scale,
                  precision):
  """dq (per query head), dk, dv and dg_local (the in-chunk, in-run reverse sum of dG)."""
  flag_refs, (dq_ref, dk_ref, dv_ref, dgl_ref) = rest[:4], rest[4:]
  n_sub = C // SUB
  ch = chunk_factors(g_ref, 0, n_sub)
  fl = [flags(flag_refs, I) for I in range(n_sub)]
  pair = pairs(fl)
  k, v = load(k_ref, 0, n_sub, slice(None)), load(v_ref, 0, n_sub, slice(None))
  S, dS = S_ref[...], dS_ref[...]
  diag_mask = eye()
  # The state's part: S_out gets (k ⊙ e^U)ᵀ v on the chunk's last run.
  kw = [k[J] * ch.eu[J] * fl[J].write for J in range(n_sub)]
  dk = [dot(v[J], dS, NT, precision) * ch.eu[J] * fl[J].write for J in range(n_sub)]
  dv = [dot(kw[J], dS, precision=precision) for J in range(n_sub)]
  dk_diag = [jnp.zeros_like(x) for x in dk]
  dG = [jnp.zeros_like(x) for x in dk]
  for g in range(G):
    q = load(q_ref, 0, n_sub, g, slice(None))
    do = [x * scale for x in load(do_ref, 0, n_sub, g, slice(None))]
    A = intra(q, k, ch, pair, precision)
    for I in range(n_sub):
      dq = dot(do[I], S, NT, precision) * ch.ep[I] * fl[I].read
      qs = q[I] * ch.subs[I].pre
      for J in range(I + 1):
        dA = dot(do[I], v[J], NT, precision) * pair[I][J]
        dv[J] += dot(A[I][J], do[I], TN, precision)
        if J < I:
          dq += dot(dA, k[J] * ch.fk[I][J], precision=precision) * ch.subs[I].pre
          dk[J] += dot(dA, qs, TN, precision) * ch.fk[I][J]
          continue
        for fq, fk, mask in ch.subs[I].levels:
          dX = jnp.where(mask, dA, 0.0)
          dq += dot(dX, k[I] * fk, precision=precision) * fq
          dk[I] += dot(dX, q[I] * fq, TN, precision) * fk
        # The i = j terms cancel exactly in dG: they join dq, dk only after it.
        diag = jnp.sum(dA * diag_mask, axis=1)[:, None]
        dG[I] += q[I] * dq
        dq_ref[pl.ds(I * SUB, SUB), g, :] = (dq + diag * k[I]).astype(dq_ref.dtype)
        dk_diag[I] += diag * q[I]
  exact = lax.Precision.HIGHEST
  for J in range(n_sub):
    dG[J] -= k[J] * dk[J]
    dk_ref[pl.ds(J * SUB, SUB), :] = (dk[J] + dk_diag[J]).astype(dk_ref.dtype)
    dv_ref[pl.ds(J * SUB, SUB), :] = dv[J].astype(dv_ref.dtype)
  for I in range(n_sub):  # dg_local_i = Σ_{t >= i in i's run} dG_t: pairs transposed
    dg = dot(pair[I][I], dG[I], TN, exact)
    for T in range(I + 1, n_sub):
      dg += dot(pair[T][I], dG[T], TN, exact)
    dgl_ref[pl.ds(I * SUB, SUB), :] = dg


class _Masks(NamedTuple):
  """linear_xla's run masks per position ([B, Tp]; carry [B, n]), for the kernels' flags."""
  run: jax.Array    # int32 run ids
  valid: jax.Array  # not padding
  read: jax.Array   # reads the state entering its chunk
  write: jax.Array  # writes the state leaving its chunk (the chunk's last run)
  carry: jax.Array  # [B, n] the entering state survives the chunk
  start: jax.Array  # bool: a run starts here, or padding (dlog_decay 0)


def _masks(segment_ids, Tp, C) -> _Masks:
  run, valid = linear_xla.run_ids(segment_ids, Tp)
  B, n = run.shape[0], Tp // C
  last = run[:, C - 1::C]                                            # [B, n]
  prev = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), last[:, :-1]], axis=1)
  per_pos = lambda x: jnp.repeat(x, C, axis=1)
  change = jnp.concatenate([jnp.ones((B, 1), bool), run[:, 1:] != run[:, :-1]], axis=1)
  f32 = lambda x: x.astype(jnp.float32)
  return _Masks(run, f32(valid), f32(valid & (run == per_pos(prev))),
                f32(valid & (run == per_pos(last))), f32(last == prev), change | ~valid)


def _call(kernel, grid, in_specs, out_specs, out_shape, interpret, name):
  params = None if interpret else plgpu.CompilerParams(num_warps=4, num_stages=1)
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, compiler_params=params, interpret=interpret,
                        name=name)


def _specs(C, G, H):
  """BlockSpecs over grid (b, kv head, chunk): a kv head's chunk, its query heads' chunk, one
  position flag row, its states."""
  kv = pl.BlockSpec((_SQUEEZED, C, _SQUEEZED, H), lambda b, h, c: (b, c, h, 0))
  group = pl.BlockSpec((_SQUEEZED, C, G, H), lambda b, h, c: (b, c, h, 0))
  flag = pl.BlockSpec((_SQUEEZED, C), lambda b, h, c: (b, c))
  state = pl.BlockSpec((_SQUEEZED,) * 3 + (H, H), lambda b, h, c: (b, h, c, 0, 0))
  return kv, group, flag, state


def _sequential_specs(Tp, n, H, BV, heads):
  """BlockSpecs over grid (b, kv head, value block) for the state passes: whole-sequence
  operands of `heads` query heads (None: the kv head), value columns of block vb, per-chunk
  rows, and the states' value block."""
  whole = lambda cols, idx: pl.BlockSpec(
      (_SQUEEZED, Tp, heads or _SQUEEZED, cols), lambda b, h, vb: (b, 0, h, idx(vb)))
  return (whole(H, lambda vb: 0), whole(BV, lambda vb: vb),
          pl.BlockSpec((_SQUEEZED, Tp, _SQUEEZED, H), lambda b, h, vb: (b, 0, h, 0)),
          pl.BlockSpec((_SQUEEZED, Tp), lambda b, h, vb: (b, 0)),
          pl.BlockSpec((_SQUEEZED, n), lambda b, h, vb: (b, 0)),
          pl.BlockSpec((_SQUEEZED, _SQUEEZED, n, H, BV), lambda b, h, vb: (b, h, 0, 0, vb)))


def _forward(q, k, v, g, m, C, scale, precision, interpret):
  """Padded operands in: (out [B, Tp, N, H], states entering each chunk [B, K, n, H, H])."""
  B, Tp, N, H = q.shape
  K = k.shape[2]
  G, n, BV = N // K, Tp // C, min(H, VALUE_BLOCK)
  kspec, vspec, gspec, wspec, cspec, sspec = _sequential_specs(Tp, n, H, BV, None)
  states = _call(functools.partial(_states_kernel, C=C, precision=precision), (B, K, H // BV),
                 [kspec, vspec, gspec, wspec, cspec], sspec,
                 jax.ShapeDtypeStruct((B, K, n, H, H), jnp.float32), interpret,
                 "gla_chunk_states")(k, v, g, m.write, m.carry)
  kv, group, flag, state = _specs(C, G, H)
  kernel = functools.partial(_out_kernel, C=C, G=G, scale=scale, precision=precision)
  out = _call(kernel, (B, K, n), [group, kv, kv, kv, state, flag, flag, flag, flag], group,
              jax.ShapeDtypeStruct(q.shape, q.dtype), interpret, "gla_chunk_out")(
                  q, k, v, g, states, m.run, m.valid, m.read, m.write)
  return out, states


def _dlog_decay(dgl, m, C):
  """dg = in-run reverse cumulative sum of dG: the chunk-local part dgl plus, on each chunk's
  last run, `later` (Σ dG over the later chunks in that run), zero where a run starts.
  later_c = read_{c+1}[0]·(dgl_{c+1}[0] + write_{c+1}[0]·later_{c+1}): affine in later_{c+1}
  with 0/1 coefficients, solved by an associative scan over the chunks, reversed."""
  B, Tp = m.run.shape
  first = lambda x: x[:, ::C]  # position 0 of each chunk
  r0, w0 = first(m.read), first(m.write)  # [B, n]
  a = (r0[..., None, None] * first(dgl))[:, 1:]
  b = (r0 * w0)[:, 1:, None, None]
  # (zeros of explicit shape: with one chunk x is empty along axis 1, and so is x[:, :1])
  pad = lambda x: jnp.concatenate([x, jnp.zeros((B, 1, *x.shape[2:]), x.dtype)],
                                  axis=1)[:, ::-1]
  a, b = jnp.broadcast_arrays(pad(a), pad(b))  # chunk n - 1 first; the last has no later

  def compose(later, cur):  # x_cur = a_cur + b_cur·x_later
    return cur[0] + cur[1] * later[0], cur[1] * later[1]

  later = lax.associative_scan(compose, (a, b), axis=1)[0][:, ::-1]  # [B, n, K, H]
  later = jnp.repeat(later, C, axis=1)
  dg = dgl + m.write[..., None, None] * later
  return jnp.where(m.start[..., None, None], 0.0, dg)


def _backward(q, k, v, g, m, states, do, C, scale, precision, interpret):
  B, Tp, N, H = q.shape
  K = k.shape[2]
  G, n, BV = N // K, Tp // C, min(H, VALUE_BLOCK)
  qspec, dospec, gspec, rspec, cspec, sspec = _sequential_specs(Tp, n, H, BV, G)
  dstates = _call(functools.partial(_dstates_kernel, C=C, G=G, scale=scale, precision=precision),
                  (B, K, H // BV),
                  [qspec, dospec, gspec, rspec, cspec], sspec,
                  jax.ShapeDtypeStruct((B, K, n, H, H), jnp.float32), interpret,
                  "gla_chunk_dstates")(q, do, g, m.read, m.carry)
  kv, group, flag, state = _specs(C, G, H)
  kernel = functools.partial(_grads_kernel, C=C, G=G, scale=scale, precision=precision)
  dq, dk, dv, dgl = _call(
      kernel, (B, K, n), [group, kv, kv, kv, group, state, state, flag, flag, flag, flag],
      [group, kv, kv, kv],
      [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
       jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(k.shape, jnp.float32)],
      interpret, "gla_chunk_grads")(q, k, v, g, do, states, dstates, m.run, m.valid, m.read,
                                    m.write)
  return dq, dk, dv, _dlog_decay(dgl, m, C).astype(g.dtype)


# C, `scale` (1/sqrt of the unpadded head dim), precision and interpret are static.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _gla(q, k, v, g, segment_ids, C, scale, precision, interpret):
  return _gla_fwd(q, k, v, g, segment_ids, C, scale, precision, interpret)[0]


def _gla_fwd(q, k, v, g, segment_ids, C, scale, precision, interpret):
  m = _masks(segment_ids, q.shape[1], C)
  out, states = _forward(q, k, v, g, m, C, scale, precision, interpret)
  return out, (q, k, v, g, m, states)


def _gla_bwd(C, scale, precision, interpret, residuals, do):
  q, k, v, g, m, states = residuals
  return (*_backward(q, k, v, g, m, states, do, C, scale, precision, interpret), None)


_gla.defvjp(_gla_fwd, _gla_bwd)


def linear_attention(q_BTNH, k_BTKH, v_BTKH, log_decay_BTKH, *, segment_ids=None,
                     chunk: int | None = None, precision=None, interpret: bool = False):
  """Gated linear attention; arguments as kernels.linear_attention. `chunk`: a power of two
  >= 16 (default CHUNK); `precision`: of the data dots (None: HIGHEST for float32 inputs, the
  default for bfloat16); `interpret=True` runs the kernels on any backend (tests)."""
  if pl is None or (not interpret and plgpu is None):
    raise ValueError("impl='pallas' on GPU needs jax.experimental.pallas (and its triton "
                     "module), which this jax build lacks")
  if precision is None and q_BTNH.dtype == jnp.float32:
    precision = lax.Precision.HIGHEST
  C = chunk or CHUNK
  if C < SUB or C & (C - 1):
    raise ValueError(f"chunk={C}: expected a power of two >= {SUB}")
  B, T, N, H = q_BTNH.shape
  Tp, Hp = -(-T // C) * C, max(SUB, pl.next_power_of_2(H))
  pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, Hp - H)))
  # Padded tail positions are segment 0: padding, which outputs 0 and writes nothing.
  seg = jnp.ones((B, T), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
  seg = jnp.pad(seg, ((0, 0), (0, Tp - T)))
  out = _gla(pad(q_BTNH), pad(k_BTKH), pad(v_BTKH), pad(log_decay_BTKH), seg, C, H**-0.5,
             precision, interpret)
  return out[:, :T, :, :H]
