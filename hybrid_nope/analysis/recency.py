"""Recency in the residual stream and its read-out by global NoPE layers (DESIGN.md, stages 1-3).

f(d) = mean over batch and positions i >= d of cos(x_i, x_{i-d});  floor = f(L), gap = f(1) - f(L).
ℓ_h(d) = ⟨G_X(d), M_h⟩_F with G_X(d) = E[x_i x_{i-d}ᵀ] and M_h = W_Q,h W_K,hᵀ / sqrt(H), computed as
the mean of q_i · k_{i-d} / sqrt(H) so no D x D matrix is formed per lag.

Every function takes `positions`: query positions i to average over (None = all); pairs with
i < d are left out, so subsampling never changes what a lag means.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def default_lags(far_lag: int, window: int | None = None) -> tuple[int, ...]:
  """1, 2, 4, ... up to far_lag, plus far_lag itself and the window size."""
  lags = {far_lag}
  d = 1
  while d < far_lag:
    lags.add(d)
    d *= 2
  if window is not None and window < far_lag:
    lags.add(window)
  return tuple(sorted(lags))


def query_positions(seq_len: int, count: int | None) -> np.ndarray | None:
  """`count` evenly spaced positions in [0, seq_len) (deterministic), or None for all."""
  if count is None or count <= 0 or count >= seq_len:
    return None
  return np.unique(np.linspace(0, seq_len - 1, count).round().astype(np.int32))


def _pairs(x_BTD: jax.Array, y_BTD: jax.Array, lag: int, positions):
  """(x_i, y_{i-lag}) for the chosen query positions i >= lag: both [B, P, D]."""
  T = x_BTD.shape[1]
  if lag >= T:
    raise ValueError(f"lag {lag} must be < sequence length {T}")
  if positions is None:
    return x_BTD[:, lag:], y_BTD[:, :T - lag]
  i = np.asarray(positions)
  i = i[i >= lag]
  if i.size == 0:
    raise ValueError(f"no query position >= lag {lag} among positions {positions!r}")
  return x_BTD[:, i], y_BTD[:, i - lag]


def _unit(x_BTD: jax.Array) -> jax.Array:
  x = x_BTD.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True), 1e-30))


def cosine_profile(x_BTD: jax.Array, lags: Sequence[int], positions=None) -> jax.Array:
  """f(d) for each lag: [len(lags)]."""
  u_BTD = _unit(x_BTD)
  out = []
  for lag in lags:
    a, b = _pairs(u_BTD, u_BTD, lag, positions)
    out.append(jnp.mean(jnp.sum(a * b, axis=-1)))
  return jnp.stack(out)


def floor_and_gap(profile, lags: Sequence[int], *, near: int = 1, far: int) -> tuple[float, float]:
  """floor = f(far), gap = f(near) - f(far)."""
  lags = list(lags)
  for name, lag in (("near", near), ("far", far)):
    if lag not in lags:
      raise ValueError(f"{name} lag {lag} is not among the profile's lags {lags}")
  f_near, f_far = profile[lags.index(near)], profile[lags.index(far)]
  return f_far, f_near - f_far


def _queries_keys(x_BTD, wq_DNH, wk_DKH):
  x = x_BTD.astype(jnp.float32)
  q_BTNH = jnp.einsum("btd,dnh->btnh", x, wq_DNH.astype(jnp.float32))
  k_BTKH = jnp.einsum("btd,dkh->btkh", x, wk_DKH.astype(jnp.float32))
  N, K = q_BTNH.shape[2], k_BTKH.shape[2]
  k_BTNH = jnp.repeat(k_BTKH, N // K, axis=2)  # Query head n reads kv head n // (N/K).
  return q_BTNH, k_BTNH


def logit_profile(x_BTD: jax.Array, wq_DNH: jax.Array, wk_DKH: jax.Array,
                  lags: Sequence[int], positions=None) -> jax.Array:
  """ℓ_h(d) = mean q_i,h · k_{i-d},h / sqrt(H) for each head and lag: [N, len(lags)]."""
  q_BTNH, k_BTNH = _queries_keys(x_BTD, wq_DNH, wk_DKH)
  scale = q_BTNH.shape[-1] ** -0.5
  out = []
  for lag in lags:
    q, k = _pairs(q_BTNH, k_BTNH, lag, positions)
    out.append(jnp.mean(jnp.sum(q * k, axis=-1), axis=(0, 1)) * scale)
  return jnp.stack(out, axis=1)


def cross_moment(x_BTD: jax.Array, lag: int, positions=None) -> jax.Array:
  """G_X(d) = mean over pairs of x_i x_{i-d}ᵀ: [D, D]. For tests and small D."""
  a, b = _pairs(x_BTD.astype(jnp.float32), x_BTD.astype(jnp.float32), lag, positions)
  return jnp.einsum("bpd,bpe->de", a, b) / (a.shape[0] * a.shape[1])


def alignment(x_BTD: jax.Array, wq_DNH: jax.Array, wk_DKH: jax.Array, near: int = 1,
              far: int = 4096, positions=None) -> jax.Array:
  """Frobenius cosine of M_h and ΔG = G_X(near) − G_X(far), per head: [N].

  ⟨M_h, ΔG⟩ is the logit gap (no D x D work); ‖M_h‖ comes from H x H Gram matrices; ‖ΔG‖ needs
  one D x D matrix per layer, formed from the two lags only.
  """
  gap_N = jnp.diff(logit_profile(x_BTD, wq_DNH, wk_DKH, (far, near), positions), axis=1)[:, 0]
  H = wq_DNH.shape[-1]
  N, K = wq_DNH.shape[1], wk_DKH.shape[1]
  wq = wq_DNH.astype(jnp.float32)
  wk = jnp.repeat(wk_DKH.astype(jnp.float32), N // K, axis=1)
  # ‖W_q W_kᵀ‖_F² = tr((W_qᵀ W_q)(W_kᵀ W_k)), per head.
  gram_q = jnp.einsum("dnh,dng->nhg", wq, wq)
  gram_k = jnp.einsum("dnh,dng->nhg", wk, wk)
  m_norm_N = jnp.sqrt(jnp.einsum("nhg,ngh->n", gram_q, gram_k)) * H**-0.5
  delta_DD = cross_moment(x_BTD, near, positions) - cross_moment(x_BTD, far, positions)
  return gap_N / (m_norm_N * jnp.linalg.norm(delta_DD))
