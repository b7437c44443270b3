"""Recency in the residual stream and its read-out by global NoPE layers (DESIGN.md, stages 1-3).

f(d) = mean over counted pairs (i, i-d) of cos(x_i, x_{i-d});  floor = f(L), gap = f(1) - f(L).
ℓ_h(d) = ⟨G_X(d), M_h⟩_F with G_X(d) = E[x_i x_{i-d}ᵀ] and M_h = W_Q,h W_K,hᵀ / sqrt(H), computed as
the mean of q_i · k_{i-d} / sqrt(H) so no D x D matrix is formed per lag.

A pair (i, i-d) of row b counts only where segment_ids[b, i] == segment_ids[b, i-d] != 0: both
tokens lie in one document (attention never crosses documents) and neither is padding (segment
0). `segment_ids=None` counts every pair. Means are over counted pairs; a lag with none is NaN.

Every function takes `positions`: query positions i to average over (None = all); pairs with
i < d are left out, so subsampling never changes what a lag means.

The `*_sums` functions return per-cluster sums and counts (a cluster is a probe document), from
which `mean_and_stderr` and `difference_stderr` give means and cluster-robust standard errors on
the host: pairs of one document are correlated, documents are independent.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.data.pipeline.packing import PADDING_SEGMENT


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


def _query_index(T: int, lag: int, positions) -> np.ndarray:
  """The query positions i >= lag (static numpy indices)."""
  if lag >= T:
    raise ValueError(f"lag {lag} must be < sequence length {T}")
  if positions is None:
    return np.arange(lag, T)
  i = np.asarray(positions)
  i = i[i >= lag]
  if i.size == 0:
    raise ValueError(f"no query position >= lag {lag} among positions {positions!r}")
  return i


def pair_weights(segment_ids_BT, shape_BT: tuple[int, int], lag: int, i: np.ndarray) -> jax.Array:
  """float32 [B, P]: 1 where the pair (i, i - lag) counts, else 0."""
  if segment_ids_BT is None:
    return jnp.ones((shape_BT[0], len(i)), jnp.float32)
  seg = jnp.asarray(segment_ids_BT)
  query, key = seg[:, i], seg[:, i - lag]
  return ((query == key) & (query != PADDING_SEGMENT)).astype(jnp.float32)


def _lagged_sums(pair_value: Callable, x_BT, lags, positions, segment_ids_BT, clusters_BT,
                 num_clusters: int | None, matched_lag: int | None = None):
  """For each lag, Σ w · pair_value(x_i, x_{i-d}) and Σ w over counted pairs.

  pair_value maps [B, P, ...] slices to [B, P, E]. Without clusters: sums [L, E], counts [L];
  with `clusters_BT` (int [B, T] in [0, num_clusters); the query token's cluster is the pair's):
  sums [L, C, E], counts [L, C]. `matched_lag`: count only the queries i whose pair
  (i, i − matched_lag) also counts, so every lag averages the same queries as that one.
  Uncounted pairs are dropped with `where`, so a NaN or inf on padding never reaches a sum.
  """
  B, T = x_BT.shape[:2]
  sums, counts = [], []
  for lag in lags:
    i = _query_index(T, max(lag, matched_lag or 0), positions)
    w_BP = pair_weights(segment_ids_BT, (B, T), lag, i)
    if matched_lag is not None:
      w_BP = w_BP * pair_weights(segment_ids_BT, (B, T), matched_lag, i)
    value_BPE = pair_value(x_BT[:, i], x_BT[:, i - lag])
    v_BPE = jnp.where(w_BP[..., None] > 0, value_BPE, 0.0) * w_BP[..., None]
    if clusters_BT is None:
      sums.append(jnp.sum(v_BPE, axis=(0, 1)))
      counts.append(jnp.sum(w_BP))
    else:
      ids = jnp.asarray(clusters_BT)[:, i].ravel()
      sums.append(jax.ops.segment_sum(v_BPE.reshape(-1, v_BPE.shape[-1]), ids, num_clusters))
      counts.append(jax.ops.segment_sum(w_BP.ravel(), ids, num_clusters))
  return jnp.stack(sums), jnp.stack(counts)


def _mean(sums, counts):
  """sums / counts, NaN where nothing was counted (never a silent 0)."""
  return jnp.where(counts > 0, sums / jnp.maximum(counts, 1), jnp.nan)


def _unit(x_BTD: jax.Array) -> jax.Array:
  x = x_BTD.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True), 1e-30))


def _dot(a, b):
  return jnp.sum(a * b, axis=-1, keepdims=True)


def cosine_sums(x_BTD, lags, positions=None, segment_ids=None, clusters_BT=None,
                num_clusters=None, matched_lag=None):
  """Σ cos(x_i, x_{i-d}) and pair counts per lag (and cluster): see `_lagged_sums`."""
  sums, counts = _lagged_sums(_dot, _unit(x_BTD), lags, positions, segment_ids, clusters_BT,
                              num_clusters, matched_lag)
  return sums[..., 0], counts


def cosine_profile(x_BTD: jax.Array, lags: Sequence[int], positions=None,
                   segment_ids=None) -> jax.Array:
  """f(d) for each lag: [len(lags)]."""
  sums, counts = cosine_sums(x_BTD, lags, positions, segment_ids)
  return _mean(sums, counts)


def match_sums(tokens_BT, lags, positions=None, segment_ids=None, clusters_BT=None,
               num_clusters=None):
  """Σ [t_i == t_{i-d}] and pair counts: the data's own recency, P(t_i = t_{i-d})."""
  same = lambda a, b: (a == b).astype(jnp.float32)[..., None]
  sums, counts = _lagged_sums(same, jnp.asarray(tokens_BT), lags, positions, segment_ids,
                              clusters_BT, num_clusters)
  return sums[..., 0], counts


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


