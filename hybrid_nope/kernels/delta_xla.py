"""The gated delta rule in pure XLA: every backend, the CPU default.

Per (batch row, kv head) the state S [value dim Hv, key dim Hk] follows
  S_t = S_{t-1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   out_t = S_t q_t,
α_t = exp(g_t) per key channel (a scalar gate is the same value in every channel), q and k
L2-normalised per head here, in float32. Equivalently, with S' = S_{t-1} diag(α_t):
S_t = S' + β_t (v_t − S' k_t) k_tᵀ, the form `step` computes (one token: generation, and the
sequential form the chunked one is checked against). The head layout here is GQA's (one
state per kv head, q [.., N, Hk], k [.., K, Hk], v [.., K, Hv], Hv free); delta_attention.py
maps GVA onto it by repeating q and k.

Segments become gates: a run of equal nonzero ids starts with α = 0 (g = LOG_ZERO, whose exp is
0 as exp(−inf) is), which is exactly a state reset; padding (id 0) gets α = 1, β = 0 and
q = k = v = 0, so it leaves the state as it is and outputs 0. The chunk computations below never
see segment ids, and take any g down to −inf to finite outputs and gradients.

β up to 2 (allow_neg_eigval) keeps the chunked form accurate on ordinary inputs (random keys,
T=128, β in [2 − 1e-4, 2]: worst relative error over out and the five gradients 4.7e-6 against
the sequential form's 1.1e-6, float64 reference). Its hardest case is one key direction with no
decay: every write reflects the state along k, which random-walks, and the chunk form sums
those steps (U) with ±2 entries in the UT inverse: 7.9e-5 at chunk 32 and 1.8e-5 at chunk 16
against the sequential 7.6e-6 (tests/test_kernels_delta_attention.py's check() at B=2, T=128,
N=4, K=2, H=8, Hv=16 over 4 seeds). An exact (float64) inverse takes the forward's 3.1e-5 to
1.3e-5 and leaves the gradients', so the rest is the sums of U, not the recursive inverse.

The chunked form (`chunked`): one lax.scan over chunks of C tokens carries the [Hk, Hv] state;
each step computes its chunk from the caller's layout, its state-independent terms in the WY /
UT form (_chunk_terms: a unit-lower-triangular inverse per chunk, by recursive 2x2 blocks) and
then the state's part. Decay ratios inside a chunk are direct sums of log decays (_gate_sums,
_intra_weights), never differences of prefixes or ratios of exponentials. The gradient is
autodiff's through the step under jax.checkpoint (the forward keeps each chunk's entering state;
the backward recomputes the chunk), with hand-written VJPs where autodiff was wasteful (the
triangular inverse, l2norm).

How fast it is against GLA, what one gate per key channel costs, and what was tried and found
slower: docs/performance.md, "CPU: the gated delta rule".
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hybrid_nope.kernels import linear_xla

CHUNK = 32
L2_EPS = 1e-6  # x / sqrt(Σx² + eps), as fla's l2norm.
# exp(LOG_ZERO) is 0 in float32 as exp(-inf) is: segment starts get it, and gates are floored
# there before the 0/1 dots below, which would turn 0 · -inf into NaN. Nothing changes: the
# value and the gradient (0, through the floor) are those of -inf.
LOG_ZERO = -1e30


def l2norm(x):
  """x / sqrt(Σ_last x² + L2_EPS) in float32 (a zero vector stays zero)."""
  return _unit(x.astype(jnp.float32))


@jax.custom_vjp
def _unit(x):
  """l2norm on float32, with its VJP written out: dx = r (dy − y Σ y·dy), r the scale (one
  pass; autodiff's chain took a tenth of the time of an earlier, all-chunks-at-once form)."""
  return _unit_fwd(x)[0]


def _unit_fwd(x):
  r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)
  y = x * r
  return y, (y, r)


def _unit_bwd(residuals, dy):
  y, r = residuals
  return (r * (dy - y * jnp.sum(y * dy, axis=-1, keepdims=True)),)


_unit.defvjp(_unit_fwd, _unit_bwd)


def step(S_RJH, q_RGH, k_RH, v_RJ, g_RH, beta_R):
  """One token's update on normalised float32 inputs, state S [R, Hv, Hk]: (S_t, out_t
  [R, G, Hv]). R is any leading batch shape; g [.., Hk] or [.., 1] (a scalar gate)."""
  S = S_RJH * jnp.exp(g_RH)[..., None, :]
  predicted = jnp.einsum("...vd,...d->...v", S, k_RH)
  S = S + (beta_R[..., None] * (v_RJ - predicted))[..., :, None] * k_RH[..., None, :]
  return S, jnp.einsum("...vd,...gd->...gv", S, q_RGH)


