"""Closed-form predictions of the recency mechanism (DESIGN.md), for tests and plots.

  swa_cosine(d, w)    = [1 − d/w]_+                     uniform SWA over uncorrelated values
  global_cosine(d, i) = sqrt((i − d + 1)/(i + 1))        uniform causal attention at position i
  linear_cosine(d, α) = α^d                              constant-decay linear mixer, long prefix
                                                         (with i: the finite-prefix form)
  linear_recency_scale(α) = 1/(1 − α)                    its recency scale (SWA-equivalent window)
  delta_cosine(d, α, β, H) = (α(1 − β/H))^d              gated delta rule, random unit keys in H
                                                         dims, long prefix (with i: finite prefix)
  delta_recency_scale(α, β, H) = 1/(1 − α(1 − β/H))      its recency scale
  G_Y(d) ≈ A (g_a ∗ G_X)(d) Aᵀ                           cross-moment through an attention layer
  k_f(p) = Σ a_n² pⁿ / Σ a_n²                            wide random MLP kernel (Hermite a_n)
"""
from __future__ import annotations

import math

import numpy as np
from numpy.polynomial import hermite_e


def swa_cosine(d, w):
  return np.maximum(0.0, 1.0 - np.asarray(d, np.float64) / w)


def global_cosine(d, i):
  d, i = np.asarray(d, np.float64), np.asarray(i, np.float64)
  return np.sqrt((i - d + 1) / (i + 1))


def _lags(d):
  d = np.asarray(d, np.float64)
  if not np.all(d >= 0):
    raise ValueError(f"d={d!r}: expected lags >= 0")
  return d


def _decays(decay):
  a = np.asarray(decay, np.float64)
  if not np.all((a >= 0) & (a <= 1)):
    raise ValueError(f"decay={decay!r}: expected values in [0, 1] (a constant per-step decay)")
  return a


def linear_cosine(d, decay, i=None):
  """Cosine of y_i and y_{i−d} for y_i = Σ_{j=0}^{i} α^{i−j} v_j, α = decay ∈ [0, 1], over
  uncorrelated values: v_j i.i.d., zero mean, isotropic (E v_j = 0, E v_j v_kᵀ = δ_jk σ² I).

  As for swa_cosine and global_cosine this is the ratio of expectations
  E[y_i · y_{i−d}] / sqrt(E|y_i|² E|y_{i−d}|²), which the mean cosine over D-dim vectors reaches
  up to O(1/D) (for Gaussian values −c(1 − c²)/(2D)). With S_n = Σ_{r=0}^{n} α^{2r}
  = (1 − α^{2(n+1)})/(1 − α²): E[y_i · y_{i−d}] = σ²D α^d S_{i−d}, E|y_i|² = σ²D S_i, so

    c(d; i) = α^d sqrt(S_{i−d}/S_i) = α^d sqrt((1 − α^{2(i−d+1)}) / (1 − α^{2(i+1)})),

  i 0-based (i + 1 tokens so far). i = None is the long prefix i → ∞: c(d) = α^d. Limits:
  α → 1 gives global_cosine(d, i) = sqrt((i − d + 1)/(i + 1)) (a uniform sum has the cosine
  of a uniform mean), used exactly at α = 1 (with i = None, 1); α = 0 gives 1 at d = 0, else 0.
  A lag with no pair, d > i, is NaN (as in analysis.recency). Broadcasts d, decay and i; float64.

  The mixer it describes: gated linear attention with a constant scalar decay,
  S_t = α S_{t−1} + k_t v_tᵀ, out_t = q_tᵀ S_t / sqrt(H) = Σ_{j≤t} α^{t−j} w_{tj} v_j with
  w_{tj} = q_t · k_j / sqrt(H). If the values are as above and independent of the q's and k's,
  E[out_i · out_{i−d}] = σ²D Σ_j α^{i−j} α^{i−d−j} E[w_{ij} w_{i−d,j}]. The law holds for out
  when E[w_{ij} w_{i−d,j}] = E[w_{ij}²] is the same constant for all i, d, j: the weight a key
  gets does not depend (in mean square) on which query reads it, e.g. a fixed read-out q_t = q
  (and for the state S_t itself under any fixed read-out). Queries that change along the
  sequence multiply c(d) by the query-weight correlation κ(d)/κ(0), κ(d) = E[w_{ij} w_{i−d,j}]
  (for k_j i.i.d. independent of q, κ(d) = E[q_iᵀ E[k kᵀ] q_{i−d}]/H; 0 for d ≥ 1 if the q_t
  are independent and zero-mean). A decay that differs across key channels (diag(α_c)) gives a
  mixture of such terms, not one α^d; a decay that varies in t gives products of decays in
  place of α^d.
  """
  d, a = _lags(d), _decays(decay)
  long_prefix = a ** d  # 0 ** 0 = 1
  if i is None:
    return long_prefix
  return long_prefix * _prefix_ratio(d, a * a, i)