def logit_sums(x_BTD, wq_DNH, wk_DKH, lags, positions=None, segment_ids=None,
               clusters_BT=None, num_clusters=None):
  """Σ q_i,h · k_{i-d},h / sqrt(H) and pair counts: sums [L, N] or [L, C, N]."""
  q_BTNH, k_BTNH = _queries_keys(x_BTD, wq_DNH, wk_DKH)
  qk_BTNH2 = jnp.stack([q_BTNH, k_BTNH], axis=-1)  # One array, so queries and keys share a lag.
  scale = q_BTNH.shape[-1] ** -0.5
  logit = lambda a, b: jnp.sum(a[..., 0] * b[..., 1], axis=-1) * scale
  return _lagged_sums(logit, qk_BTNH2, lags, positions, segment_ids, clusters_BT, num_clusters)


def logit_profile(x_BTD: jax.Array, wq_DNH: jax.Array, wk_DKH: jax.Array,
                  lags: Sequence[int], positions=None, segment_ids=None) -> jax.Array:
  """ℓ_h(d) = mean q_i,h · k_{i-d},h / sqrt(H) for each head and lag: [N, len(lags)]."""
  sums_LN, counts_L = logit_sums(x_BTD, wq_DNH, wk_DKH, lags, positions, segment_ids)
  return _mean(sums_LN, counts_L[:, None]).T


def cross_moment(x_BTD: jax.Array, lag: int, positions=None, segment_ids=None) -> jax.Array:
  """G_X(d) = mean over counted pairs of x_i x_{i-d}ᵀ: [D, D]. For tests and small D."""
  x = x_BTD.astype(jnp.float32)
  B, T, D = x.shape
  i = _query_index(T, lag, positions)
  w_BP = pair_weights(segment_ids, (B, T), lag, i)
  counted = w_BP[..., None] > 0  # `where`, so a NaN on padding never reaches the sum.
  total = jnp.einsum("bp,bpd,bpe->de", w_BP, jnp.where(counted, x[:, i], 0.0),
                     jnp.where(counted, x[:, i - lag], 0.0))
  return _mean(total, jnp.sum(w_BP))