def run_starts(segment_ids):
  """(start, valid) [B, T]: a run of equal nonzero ids starts here; not padding."""
  seg = segment_ids.astype(jnp.int32)
  start = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  return start, seg != 0


def fold_segments(q, k, v, g, beta, start, valid):
  """The segments folded into the gates (module docstring); start, valid broadcast."""
  g = jnp.where(valid, jnp.where(start, LOG_ZERO, g), 0.0)
  zero = lambda x: jnp.where(valid, x, 0.0)
  return zero(q), zero(k), zero(v), g, zero(beta)


def sequential(q_BTNH, k_BTKH, v_BTKJ, g_BTKX, beta_BTK1, *, segment_ids=None):
  """The recurrence one token at a time (lax.scan over T): the simple form, for checks;
  [B, T, N, Hv]."""
  B, T, N, H = q_BTNH.shape
  K, J = v_BTKJ.shape[2:]
  q, k = l2norm(q_BTNH), l2norm(k_BTKH)
  v, g, beta = (x.astype(jnp.float32) for x in (v_BTKJ, g_BTKX, beta_BTK1))
  if segment_ids is not None:
    q, k, v, g, beta = fold_segments(q, k, v, g, beta,
                                     *(x[:, :, None, None] for x in run_starts(segment_ids)))
  q = q.reshape(B, T, K, N // K, H)

  def body(S, xs):
    q, k, v, g, beta = xs
    return step(S, q, k, v, g, beta[..., 0])

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  _, out = lax.scan(body, jnp.zeros((B, K, J, H), jnp.float32),
                    tuple(map(time_major, (q, k, v, g, beta))))
  return jnp.moveaxis(out, 0, 1).reshape(B, T, N, J).astype(q_BTNH.dtype)


def _mm(spec, a, b):
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _sum_masks(C, pairwise: bool):
  """0/1 [C, C] masks (s, i): s <= i (prefix) and s > i (suffix), and with `pairwise` the
  [C, C·C] mask (s, (i, j)): j < s <= i."""
  s, i = np.arange(C)[:, None], np.arange(C)[None, :]
  masks = [s <= i, s > i]
  if pairwise:
    masks.append(((s[:, :, None] > i[:, None, :]) & (s[:, :, None] <= i[:, :, None])
                  ).reshape(C, C * C))
  return np.concatenate(masks, axis=1).astype(np.float32)


def _gate_sums(g_RCX, C):
  """Sums of the (finite: floored at LOG_ZERO) log gates over [R, C, X] chunks: prefix Σ_{s<=i} g_s and suffix Σ_{s>i} g_s
  [R, C, X], and for a scalar gate (X = 1) the pairwise Σ_{j<s<=i} g_s [R, C, C] (0 for j >= i).
  Each is a direct sum of the gates it covers, taken as one product with a 0/1 matrix: never a
  difference of prefixes, which loses the small sums after one strong decay (and is
  −inf − −inf at a reset); jnp.cumsum (a reduce-window on CPU) is 4x slower."""
  R, _, X = g_RCX.shape
  masks = jnp.asarray(_sum_masks(C, X == 1))
  sums = jnp.einsum("rsx,sm->rxm", g_RCX, masks, precision=lax.Precision.HIGHEST)
  prefix, suffix = (jnp.swapaxes(sums[..., a * C:(a + 1) * C], 1, 2) for a in (0, 1))
  pairwise = sums[:, 0, 2 * C:].reshape(R, C, C) if X == 1 else None
  return prefix, suffix, pairwise


def _intra_weights(q, k, g, pairwise, C):
  """(qk [R, G, C, C]: q_i·k_j decayed from j to i, for j <= i; kk [R, C, C]: the same for
  k_i·k_j, j < i). Scalar gate: the dots masked by exp of the pairwise sums. Per-channel gate:
  linear_xla's halving hierarchy of direct decay products (GLA's intra-chunk weights), the k
  rows as one more query head."""
  if pairwise is not None:
    decay = jnp.where(jnp.tri(C, dtype=bool), jnp.exp(pairwise), 0.0)
    qk = _mm("rgid,rjd->rgij", q, k) * decay[:, None]
    kk = _mm("rid,rjd->rij", k, k) * jnp.where(jnp.tri(C, k=-1, dtype=bool), decay, 0.0)
    return qk, kk
  levels, _, _ = linear_xla.decay_levels(g, C)
  qk_rows = jnp.concatenate([jnp.swapaxes(q, 1, 2), k[:, :, None]], axis=2)
  A = linear_xla.intra_chunk_weights(qk_rows, k, levels, C)  # [R, C, G + 1, C]
  return jnp.swapaxes(A[:, :, :-1], 1, 2), A[:, :, -1] * jnp.tri(C, k=-1, dtype=jnp.float32)


def _unit_lower_inverse(a_RCC, C):
  """(I + a)⁻¹ for strictly lower triangular a [R, C, C], by recursive 2x2 blocks: the inverse
  of [[L11, 0], [L21, L22]] is [[T11, 0], [−T22 L21 T11, T22]] with T = L⁻¹ of the halves,
  all diagonal blocks of one size at once (log2 C levels of batched matmuls). Every
  intermediate is itself an inverse of a diagonal block, as bounded as the result; a power
  series (I − a + a² − ...) instead would pass through binomially large powers of a.
  (jax.scipy.linalg.solve_triangular runs LAPACK per matrix on CPU: ~100x slower here.)"""
  R = a_RCC.shape[0]
  inv = jnp.ones((R, C, 1, 1), jnp.float32)  # the diagonal 1x1 blocks' inverses
  s = 1
  while s < C:
    nb = C // (2 * s)
    blocks = jnp.diagonal(a_RCC.reshape(R, nb, 2 * s, nb, 2 * s), axis1=1, axis2=3)
    lower = jnp.moveaxis(blocks, -1, 1)[:, :, s:, :s]  # [R, nb, s, s]
    inv = inv.reshape(R, nb, 2, s, s)
    t11, t22 = inv[:, :, 0], inv[:, :, 1]
    t21 = -_mm("rbij,rbjk->rbik", t22, _mm("rbij,rbjk->rbik", lower, t11))
    top = jnp.concatenate([t11, jnp.zeros_like(t11)], axis=-1)
    inv = jnp.concatenate([top, jnp.concatenate([t21, t22], axis=-1)], axis=-2)
    s *= 2
  return inv.reshape(R, C, C)


@jax.custom_vjp
def _inverse(a_RCC):
  """(I + a)⁻¹ (_unit_lower_inverse) with the matrix inverse's VJP, da = −Tᵀ dT Tᵀ below the
  diagonal: two matmuls, where autodiff through the levels costs six times the forward."""
  return _unit_lower_inverse(a_RCC, a_RCC.shape[-1])


def _inverse_fwd(a_RCC):
  inverse = _inverse(a_RCC)
  return inverse, inverse


def _inverse_bwd(inverse, d_inverse):
  da = -_mm("rki,rkj->rij", inverse, _mm("rik,rjk->rij", d_inverse, inverse))
  return (da * jnp.tri(inverse.shape[-1], k=-1, dtype=jnp.float32),)


_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def _chunk_terms(q, k, v, g, beta, C):
  """A chunk's state-independent terms, rows R = batch x kv heads: q [R, G, C, Hk], k
  [R, C, Hk], v [R, C, Hv], g [R, C, X], beta [R, C].

  With h = Sᵀ the [key, value] state entering the chunk, Γ_i = exp(Σ_{s<=i} g_s) from the
  chunk start and u_t = β_t (v_t − hᵀ_{t−1} diag(α_t) k_t) the value the delta rule writes
  with key k_t, h_t = diag(α_t) h_{t−1} + k_t u_tᵀ is linear attention with values u; u solves
  the unit-lower-triangular system (I + β KK) U = β (V − (Γ ⊙ K) h), i.e. U = Ũ − W h with
  [W | Ũ] = (I + β KK)⁻¹ β [Γ ⊙ K | V] (the WY / UT form). Then
    out = (Γ ⊙ Q) h + QK U,    h_next = diag(Γ_C) h + (exp(Σ_{s>j} g_s) ⊙ K)ᵀ U.
  Returns (qk, q_state = Γ ⊙ Q, w, u_tilde, k_write, decay_C = Γ_C)."""
  g = jnp.maximum(g, LOG_ZERO)
  prefix, suffix, pairwise = _gate_sums(g, C)
  qk, kk = _intra_weights(q, k, g, pairwise, C)
  gamma = jnp.exp(prefix)
  # (I + β KK)⁻¹ β as one [C, C] matrix, so that β (and a scalar Γ) scale C² entries instead
  # of C·H, and W, Ũ are two matmuls with no concatenation of their right-hand sides.
  solve = _inverse(beta[..., None] * kk) * beta[:, None, :]
  if gamma.shape[-1] == 1:
    w = _mm("rij,rjd->rid", solve * gamma[:, None, :, 0], k)
  else:
    w = _mm("rij,rjd->rid", solve, gamma * k)
  u_tilde = _mm("rij,rjd->rid", solve, v)
  return qk, gamma[:, None] * q, w, u_tilde, jnp.exp(suffix) * k, gamma[:, -1]


def _heads_major(x, B, K):
  """One chunk [B, C, K, (G,) X] -> [B·K, (G,) C, X]: a small in-cache transpose."""
  x = jnp.moveaxis(x, 2, 1)
  x = x.reshape(B * K, *x.shape[2:])
  return jnp.moveaxis(x, 1, -2) if x.ndim == 4 else x


def _chunk(h, xs, *, B, K, C):
  """One chunk of the recurrence: (state leaving it, out [B, C, N, Hv]) from the entering
  state h [B·K, Hk, Hv] and the chunk's raw inputs (caller layout, [B, C, ...])."""
  q, k, v, g, beta, *runs = xs
  q, k = l2norm(q), l2norm(k)
  v, g, beta = (x.astype(jnp.float32) for x in (v, g, beta))
  if runs:
    q, k, v, g, beta = fold_segments(q, k, v, g, beta, *(x[:, :, None, None] for x in runs))
  q = q.reshape(B, C, K, -1, q.shape[-1])
  q, k, v, g, beta = (_heads_major(x, B, K) for x in (q, k, v, g, beta))
  qk, q_state, w, u_tilde, k_write, decay = _chunk_terms(q, k, v, g, beta[..., 0], C)
  u = u_tilde - _mm("rcd,rde->rce", w, h)
  out = _mm("rgcd,rde->rgce", q_state, h) + _mm("rgij,rjh->rgih", qk, u)
  h = decay[..., None] * h + _mm("rcd,rce->rde", k_write, u)
  _, G, _, J = out.shape
  return h, jnp.moveaxis(out.reshape(B, K, G, C, J), 3, 1).reshape(B, C, K * G, J)


def chunked(q_BTNH, k_BTKH, v_BTKJ, g_BTKX, beta_BTK1, *, segment_ids=None, chunk=None,
            return_state=False):
  """The chunked form: one lax.scan over chunks carrying the state, each step computing its
  chunk from the caller's layout (_chunk); autodiff gives the gradients, the step under
  jax.checkpoint so that the backward recomputes a chunk's terms instead of storing every
  chunk's (which made fwd+bwd twice as slow: page faults on ~10 input-sized buffers).
  Returns [B, T, N, Hv]; with `return_state` also the state after the last token, float32
  [B, K, Hv, Hk] as `step` holds it (a prompt's state, for generation to go on from)."""
  C = chunk or CHUNK
  B, T, N, H = q_BTNH.shape
  K, J = v_BTKJ.shape[2:]
  Tp = -(-T // C) * C
  n = Tp // C
  # [B, T, ...] -> [n, B, C, ...]: the scan's steps (free for B = 1); the tail is padded with
  # zeros, which neither read nor write (β = k = 0).
  chunks = lambda x: jnp.moveaxis(
      jnp.pad(x, ((0, 0), (0, Tp - T)) + ((0, 0),) * (x.ndim - 2)).reshape(
          B, n, C, *x.shape[2:]), 1, 0)
  xs = [chunks(x) for x in (q_BTNH, k_BTKH, v_BTKJ, g_BTKX, beta_BTK1)]
  if segment_ids is not None:
    xs += [chunks(x) for x in run_starts(segment_ids)]
  body = jax.checkpoint(functools.partial(_chunk, B=B, K=K, C=C))
  h, out = lax.scan(body, jnp.zeros((B * K, H, J), jnp.float32), tuple(xs))
  out = jnp.moveaxis(out, 0, 1).reshape(B, Tp, N, J)[:, :T].astype(q_BTNH.dtype)
  if not return_state:
    return out
  # The carry is [key, value] per (row, kv head); step's state is its transpose.
  return out, jnp.swapaxes(h.reshape(B, K, H, J), -1, -2)


def delta_attention(q_BTNH, k_BTKH, v_BTKJ, g_BTKX, beta_BTK1, *, segment_ids=None,
                    chunk: int | None = None):
  """The gated delta rule; arguments as kernels.delta_attention after its reshapes (GQA
  layout, v [B, T, K, Hv]): g [B, T, K, Hk] or [B, T, K, 1] (scalar per kv head), beta
  [B, T, K, 1]. `chunk` (a power of two) overrides the tuned chunk size (tests, benchmarks)."""
  C = chunk or CHUNK
  if C < 2 or C & (C - 1):
    raise ValueError(f"chunk={C}: expected a power of two >= 2")
  return chunked(q_BTNH, k_BTKH, v_BTKJ, g_BTKX, beta_BTK1, segment_ids=segment_ids, chunk=C)
