"""The chunk arithmetic of delta_pallas_gpu's kernels, on values already loaded: a chunk's
state-independent terms (`chunk_terms`) and their hand-written gradient (`chunk_grads`).

Plain jax.numpy on 2-D float32 tiles (Triton has no batched dot or dynamic indexing of values:
rows are masked reductions), so the same functions also run outside a kernel. Decay factors are
exponentials of direct sums of log gates, never differences of prefixes (a reset floors a gate at
LOG_ZERO = −1e30, which a difference would cancel): sums are dots with 0/1 matrices at IEEE
float32. One gate per head: the pairwise sums Σ_{j<s<=i} g_s as one [C, C] dot. One per key
channel: delta_xla's (linear_xla's) halving hierarchy, each level's pairs (i in the upper half of
a 2s-block, j in its lower half) a dot of q_i exp(Σ_{b<s<=i} g_s) and k_j exp(Σ_{j<s<=b} g_s),
both factors <= 1, b the halves' boundary.

Every dot is float32 at Precision.HIGHEST (IEEE; Triton's default for float32 is TF32, whose
10-bit mantissa the triangular solve amplifies).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

NN = (((1,), (0,)), ((), ()))  # a @ b
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b
_F32 = jnp.float32


def dot(a, b, dims=NN):
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
  pairwise = dot(upto, _ones_where(i > j))  # Σ_{j<s<=i} g_s (0 for j >= i)
  decay = jnp.where(j <= i, jnp.exp(pairwise), 0.0)
  prefix = jnp.sum(upto, axis=1)
  suffix = jnp.sum(jnp.where(i > j, g[:, None], 0.0), axis=0)  # Σ_{s>j} g_s, s the row
  qk = [dot(q, k, NT) * decay for q in qs]
  kk = dot(k, k, NT) * jnp.where(j < i, decay, 0.0)
  return qk, kk, jnp.exp(prefix)[:, None], jnp.exp(suffix)[:, None], jnp.exp(jnp.sum(g))


def _channel_gate_terms(qs, k, g, C):
  """One gate per key channel, g [C, Hk]: as _scalar_gate_terms, Γ and exp(suffix) [C, Hk],
  Γ_C [Hk, 1]."""
  i, j = _grid(C)
  # q·k on the diagonal (no decay); k·k has none (strictly lower).
  rows = [jnp.where(i == j, dot(q, k, NT), 0.0) for q in qs] + [jnp.zeros((C, C), _F32)]
  s = 1
  while s < C:
    block_i, block_j = lax.div(i, jnp.int32(s)), lax.div(j, jnp.int32(s))
    same = block_i == block_j
    into = dot(_ones_where(same & (j <= i)), g)  # Σ g over i's s-block up to i
    after = dot(_ones_where(same & (j > i)), g)  # Σ g over the rest of i's s-block
    k_lower = k * jnp.exp(after)
    pair = (block_i == block_j + 1) & (lax.rem(block_i, jnp.int32(2)) == 1)
    upper = jnp.exp(into)
    rows[:-1] = [a + jnp.where(pair, dot(q * upper, k_lower, NT), 0.0)
                 for a, q in zip(rows[:-1], qs)]
    rows[-1] = rows[-1] + jnp.where(pair, dot(k * upper, k_lower, NT), 0.0)
    s *= 2
  prefix = dot(_ones_where(j <= i), g)
  suffix = dot(_ones_where(j > i), g)
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


class Terms(NamedTuple):
  """A chunk's state-independent terms (delta_xla._chunk_terms's, in its notation): the
  normalised inputs (qs one [C, Hk] per query head), the decayed q·kᵀ (j <= i) and k·kᵀ
  (j < i), Γ [C, 1 or Hk], exp(suffix) [C, 1 or Hk], Γ_C (a scalar or [Hk, 1]) and the
  inverse T = (I + β KK)⁻¹, so that solve = T diag(β), W = solve (Γ ⊙ K), Ũ = solve V."""
  qs: list
  k: jax.Array
  beta: jax.Array
  qk: list
  kk: jax.Array
  gamma: jax.Array
  after: jax.Array
  decay: jax.Array
  inverse: jax.Array

  @property
  def solve(self):
    return self.inverse * self.beta[None, :]


def chunk_terms(q_ref, k_ref, g_ref, beta_ref, t, *, C, G, per_channel):
  """The Terms of the chunk at rows t of the refs (q [T, G, Hk], k [T, Hk], g [T(, Hk)],
  beta [T])."""
  k = k_ref[t, :].astype(_F32)
  qs = [q_ref[t, h, :].astype(_F32) for h in range(G)]
  g = (g_ref[t, :] if per_channel else g_ref[t]).astype(_F32)
  beta = beta_ref[t].astype(_F32)
  gate = _channel_gate_terms if per_channel else _scalar_gate_terms
  qk, kk, gamma, after, decay = gate(qs, k, g, C)
  inverse = _unit_lower_inverse(beta[:, None] * kk, C)
  return Terms(qs, k, beta, qk, kk, gamma, after, decay, inverse), g


def _scalar_gate_grads(terms: Terms, g, C, d_qk, d_kk, d_gamma, d_after, d_decay):
  """The VJP of _scalar_gate_terms: (dq per head, dk, dg [C]) from the cotangents of qk, kk,
  Γ, exp(suffix) [C, 1] and Γ_C (a scalar)."""
  i, j = _grid(C)
  pairwise = dot(jnp.where(j <= i, g[None, :], 0.0), _ones_where(i > j))
  decay = jnp.where(j <= i, jnp.exp(pairwise), 0.0)
  s_q = [d * decay for d in d_qk]
  s_k = d_kk * jnp.where(j < i, decay, 0.0)
  dq = [dot(s, terms.k) for s in s_q]
  dk = dot(s_k, terms.k) + dot(s_k, terms.k, TN)
  for s, q in zip(s_q, terms.qs):
    dk = dk + dot(s, q, TN)
  # pairwise_ij = Σ_{j<s<=i} g_s: dg_s gets Σ_{i>=s} Σ_{j<s} of its cotangent.
  d_pairwise = d_kk * terms.kk
  for d, qk in zip(d_qk, terms.qk):
    d_pairwise = d_pairwise + d * qk
  before_s = dot(d_pairwise, _ones_where(i < j))  # [i, s]: Σ_{j<s} d_pairwise_ij
  d_prefix = (d_gamma * terms.gamma)[:, 0]  # prefix_i = Σ_{s<=i} g_s
  d_suffix = (d_after * terms.after)[:, 0]  # suffix_j = Σ_{s>j} g_s
  dg = (jnp.sum(jnp.where(i >= j, before_s + d_prefix[:, None], 0.0), axis=0)
        + jnp.sum(jnp.where(i < j, d_suffix[:, None], 0.0), axis=0)
        + d_decay * terms.decay)
  return dq, dk, dg


def _channel_gate_grads(terms: Terms, g, C, d_qk, d_kk, d_gamma, d_after, d_decay):
  """The VJP of _channel_gate_terms: (dq per head, dk, dg [C, Hk]) from the cotangents of qk,
  kk, Γ, exp(suffix) [C, Hk] and Γ_C [Hk, 1]; each level's dots as the forward's, transposed."""
  i, j = _grid(C)
  k = terms.k
  dq = [dot(jnp.where(i == j, d, 0.0), k) for d in d_qk]
  dk = jnp.zeros_like(k)
  for d, q in zip(d_qk, terms.qs):
    dk = dk + dot(jnp.where(i == j, d, 0.0), q, TN)
  dg = dot(_ones_where(j <= i), d_gamma * terms.gamma, TN) + dot(
      _ones_where(j > i), d_after * terms.after, TN) + (d_decay * terms.decay)[:, 0][None, :]
  s = 1
  while s < C:
    block_i, block_j = lax.div(i, jnp.int32(s)), lax.div(j, jnp.int32(s))
    same = block_i == block_j
    into_mask, after_mask = _ones_where(same & (j <= i)), _ones_where(same & (j > i))
    upper, lower = jnp.exp(dot(into_mask, g)), jnp.exp(dot(after_mask, g))
    k_lower = k * lower
    pair = (block_i == block_j + 1) & (lax.rem(block_i, jnp.int32(2)) == 1)
    d_k_lower, d_into = jnp.zeros_like(k), jnp.zeros_like(k)
    grads = dq + [dk]
    for n, (x, d) in enumerate(zip(terms.qs + [k], d_qk + [d_kk])):
      y = jnp.where(pair, d, 0.0)
      x_upper = x * upper
      d_x_upper = dot(y, k_lower)
      d_k_lower = d_k_lower + dot(y, x_upper, TN)
      grads[n] = grads[n] + d_x_upper * upper
      d_into = d_into + d_x_upper * x_upper
    *dq, dk = grads
    dk = dk + d_k_lower * lower
    dg = dg + dot(into_mask, d_into, TN) + dot(after_mask, d_k_lower * k_lower, TN)
    s *= 2
  return dq, dk, dg


def chunk_grads(terms: Terms, g, C, *, d_qk, d_q_state, d_k_state, d_k_write, d_solve,
                h_dh):
  """(dq per head, dk, dg, dbeta) of a chunk from the cotangents of its terms as the forward
  uses them: qk per head, Γ ⊙ q per head, Γ ⊙ k, exp(suffix) ⊙ k, solve = T diag(β), and
  h_dh = Σ_v h ⊙ dh' [Hk, 1] (Γ_C's, before the gate's own factor)."""
  T, beta = terms.inverse, terms.beta
  i, j = _grid(C)
  d_inverse = d_solve * beta[None, :]
  d_beta = jnp.sum(T * d_solve, axis=0)
  # T = (I + β KK)⁻¹: dM = −Tᵀ dT Tᵀ below the diagonal, M_ij = β_i kk_ij.
  d_m = jnp.where(j < i, -dot(dot(T, d_inverse, TN), T, NT), 0.0)
  d_beta = d_beta + jnp.sum(d_m * terms.kk, axis=1)
  d_gamma = terms.k * d_k_state
  dq = [terms.gamma * d for d in d_q_state]
  for q, d in zip(terms.qs, d_q_state):
    d_gamma = d_gamma + q * d
  dk = terms.gamma * d_k_state + terms.after * d_k_write
  d_after = terms.k * d_k_write
  per_channel = terms.gamma.shape[-1] > 1
  if per_channel:
    gate_grads = _channel_gate_grads
  else:
    gate_grads = _scalar_gate_grads
    d_gamma, d_after = (jnp.sum(x, axis=1, keepdims=True) for x in (d_gamma, d_after))
    h_dh = jnp.sum(h_dh)
  dq_gate, dk_gate, dg = gate_grads(terms, g, C, d_qk, beta[:, None] * d_m, d_gamma, d_after,
                                    h_dh)
  return [a + b for a, b in zip(dq, dq_gate)], dk + dk_gate, dg, d_beta