def m_norms(wq_DNH: jax.Array, wk_DKH: jax.Array) -> jax.Array:
  """‖M_h‖_F per head [N] from H x H Gram matrices: ‖W_q W_kᵀ‖_F² = tr((W_qᵀ W_q)(W_kᵀ W_k))."""
  H = wq_DNH.shape[-1]
  N, K = wq_DNH.shape[1], wk_DKH.shape[1]
  wq = wq_DNH.astype(jnp.float32)
  wk = jnp.repeat(wk_DKH.astype(jnp.float32), N // K, axis=1)
  gram_q = jnp.einsum("dnh,dng->nhg", wq, wq)
  gram_k = jnp.einsum("dnh,dng->nhg", wk, wk)
  return jnp.sqrt(jnp.einsum("nhg,ngh->n", gram_q, gram_k)) * H**-0.5


def delta_g(x_BTD: jax.Array, near: int, far: int, positions=None,
            segment_ids=None) -> jax.Array:
  """ΔG = G_X(near) − G_X(far): one D x D matrix [D, D], formed from the two lags only."""
  return (cross_moment(x_BTD, near, positions, segment_ids)
          - cross_moment(x_BTD, far, positions, segment_ids))


def delta_norm(x_BTD: jax.Array, near: int, far: int, positions=None,
               segment_ids=None) -> jax.Array:
  """‖ΔG‖_F with ΔG = G_X(near) − G_X(far)."""
  return jnp.linalg.norm(delta_g(x_BTD, near, far, positions, segment_ids))


def matrix_parts(m_DD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(tr A, ‖S_A‖_F, ‖K_A‖_F) of a D x D matrix A = (tr A / D) I + S_A + K_A, S_A symmetric
  traceless, K_A antisymmetric: the pieces O(D) conjugation keeps apart (`logit_gap_null_trace`)."""
  a = m_DD.astype(jnp.float32)
  trace = jnp.trace(a)
  sym = 0.5 * (a + a.T) - trace / a.shape[0] * jnp.eye(a.shape[0], dtype=a.dtype)
  return trace, jnp.linalg.norm(sym), jnp.linalg.norm(0.5 * (a - a.T))


def m_parts(wq_DNH: jax.Array, wk_DKH: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`matrix_parts` of every head's M_h = W_q W_kᵀ / sqrt(H), each [N], from H x H products only:
  tr M = Σ W_q ⊙ W_k / sqrt(H), ⟨M, Mᵀ⟩ = tr(C C) / H with C = W_kᵀ W_q, and
  ‖S‖² = (‖M‖² + ⟨M, Mᵀ⟩)/2 − (tr M)²/D, ‖K‖² = (‖M‖² − ⟨M, Mᵀ⟩)/2 (float32: a part below
  ~1e-3 ‖M‖ is rounding)."""
  D, N, H = wq_DNH.shape
  wq = wq_DNH.astype(jnp.float32)
  wk = jnp.repeat(wk_DKH.astype(jnp.float32), N // wk_DKH.shape[1], axis=1)
  trace_N = jnp.einsum("dnh,dnh->n", wq, wk) * H**-0.5
  c_NHH = jnp.einsum("dnh,dng->nhg", wk, wq)
  transposed_N = jnp.einsum("nhg,ngh->n", c_NHH, c_NHH) / H
  square_N = m_norms(wq_DNH, wk_DKH) ** 2
  sym_N = jnp.sqrt(jnp.maximum(0.5 * (square_N + transposed_N) - trace_N**2 / D, 0.0))
  return trace_N, sym_N, jnp.sqrt(jnp.maximum(0.5 * (square_N - transposed_N), 0.0))


def alignment(x_BTD: jax.Array, wq_DNH: jax.Array, wk_DKH: jax.Array, near: int = 1,
              far: int = 4096, positions=None, segment_ids=None) -> jax.Array:
  """Frobenius cosine of M_h and ΔG = G_X(near) − G_X(far), per head: [N].

  ⟨M_h, ΔG⟩ is the logit gap (no D x D work); ‖M_h‖ comes from H x H Gram matrices.
  """
  gap_N = jnp.diff(logit_profile(x_BTD, wq_DNH, wk_DKH, (far, near), positions, segment_ids),
                   axis=1)[:, 0]
  return gap_N / (m_norms(wq_DNH, wk_DKH) * delta_norm(x_BTD, near, far, positions, segment_ids))


def alignment_null(d_model: int, num_heads: int) -> np.ndarray:
  """Standard deviation of the alignment of a random M against any fixed ΔG ≠ 0, per head [N].

  For M' = U M Vᵀ with U, V independent Haar-random D x D rotations (a random M with M's shape
  and singular values, i.e. its scale), ‖M'‖ = ‖M‖ and E[U_ai U_a'i'] = δ_aa' δ_ii' / D give
  E⟨M', ΔG⟩ = 0 and E⟨M', ΔG⟩² = ‖M‖² ‖ΔG‖² / D² exactly, so the alignment has mean 0 and
  standard deviation exactly 1/D, whatever ΔG and M are. Any rotation-invariant init (i.i.d.
  Gaussian W_Q, W_K at any scale) is a mixture of such M', so the same holds for it.
  tests/test_analysis_measure_recency.py checks both by Monte Carlo against a real, anisotropic ΔG.
  """
  return np.full(num_heads, 1.0 / d_model)


def logit_gap_null(m_norms_N, delta_norm_value, d_model: int) -> np.ndarray:
  """Per head [N]: the standard deviation of the logit gap ⟨M'_h, ΔG⟩ under a random M'_h of
  M_h's Frobenius norm (Haar-rotated, M' = U M_h Vᵀ): ‖M_h‖ ‖ΔG‖ / D, by the same identity as
  `alignment_null` (its mean is 0)."""
  return np.asarray(m_norms_N, np.float64) * float(delta_norm_value) / d_model


def logit_gap_null_trace(m_traces_N, m_sym_norms_N, m_antisym_norms_N, delta_trace,
                         delta_sym_norm, delta_antisym_norm, d_model: int):
  """(mean [N], SD [N]) of the logit gap ⟨M'_h, ΔG⟩ under the trace-preserving random M'_h =
  U M_h Uᵀ, U Haar on O(D): an M'_h with M_h's spectrum, trace and symmetry, at a random
  orientation. It keeps what M reads without position (content matching: M = c I scores
  c tr ΔG, the rest of ⟨M, ΔG⟩ comes from M's orientation); `logit_gap_null` (U M Vᵀ) does not.

  Split A = (tr A / D) I + S_A + K_A (`matrix_parts`). Conjugation maps each piece to its own
  kind, and the pieces are orthogonal, so ⟨U M Uᵀ, ΔG⟩ = tr M tr ΔG / D + ⟨U S_M Uᵀ, S_ΔG⟩
  + ⟨U K_M Uᵀ, K_ΔG⟩. The symmetric traceless and the antisymmetric matrices carry inequivalent
  irreducible real representations of O(D) of real type, of dimensions d_S = (D − 1)(D + 2)/2 and
  d_K = D(D − 1)/2, so (Schur orthogonality) E⟨ρ(U) a, b⟩ = 0,
  E[⟨ρ(U) a, b⟩⟨ρ(U) a', b'⟩] = ⟨a, a'⟩⟨b, b'⟩ / d_ρ and the cross terms vanish:

    E = tr M tr ΔG / D,
    Var = 2 ‖S_M‖² ‖S_ΔG‖² / ((D − 1)(D + 2)) + 2 ‖K_M‖² ‖K_ΔG‖² / (D (D − 1)).

  O(D), not SO(D): SO(4) splits the antisymmetric piece in two, SO(2) fixes it (docs/theory.md).
  tests/test_analysis_measure_recency.py checks both moments by Monte Carlo against a
  non-symmetric ΔG with a large trace, and rejects the Haar-both-sides null there.
  """
  D = int(d_model)
  if D < 2:
    raise ValueError(f"d_model={D}: the trace-preserving null needs D >= 2")
  f = lambda v: np.asarray(v, np.float64)
  mean_N = f(m_traces_N) * float(delta_trace) / D
  var_N = (2 * f(m_sym_norms_N)**2 * float(delta_sym_norm)**2 / ((D - 1) * (D + 2))
           + 2 * f(m_antisym_norms_N)**2 * float(delta_antisym_norm)**2 / (D * (D - 1)))
  return mean_N, np.sqrt(var_N)


def null_of_mean(null_sds) -> float:
  """The null standard deviation of a mean of n statistics whose random-M nulls are independent
  with these standard deviations (heads, or heads of several layers, each rotated on its own):
  sqrt(Σ σ²) / n. For n heads of alignment null 1/D it is 1/(D sqrt(n))."""
  sds = np.asarray(null_sds, np.float64).ravel()
  return float(np.sqrt(np.sum(sds**2)) / sds.size)


# ---- host-side statistics over per-cluster sums ----------------------------------------------

def _leverage_scale(counts_C, total):
  """1/sqrt(1 − h_c) with h_c = n_c / N, the cluster's leverage in the ratio mean (CR2, Bell &
  McCaffrey 2002). For K equal clusters it is the usual sqrt(K/(K−1)); with few clusters of
  unequal size it also undoes the shrinkage of a large cluster's own residual, which
  K/(K−1) leaves (its SE ~10% low at 5 documents, tests/test_analysis_measure_recency.py)."""
  with np.errstate(invalid="ignore", divide="ignore"):
    return 1.0 / np.sqrt(np.maximum(1.0 - counts_C / total, 1e-12))


def mean_and_stderr(sums_LC, counts_LC) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per lag: mean over counted pairs, its standard error over clusters, and the pair count.

  The mean is the ratio estimator m = Σ_c s_c / Σ_c n_c; its cluster-robust standard error is
  sqrt(Σ_c (s_c − m n_c)² / (1 − n_c/N)) / N with N = Σ_c n_c, over the K clusters with pairs
  (NaN if K < 2): `_leverage_scale`.
  """
  s, n = np.asarray(sums_LC, np.float64), np.asarray(counts_LC, np.float64)
  total = n.sum(-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = np.where(total > 0, s.sum(-1) / total, np.nan)
    resid = np.where(n > 0, (s - mean[..., None] * n) * _leverage_scale(n, total[..., None]), 0.0)
    k = (n > 0).sum(-1)
    var = np.where(k >= 2, (resid**2).sum(-1), np.nan)
    stderr = np.sqrt(var) / total
  return mean, stderr, total.astype(np.int64)


def contrast_stderr(terms) -> np.ndarray:
  """Standard error over clusters of Σ_k a_k m_k, a contrast of ratio means on the same clusters.

  `terms`: (a_k, sums_C, counts_C) per mean. Cluster c's influence is
  Σ_k a_k (s_kc − m_k n_kc) / (N_k sqrt(1 − n_kc/N_k)); the clusters are independent, so the
  variance is Σ_c influence_c² over the K clusters with a pair in any term (NaN if K < 2).
  Leading axes (e.g. heads) broadcast; clusters are the last axis. Paired: what the means share
  cancels.
  """
  influence, has_pair = 0.0, False
  with np.errstate(invalid="ignore", divide="ignore"):
    for coef, sums_C, counts_C in terms:
      s, n = np.asarray(sums_C, np.float64), np.asarray(counts_C, np.float64)
      N = n.sum(-1, keepdims=True)
      m = s.sum(-1, keepdims=True) / N
      influence = influence + coef * np.where(
          n > 0, (s - m * n) * _leverage_scale(n, N), 0.0) / N
      has_pair = has_pair | (n > 0)
    k = np.sum(np.broadcast_to(has_pair, np.shape(influence)), -1)
    var = np.where(k >= 2, (influence**2).sum(-1), np.nan)
  return np.sqrt(var)


def difference_stderr(sums_a_C, counts_a_C, sums_b_C, counts_b_C) -> np.ndarray:
  """Standard error over clusters of mean_a − mean_b (two ratio means on the same clusters)."""
  return contrast_stderr([(1.0, sums_a_C, counts_a_C), (-1.0, sums_b_C, counts_b_C)])