def _prefix_ratio(d, r2, i):
  """sqrt(S_{i−d}/S_i) with S_n = Σ_{r=0}^{n} r2^r = (1 − r2^{n+1})/(1 − r2), r2 ∈ [0, 1]: the
  norm ratio of a sum whose terms' squared weights fall by r2 per step; NaN where d > i."""
  d, r2, i = (np.asarray(v, np.float64) for v in (d, r2, i))
  if not np.all(i >= 0):
    raise ValueError(f"i={i!r}: expected positions >= 0 (0-based), or None for a long prefix")
  with np.errstate(divide="ignore", invalid="ignore"):
    # (1 − r2^n) = −expm1(n log r2): no cancellation as r2 → 1; r2 = 0 gives log r2 = −inf → 1.
    log_r2 = np.log(r2)
    ratio = np.expm1((i - d + 1) * log_r2) / np.expm1((i + 1) * log_r2)
    ratio = np.where(r2 == 1, (i - d + 1) / (i + 1), ratio)
    return np.where(d > i, np.nan, np.sqrt(ratio))


def linear_recency_scale(decay):
  """1/(1 − α): the recency scale of a constant-decay linear mixer (for its metrics records).

  It is the total weight Σ_r α^r of the values, and the window of the SWA law with the same
  slope at small lags: 1 − α^d = (1 − α) d + O(((1 − α) d)²) against 1 − d/w (equal at d = 1,
  where α = 1 − 1/w). The e-folding lag of α^d is −1/ln α = 1/(1 − α) − 1/2 + O(1 − α).
  Broadcasts; float64; α ∈ [0, 1).
  """
  a = np.asarray(decay, np.float64)
  if not np.all((a >= 0) & (a < 1)):
    raise ValueError(f"decay={decay!r}: expected values in [0, 1) (at 1 the scale is infinite)")
  return 1.0 / (1.0 - a)


def _delta_factors(decay, beta, head_dim):
  """(α, μ, γ) as float64 arrays after checking them: μ = 1 − β/H, γ = 1 − β(2 − β)/H."""
  a, b, h = _decays(decay), np.asarray(beta, np.float64), np.asarray(head_dim, np.float64)
  if not np.all((b >= 0) & (b <= 1)):
    raise ValueError(f"beta={beta!r}: expected values in [0, 1] (the layer's sigmoid write "
                     "strength)")
  if not np.all((h >= 1) & np.isfinite(h)):
    raise ValueError(f"head_dim={head_dim!r}: expected a key dimension >= 1")
  return a, 1 - b / h, 1 - b * (2 - b) / h


def delta_effective_decay(decay, beta, head_dim):
  """ρ = α(1 − β/H): the per-step factor of the gated delta rule's recency law (`delta_cosine`),
  the decay times the mean of the erase I − β k kᵀ over random unit keys (E[k kᵀ] = I/H).
  Broadcasts; float64."""
  a, mu, _ = _delta_factors(decay, beta, head_dim)
  return a * mu


