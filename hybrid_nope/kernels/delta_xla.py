"""The gated delta rule in pure XLA: every backend, the CPU default.

Per (batch row, kv head) the state S [value dim, key dim] follows
  S_t = S_{t-1} diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   out_t = S_t q_t,
α_t = exp(g_t) per key channel (a scalar gate is the same channel value broadcast), q and k
L2-normalised per head here, in float32. Equivalently, with S' = S_{t-1} diag(α_t):
S_t = S' + β_t (v_t − S' k_t) k_tᵀ, the form `step` computes.

Segments are turned into gates before any of the work: a run of equal nonzero ids starts with
α = 0 (g = −inf), which is exactly a state reset; padding (id 0) gets α = 1, β = 0 and q = k = v
= 0, so it leaves the state as it is and outputs 0. The kernels below therefore never see
segment ids, and must (and do) take g = −inf to finite outputs and gradients.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_nope.kernels import linear_xla

CHUNK = 64
L2_EPS = 1e-6  # x / sqrt(Σx² + eps), as fla's l2norm.


def l2norm(x):
  """x / sqrt(Σ_last x² + L2_EPS) in float32 (a zero vector stays zero)."""
  x = x.astype(jnp.float32)
  return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def step(S_RVK, q_RGH, k_RH, v_RH, g_RH, beta_R):
  """One token's update on normalised float32 inputs: (S_t, out_t [R, G, H]). R is any leading
  batch shape; g [.., H] or [.., 1] (a scalar gate)."""
  S = S_RVK * jnp.exp(g_RH)[..., None, :]
  predicted = jnp.einsum("...vd,...d->...v", S, k_RH)
  S = S + (beta_R[..., None] * (v_RH - predicted))[..., :, None] * k_RH[..., None, :]
  return S, jnp.einsum("...vd,...gd->...gv", S, q_RGH)


def gated_inputs(q, k, v, g, beta, segment_ids):
  """float32 (q, k normalised, v, g, beta) with the segments folded into the gates (module
  docstring). q [B,T,N,H], k, v [B,T,K,H], g [B,T,K,H|1], beta [B,T,K,1]."""
  q, k = l2norm(q), l2norm(k)
  v, g, beta = (x.astype(jnp.float32) for x in (v, g, beta))
  if segment_ids is None:
    return q, k, v, g, beta
  seg = segment_ids.astype(jnp.int32)
  valid = (seg != 0)[:, :, None, None]
  start = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  g = jnp.where(valid, jnp.where(start[:, :, None, None], -jnp.inf, g), 0.0)
  zero = lambda x: jnp.where(valid, x, 0.0)
  return zero(q), zero(k), zero(v), g, zero(beta)


def sequential(q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK1, *, segment_ids=None):
  """The recurrence one token at a time (lax.scan over T): the simple form, for checks."""
  B, T, N, H = q_BTNH.shape
  K = k_BTKH.shape[2]
  q, k, v, g, beta = gated_inputs(q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK1, segment_ids)
  q = q.reshape(B, T, K, N // K, H)

  def body(S, xs):
    q, k, v, g, beta = xs
    return step(S, q, k, v, g, beta[..., 0])

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  _, out = lax.scan(body, jnp.zeros((B, K, H, H), jnp.float32),
                    tuple(map(time_major, (q, k, v, g, beta))))
  return jnp.moveaxis(out, 0, 1).reshape(B, T, N, H).astype(q_BTNH.dtype)


def _chunks(x, C):
  """[B, Tp, K, (G,) X] -> [n, B·K, (G,) C, X]: chunk-major, heads next, time within a chunk."""
  B, Tp, K = x.shape[:3]
  x = x.reshape(B, Tp // C, C, K, *x.shape[3:])
  x = jnp.moveaxis(jnp.moveaxis(x, 2, -2), 0, 1)  # [n, B, K, (G,) C, X]
  return x.reshape(Tp // C, B * K, *x.shape[3:])


def _unchunk(x_nRGCH, B, K):
  """Inverse of _chunks for the output: [n, B·K, G, C, H] -> [B, n·C, K·G, H]."""
  n, _, G, C, H = x_nRGCH.shape
  x = jnp.moveaxis(x_nRGCH.reshape(n, B, K, G, C, H), 4, 1)  # [n, C, B, K, G, H]
  return jnp.moveaxis(x, 2, 0).reshape(B, n * C, K * G, H)


def _segment_sums(g_RC, C):
  """[.., C, C]: Σ_{j<s<=i} g_s at (i, j) for j <= i, each a direct sum of the log decays (a
  cumulative sum down i of g_i masked to i > j: never a difference of prefixes, which loses the
  small sums after one strong decay, nor −inf − −inf); 0 above the diagonal."""
  strictly_lower = jnp.tri(C, k=-1, dtype=bool)
  x = jnp.where(strictly_lower, g_RC[..., :, None], 0.0)
  return jnp.cumsum(x, axis=-2)


def _intra_weights(q, k, g, C):
  """(B [.., G, C, C] q_i·k_j decayed from j to i, j <= i; KK [.., C, C] the same for k_i·k_j,
  j < i). Scalar gate: the q·k dots masked by exp of the direct segment sums. Per-channel gate:
  linear_xla's halving hierarchy of direct decay products (the same weights GLA needs), with
  the k rows as one more query head."""
  if g.shape[-1] == 1:
    decay = jnp.where(jnp.tri(C, dtype=bool), jnp.exp(_segment_sums(g[..., 0], C)), 0.0)
    qk = jnp.einsum("rgid,rjd->rgij", q, k) * decay[:, None]
    kk = jnp.einsum("rid,rjd->rij", k, k) * jnp.where(jnp.tri(C, k=-1, dtype=bool), decay, 0.0)
    return qk, kk
  levels, _, _ = linear_xla._levels(g, C)
  A = linear_xla._intra(jnp.concatenate([jnp.swapaxes(q, 1, 2), k[:, :, None]], axis=2), k,
                        levels, C)  # [R, C, G + 1, C]
  qk = jnp.swapaxes(A[:, :, :-1], 1, 2)
  kk = A[:, :, -1] * jnp.tri(C, k=-1, dtype=jnp.float32)
  return qk, kk


def _chunk_terms(q, k, v, g, beta, C):
  """One chunk's state-independent terms, batched over rows R (every chunk of every head):
  the chunk's inputs q [R, G, C, H], k, v [R, C, H], g [R, C, X], beta [R, C].

  With h = Sᵀ the [key, value] state entering the chunk, Γ_i = exp(Σ_{s<=i} g_s) from the
  chunk start and u_t = β_t (v_t − hᵀ_{t−1} diag(α_t) k_t) the value the delta rule writes
  with key k_t, h_t = diag(α_t) h_{t−1} + k_t u_tᵀ is linear attention with values u; u solves
  the unit-lower-triangular system (I + βKK) U = β(V − (Γ ⊙ K) h), i.e. U = Ũ − W h with
  [W | Ũ] = (I + βKK)⁻¹ β[Γ ⊙ K | V] (the WY / UT form). Then
    out = B Ũ + (Γ ⊙ Q − B W) h,    h_next = diag(Γ_C) h + (exp(Σ_{s>j} g_s) ⊙ K)ᵀ U.
  Returns (out_intra, q_state, w, u_tilde, k_write, decay_C)."""
  qk, kk = _intra_weights(q, k, g, C)
  prefix = jnp.cumsum(g, axis=1)
  # Σ_{s>j} g_s as its own (reverse) cumulative sum, not total − prefix.
  suffix = jnp.concatenate([jnp.flip(jnp.cumsum(jnp.flip(g[:, 1:], 1), axis=1), 1),
                            jnp.zeros_like(g[:, :1])], axis=1)
  gamma = jnp.exp(prefix)
  system = jnp.eye(C, dtype=jnp.float32) + beta[..., None] * kk
  rhs = beta[..., None] * jnp.concatenate([gamma * k, v], axis=-1)
  H = k.shape[-1]
  solved = jax.scipy.linalg.solve_triangular(system, rhs, lower=True, unit_diagonal=True)
  w, u_tilde = solved[..., :H], solved[..., H:]
  out_intra = jnp.einsum("rgij,rjh->rgih", qk, u_tilde)
  q_state = gamma[:, None] * q - jnp.einsum("rgij,rjd->rgid", qk, w)
  return out_intra, q_state, w, u_tilde, jnp.exp(suffix) * k, gamma[:, -1]


def chunked(q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK1, *, segment_ids=None, chunk=None):
  """The chunked form (module docstring); autodiff gives its gradients."""
  C = chunk or CHUNK
  B, T, N, H = q_BTNH.shape
  K = k_BTKH.shape[2]
  G = N // K
  q, k, v, g, beta = gated_inputs(q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK1, segment_ids)
  Tp = -(-T // C) * C
  pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T)) + ((0, 0),) * (x.ndim - 2))
  q = _chunks(pad(q).reshape(B, Tp, K, G, H), C)
  k, v, g, beta = (_chunks(pad(x), C) for x in (k, v, g, beta))
  n, R = k.shape[:2]
  flat = lambda x: x.reshape(n * R, *x.shape[2:])
  terms = _chunk_terms(flat(q), flat(k), flat(v), flat(g), flat(beta)[..., 0], C)
  out_intra, q_state, w, u_tilde, k_write, decay = (x.reshape(n, R, *x.shape[1:]) for x in terms)

  def body(h, xs):
    w, u_tilde, k_write, decay = xs
    u = u_tilde - jnp.einsum("rcd,rde->rce", w, h)
    return decay[..., None] * h + jnp.einsum("rcd,rce->rde", k_write, u), h

  _, h_in = lax.scan(body, jnp.zeros((R, H, H), jnp.float32), (w, u_tilde, k_write, decay))
  out = out_intra + jnp.einsum("nrgcd,nrde->nrgce", q_state, h_in)
  return _unchunk(out, B, K)[:, :T].astype(q_BTNH.dtype)


def delta_attention(q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK1, *, segment_ids=None,
                    chunk: int | None = None):
  """The gated delta rule; arguments as kernels.delta_attention after its reshapes: g
  [B, T, K, H] or [B, T, K, 1] (scalar per kv head), beta [B, T, K, 1]. `chunk` (a power of
  two) overrides the tuned chunk size (tests, benchmarks)."""
  C = chunk or CHUNK
  if C < 2 or C & (C - 1):
    raise ValueError(f"chunk={C}: expected a power of two >= 2")
  # The sequential form until the chunked one is checked.
  return sequential(q_BTNH, k_BTKH, v_BTKH, g_BTKX, beta_BTK1, segment_ids=segment_ids)
