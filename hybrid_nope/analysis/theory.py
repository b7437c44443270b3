"""Closed-form predictions of the recency mechanism (DESIGN.md), for tests and plots.

  swa_cosine(d, w)    = [1 − d/w]_+                     uniform SWA over uncorrelated values
  global_cosine(d, i) = sqrt((i − d + 1)/(i + 1))        uniform causal attention at position i
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