def delta_cosine(d, decay, beta, head_dim, i=None):
  """Cosine of S_i and S_{i−d} for the gated delta rule S_t = α S_{t−1} (I − β k_t k_tᵀ)
  + β v_t k_tᵀ (α = decay ∈ [0, 1], β = beta ∈ [0, 1] constant, S_{−1} = 0), with keys k_t i.i.d.
  uniform on the unit sphere of H = head_dim dimensions and values as for `linear_cosine`
  (i.i.d., zero mean, isotropic, independent of the keys).

  As for linear_cosine, the ratio of expectations E⟨S_i, S_{i−d}⟩_F / sqrt(E|S_i|² E|S_{i−d}|²)
  (the mean cosine reaches it up to O(1/D) and the keys' fluctuations). Unrolled,
  S_i = β Σ_{j≤i} α^{i−j} v_j u_{j,i}ᵀ with u_{j,i} = A_i ⋯ A_{j+1} k_j, A_t = I − β k_t k_tᵀ.
  For a vector u and a fresh key k independent of it, E[A u] = μ u with μ = 1 − β/H, and
  E|A u|² = |u|² − β(2 − β) E(k·u)² = γ |u|² with γ = 1 − β(2 − β)/H. The values' cross terms
  vanish, and u_{j,i} is u_{j,i−d} carried through d fresh keys, so
    E⟨S_i, S_{i−d}⟩ ∝ Σ_{j≤i−d} α^{2(i−d−j)+d} μ^d E|u_{j,i−d}|² = (αμ)^d Σ_{r=0}^{i−d} (α²γ)^r
  and E|S_i|² ∝ Σ_{r=0}^{i} (α²γ)^r:

    c(d; i) = ρ^d sqrt(S_{i−d}/S_i),  ρ = α(1 − β/H),  S_n = (1 − (α²γ)^{n+1})/(1 − α²γ),

  i 0-based; i = None is the long prefix, c(d) = ρ^d = linear_cosine(d, ρ). The lag is carried
  by the mean μ (what is left of an old write along its own direction), not by the mean square
  γ: γ only sets how the norms saturate and cancels for a long prefix, and since γ ≥ μ²
  (Var(A u) ≥ 0) the law is not (αγ)^d nor linear_cosine(d, α sqrt(γ), i). β multiplies every
  write, so a constant β cancels from the cosine and acts through the erase alone (a β_t that
  varies weights write j by β_j² in both sums).

  Limits: β → 0 or H → ∞ give GLA's law linear_cosine(d, α, i) (α^d); H = 1 (k = ±1, so
  A = 1 − β exactly) gives linear_cosine(d, α(1 − β), i); α = 1, β = 0 the global law; α = 0,
  or β = H = 1 (full erase), give 1 at d = 0, else 0. A lag with no pair, d > i, is NaN.
  Broadcasts d, decay, beta, head_dim and i; float64.

  The same law holds for a fixed read-out out_t = S_t q (q independent of the keys: u's law is
  rotation-invariant, so E[u uᵀ] ∝ I). Queries that change along the sequence multiply it by
  their correlation, as in linear_cosine; keys correlated along the sequence change the erase's
  mean (E[A_t u] ≠ μ u when u is aligned with recent keys); a per-channel decay (KDA,
  diag(α_c) on the key channels) gives no single ρ: the records then use the channels' mean α.
  """
  d = _lags(d)
  a, mu, gamma = _delta_factors(decay, beta, head_dim)
  long_prefix = (a * mu) ** d  # 0 ** 0 = 1
  if i is None:
    return long_prefix
  return long_prefix * _prefix_ratio(d, a * a * gamma, i)


def delta_recency_scale(decay, beta, head_dim):
  """1/(1 − ρ), ρ = α(1 − β/H) (`delta_effective_decay`): the gated delta rule's recency scale,
  linear_recency_scale(ρ): the total weight Σ ρ^r, and the window of the SWA law that agrees
  with ρ^d at d = 1, so the GLA and delta layers' records compare. Broadcasts; float64; ρ < 1.
  """
  rho = delta_effective_decay(decay, beta, head_dim)
  if not np.all(rho < 1):
    raise ValueError(f"decay={decay!r}, beta={beta!r}: expected α(1 − β/H) < 1 (α = 1 with "
                     "β = 0 never forgets: the scale is infinite)")
  return linear_recency_scale(rho)

def attention_autocorrelation(attn_TT: np.ndarray, d: int) -> dict[int, float]:
  """g(d, u) = mean over i >= d of Σ_{j − j' = u} a_{i,j} a_{i−d,j'}.

  With attention that depends on offsets only, g(d, u) = g_a(u − d), the mean attention
  autocorrelation; in general it is the exact weight of G_X(u) in G_Y(d).
  """
  a = np.asarray(attn_TT, np.float64)
  T = a.shape[0]
  g: dict[int, float] = {}
  for i in range(d, T):
    # Outer product of row i and row i−d; entry (j, j') contributes to u = j − j'.
    outer = np.outer(a[i], a[i - d])
    for u in range(-(T - 1), T):
      s = np.trace(outer, offset=-u)
      if s:
        g[u] = g.get(u, 0.0) + s
  n = T - d
  return {u: v / n for u, v in g.items()}


def cross_moment_prediction(attn_TT: np.ndarray, cross_moments: dict[int, np.ndarray],
                            A: np.ndarray, d: int) -> np.ndarray:
  """G_Y(d) = A [Σ_u g(d, u) G_X(u)] Aᵀ for y_i = A Σ_j a_{ij} x_j, with G_X(−u) = G_X(u)ᵀ.

  `cross_moments[u]` = G_X(u) for u >= 0 (stationary input); missing lags are taken as 0.
  """
  D = A.shape[1]
  total = np.zeros((D, D))
  for u, weight in attention_autocorrelation(attn_TT, d).items():
    g_x = cross_moments.get(abs(u))
    if g_x is None:
      continue
    total += weight * (g_x if u >= 0 else g_x.T)
  return A @ total @ A.T


ACTIVATIONS = {
    "relu": lambda z: np.maximum(z, 0.0),
    "gelu": lambda z: 0.5 * z * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0))),
    "silu": lambda z: z / (1.0 + np.exp(-z)),
}


def hermite_coefficients(activation: str, order: int = 40, points: int = 200) -> np.ndarray:
  """a_n = E[f(z) He_n(z)] / sqrt(n!) for z ~ N(0, 1), by Gauss–Hermite quadrature."""
  if activation not in ACTIVATIONS:
    raise ValueError(f"activation={activation!r}: expected one of {sorted(ACTIVATIONS)}")
  z, w = hermite_e.hermegauss(points)
  w = w / np.sqrt(2 * np.pi)  # Probabilists' weights integrate exp(−z²/2); make them a density.
  f = ACTIVATIONS[activation](z)
  coeffs = []
  for n in range(order + 1):
    he_n = hermite_e.hermeval(z, [0] * n + [1])
    coeffs.append(np.sum(w * f * he_n) / math.sqrt(math.factorial(n)))
  return np.array(coeffs)


def hermite_kernel(activation: str, p) -> np.ndarray:
  """k_f(p) = Σ a_n² pⁿ / Σ a_n²: the output cosine of a wide random layer x -> f(Wx) whose
  pre-activations have unit variance and correlation p.

  "swiglu" is silu(W_g x) ⊙ (W_u x) with independent W_g, W_u: k(p) = k_silu(p) · p.
  """
  p = np.asarray(p, np.float64)
  if activation == "swiglu":
    return hermite_kernel("silu", p) * p
  a2 = hermite_coefficients(activation) ** 2
  return np.polynomial.polynomial.polyval(p, a2) / a2.sum()
