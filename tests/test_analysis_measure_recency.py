"""Recency metrics against an independent float64 reference that loops over pairs, on rows that
pack several documents and end in padding."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_nope.analysis.measure import probe, recency, records


def random_x(seed=0, B=3, T=40, D=6):
  rng = np.random.default_rng(seed)
  # A moving average gives the input real recency, so profiles are not flat.
  noise = rng.standard_normal((B, T + 4, D))
  return (noise[:, 4:] + noise[:, 3:-1] + noise[:, 2:-2]) + 0.5


def packed_segments(seed=0, B=3, T=40, max_docs=4):
  """Rows of 1..max_docs documents at random cut points, the last row ending in padding."""
  rng = np.random.default_rng(seed)
  seg = np.zeros((B, T), np.int32)
  for b in range(B):
    cuts = np.sort(rng.choice(np.arange(1, T), rng.integers(0, max_docs), replace=False))
    seg[b] = 1 + np.searchsorted(cuts, np.arange(T), side="right")
  seg[-1, -7:] = 0  # padding
  return seg


def counted_pairs(seg, lag, positions=None):
  """(b, i) of every pair (i, i - lag) in one document, off padding: the definition, by loops."""
  B, T = seg.shape
  query = range(T) if positions is None else positions
  return [(b, i) for b in range(B) for i in query
          if i >= lag and (seg is None or (seg[b, i] == seg[b, i - lag] != 0))]


def reference_mean(value, seg, lag, shape, positions=None):
  if seg is None:
    seg = np.ones(shape, np.int32)
  pairs = counted_pairs(seg, lag, positions)
  return np.mean([value(b, i, i - lag) for b, i in pairs]) if pairs else np.nan


def cos(a, b):
  return a @ b / np.linalg.norm(a) / np.linalg.norm(b)


def test_default_lags():
  assert recency.default_lags(16) == (1, 2, 4, 8, 16)
  assert recency.default_lags(20, window=6) == (1, 2, 4, 6, 8, 16, 20)
  assert recency.default_lags(8, window=64) == (1, 2, 4, 8)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("positions", [None, np.array([0, 5, 20, 30, 39])])
def test_cosine_profile_matches_loop_over_pairs(packed, positions):
  x = random_x()
  seg = packed_segments() if packed else None
  lags = (1, 3, 10, 25)
  got = np.asarray(recency.cosine_profile(jnp.asarray(x, jnp.float32), lags, positions,
                                          segment_ids=seg))
  want = [reference_mean(lambda b, i, j: cos(x[b, i], x[b, j]), seg, d, x.shape[:2], positions)
          for d in lags]
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_cross_document_pairs_change_the_profile():
  """The mask matters: with packed documents the masked and unmasked profiles differ."""
  x = random_x(T=64) + np.repeat(np.random.default_rng(5).standard_normal((3, 4, 6)) * 3, 16, 1)
  seg = np.repeat(np.arange(1, 5)[None], 3, 0).repeat(16, 1)  # four documents per row
  masked = np.asarray(recency.cosine_profile(jnp.asarray(x, jnp.float32), (12,),
                                             segment_ids=seg))
  unmasked = np.asarray(recency.cosine_profile(jnp.asarray(x, jnp.float32), (12,)))
  assert abs(masked[0] - unmasked[0]) > 0.1


def test_a_lag_with_no_counted_pair_is_nan_not_zero():
  x = random_x(B=2, T=20)
  seg = np.repeat(np.arange(1, 5)[None], 2, 0).repeat(5, 1)  # documents of 5 tokens
  got = np.asarray(recency.cosine_profile(jnp.asarray(x, jnp.float32), (1, 5, 12),
                                          segment_ids=seg))
  assert np.isfinite(got[0]) and np.isnan(got[1]) and np.isnan(got[2])
  logit = np.asarray(recency.logit_profile(jnp.asarray(x, jnp.float32), jnp.ones((6, 2, 3)),
                                           jnp.ones((6, 1, 3)), (1, 5), segment_ids=seg))
  assert np.all(np.isfinite(logit[:, 0])) and np.all(np.isnan(logit[:, 1]))
  all_padding = np.zeros_like(seg)
  assert np.all(np.isnan(recency.cosine_profile(jnp.asarray(x, jnp.float32), (1,),
                                                segment_ids=all_padding)))


def test_subsampled_positions_and_query_positions():
  assert list(recency.query_positions(100, 5)) == [0, 25, 50, 74, 99]
  assert recency.query_positions(100, 0) is None
  with pytest.raises(ValueError, match="no query position >= lag 30"):
    recency.cosine_profile(jnp.asarray(random_x()), (30,), positions=np.array([3, 7]))


def test_floor_and_gap():
  floor, gap = recency.floor_and_gap(np.array([0.9, 0.5, 0.2]), (1, 4, 16), far=16)
  assert floor == pytest.approx(0.2) and gap == pytest.approx(0.7)
  with pytest.raises(ValueError, match="far lag 32"):
    recency.floor_and_gap(np.array([0.9, 0.5]), (1, 4), far=32)


def weights(seed, D=6, N=4, K=2, H=3):
  rng = np.random.default_rng(seed)
  return rng.standard_normal((D, N, H)), rng.standard_normal((D, K, H))


@pytest.mark.parametrize("packed", [False, True])
def test_logit_profile_matches_loop_over_pairs_and_the_frobenius_product(packed):
  x, seg = random_x(), packed_segments() if packed else None
  wq, wk = weights(1)
  N, K, H = wq.shape[1], wk.shape[1], wq.shape[2]
  lags = (1, 2, 7, 20)
  got = np.asarray(recency.logit_profile(jnp.asarray(x, jnp.float32), jnp.asarray(wq, jnp.float32),
                                         jnp.asarray(wk, jnp.float32), lags, segment_ids=seg))
  assert got.shape == (N, len(lags))
  for h in range(N):
    m = wq[:, h] @ wk[:, h // (N // K)].T / np.sqrt(H)
    for n, d in enumerate(lags):
      want = reference_mean(lambda b, i, j: x[b, i] @ m @ x[b, j], seg, d, x.shape[:2])
      assert got[h, n] == pytest.approx(want, rel=1e-4, abs=1e-5)
      g = np.asarray(recency.cross_moment(jnp.asarray(x, jnp.float32), d, segment_ids=seg))
      assert got[h, n] == pytest.approx(np.sum(g * m), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_cross_moment_and_alignment_match_loops(packed):
  x, seg = random_x(T=50), packed_segments(T=50) if packed else None
  wq, wk = weights(2, N=2, K=2)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  shape = x.shape[:2]
  for d in (1, 30):
    pairs = counted_pairs(seg if seg is not None else np.ones(shape, np.int32), d)
    want = np.mean([np.outer(x[b, i], x[b, i - d]) for b, i in pairs], axis=0)
    np.testing.assert_allclose(recency.cross_moment(f32(x), d, segment_ids=seg), want,
                               rtol=1e-5, atol=1e-5)
  got = np.asarray(recency.alignment(f32(x), f32(wq), f32(wk), near=1, far=30, segment_ids=seg))
  delta = (np.asarray(recency.cross_moment(f32(x), 1, segment_ids=seg), np.float64)
           - np.asarray(recency.cross_moment(f32(x), 30, segment_ids=seg), np.float64))
  for h in range(2):
    m = wq[:, h] @ wk[:, h].T / np.sqrt(3)
    assert got[h] == pytest.approx(np.sum(m * delta) / np.linalg.norm(m) / np.linalg.norm(delta),
                                   rel=1e-4)
  # M aligned with ΔG by construction has the alignment of ΔG's best rank-1 approximation.
  u, s, vt = np.linalg.svd(delta)
  rank1 = u[:, :1] @ vt[:1] * s[0]
  wq1, wk1 = u[:, :1, None] * np.sqrt(s[0]), vt[:1].T[:, :, None] * np.sqrt(s[0])
  expected = np.sum(rank1 * delta) / np.linalg.norm(rank1) / np.linalg.norm(delta)
  assert float(recency.alignment(f32(x), f32(wq1), f32(wk1), near=1, far=30,
                                 segment_ids=seg)[0]) == pytest.approx(expected, rel=1e-4)


def test_token_match_profile_is_the_repetition_probability():
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, 4, (3, 40))
  seg = packed_segments()
  sums, counts = recency.match_sums(jnp.asarray(tokens), (1, 6), segment_ids=seg)
  for n, d in enumerate((1, 6)):
    want = reference_mean(lambda b, i, j: float(tokens[b, i] == tokens[b, j]), seg, d,
                          tokens.shape)
    assert float(sums[n] / counts[n]) == pytest.approx(want, rel=1e-6)
    assert int(counts[n]) == len(counted_pairs(seg, d))


def document_clusters(seg):
  """A cluster per (row, segment): rows are independent here, documents within them too."""
  return np.where(seg > 0, np.arange(seg.shape[0])[:, None] * 100 + seg, 0)


def test_per_cluster_sums_add_up_and_give_the_cluster_standard_error():
  x, seg = random_x(B=4, T=60), packed_segments(B=4, T=60)
  ids = np.unique(document_clusters(seg), return_inverse=True)[1].reshape(seg.shape)
  C = ids.max() + 1
  lags = (1, 4, 17)
  sums, counts = recency.cosine_sums(jnp.asarray(x, jnp.float32), lags, None, seg, ids, C)
  mean, stderr, pairs = recency.mean_and_stderr(sums, counts)
  np.testing.assert_allclose(mean, recency.cosine_profile(jnp.asarray(x, jnp.float32), lags,
                                                          segment_ids=seg), rtol=1e-5)
  for n, d in enumerate(lags):
    by_cluster = {}
    for b, i in counted_pairs(seg, d):
      by_cluster.setdefault(ids[b, i], []).append(cos(x[b, i], x[b, i - d]))
    assert pairs[n] == sum(len(v) for v in by_cluster.values())
    s = np.array([np.sum(v) for v in by_cluster.values()])
    c = np.array([len(v) for v in by_cluster.values()])
    m, N = s.sum() / c.sum(), c.sum()
    want = np.sqrt(np.sum((s - m * c) ** 2 / (1 - c / N))) / N  # CR2: leverage n_c / N
    assert stderr[n] == pytest.approx(want, rel=1e-5)


# ---- calibration of the cluster-robust standard errors ----------------------------------------
#
# Criterion: over R independent probes, mean(SE²) / Var(estimate) must be 1 ± CALIBRATION_TOL.
# The ratio's Monte Carlo SD is ≈ sqrt((CV²(SE²) + 2) / R) (CV²(SE²) ≈ 2/(K − 1), a χ² of K − 1
# degrees of freedom; 2 from the sample variance of a normal estimate): at R = 30000 it is
# ≈ 0.009 for K = 5 and ≈ 0.008 for K = 40 (measured ≈ 0.010 and 0.008, relative). The criterion
# refuses to judge above CALIBRATION_TOL / 8 = 0.0125, so four MC SDs are ≤ 0.05 of the ±0.10
# band: a formula whose true ratio lies in 0.95..1.05 passes, and one outside 0.85..1.15 fails,
# each with probability > 1 − 1e-4 (the K = 5 rejections below sit at 0.65, 0.79 and 1.16).
CALIBRATION_TOL = 0.10
DRAWS = 30000


def variance_ratio(se_R, estimate_R):
  """mean(SE²) / Var(estimate) over draws, and its Monte Carlo SD (delta method)."""
  a = np.asarray(se_R, np.float64) ** 2
  b = (estimate_R - np.mean(estimate_R)) ** 2
  ratio = a.mean() / b.mean()
  return ratio, ratio * np.std(a / a.mean() - b / b.mean()) / np.sqrt(len(a))


def calibrated(se_R, estimate_R) -> bool:
  ratio, mc_sd = variance_ratio(se_R, estimate_R)
  assert mc_sd / ratio < CALIBRATION_TOL / 8, "too few draws to judge calibration"
  return abs(ratio - 1) < CALIBRATION_TOL


def simulated_probes(K, far_lag=32, seed=0, tau=0.5, sigma=1.0):
  """Per-document sums [DRAWS, K] at a near and a far lag, like the hook's: documents of 5..400
  pairs (the shortest has no far pair), a per-document effect shared by both lags (pairs of a
  document correlate, and so do its two lags) plus a smaller per-lag one, and unit pair noise.
  The sum of n i.i.d. N(μ + e, σ²) pair values is exactly N(n (μ + e), n σ²), so drawing the sums
  is drawing the pairs."""
  rng = np.random.default_rng(seed)
  n_near = np.linspace(5, 400, K).round()
  n_far = np.maximum(n_near - far_lag, 0)
  shared = rng.normal(0, tau, (DRAWS, K))

  def sums(n, mean):
    effect = shared + rng.normal(0, 0.1, (DRAWS, K))
    return n * (mean + effect) + np.sqrt(n) * sigma * rng.standard_normal((DRAWS, K))

  return sums(n_near, 0.6), n_near, sums(n_far, 0.2), n_far


def se_with_k_over_k_minus_1(s, n):
  """CR1, the formula before: K/(K−1) in place of the per-document leverage."""
  m = s.sum(-1, keepdims=True) / n.sum()
  k = np.sum(n > 0)
  return np.sqrt(k / (k - 1) * np.sum((s - m * n) ** 2, -1)) / n.sum()


def se_without_small_sample_factor(s, n):
  m = s.sum(-1, keepdims=True) / n.sum()
  return np.sqrt(np.sum((s - m * n) ** 2, -1)) / n.sum()


def se_of_unweighted_document_means(s, n):
  """The naive SE of the mean of per-document means. It is the right SE for *that* mean, so it
  is judged, like every candidate, as the error bar of the record's pair-weighted mean."""
  means = s[..., n > 0] / n[n > 0]
  return means.std(-1, ddof=1) / np.sqrt(means.shape[-1])


def se_inflated(s, n):
  return 1.2 * recency.mean_and_stderr(s, n)[1]


def test_cluster_standard_error_is_calibrated_and_the_criterion_rejects_broken_formulas():
  """K = 40 documents of very unequal length: mean_and_stderr passes (measured ratio ≈ 0.98); an
  unweighted per-document SE (≈ 0.78) and SE × 1.2 (≈ 1.41) fail. Dropping K/(K−1) is a 2.5%
  change at K = 40 (≈ 0.95) and is left to the few-cluster test, where it matters."""
  s, n, _, _ = simulated_probes(K=40)
  mean, se, _ = recency.mean_and_stderr(s, n)
  assert calibrated(se, mean)
  assert not calibrated(se_of_unweighted_document_means(s, n), mean)
  assert not calibrated(se_inflated(s, n), mean)


def test_few_cluster_standard_errors_are_calibrated_and_broken_formulas_are_not():
  """K = 5 documents of 5..400 pairs: mean_and_stderr (CR2, the leverage n_c/N of each
  document; ≈ 0.95) and the paired gap SE pass; K/(K−1) (CR1, the formula before: ≈ 0.81, a large
  document's own residual shrinks), no small-sample factor (≈ 0.65), unweighted document means
  (≈ 0.79) and × 1.2 (≈ 1.16) fail."""
  s1, n1, s2, n2 = simulated_probes(K=5)
  m1, se1, _ = recency.mean_and_stderr(s1, n1)
  m2 = recency.mean_and_stderr(s2, n2)[0]
  assert calibrated(se1, m1)
  assert calibrated(recency.contrast_stderr([(1.0, s1, n1), (-1.0, s2, n2)]), m1 - m2)
  for broken in (se_with_k_over_k_minus_1, se_without_small_sample_factor,
                 se_of_unweighted_document_means, se_inflated):
    assert not calibrated(broken(s1, n1), m1), broken.__name__


@pytest.mark.parametrize("K", [5, 40])
def test_paired_gap_stderr_is_calibrated_and_the_unpaired_one_overstates(K):
  """The gap f(1) − f(L) over shared documents: positively correlated lags, so the unpaired
  hypot(SE_1, SE_L) overstates its variance many times (measured ≈ 15 at K = 5, ≈ 17 at K = 40)
  while contrast_stderr is calibrated (≈ 0.97 at K = 40; K = 5 in the few-cluster test)."""
  s1, n1, s2, n2 = simulated_probes(K=K)
  m1, se1, _ = recency.mean_and_stderr(s1, n1)
  m2, se2, _ = recency.mean_and_stderr(s2, n2)
  gap = m1 - m2
  assert variance_ratio(np.hypot(se1, se2), gap)[0] > 1 + 10 * CALIBRATION_TOL
  paired = recency.contrast_stderr([(1.0, s1, n1), (-1.0, s2, n2)])
  np.testing.assert_allclose(paired, recency.difference_stderr(s1, n1, s2, n2))
  assert calibrated(paired, gap)


# The real path: rows packing documents of 5..40 tokens, one continued into the next row (one
# cluster), padding; per-document mean vector and scale (a per-document cosine level shared by
# every lag) plus moving-average noise (recency).
PROBE_ROWS = ((14, 9, 5, 20, 16), (10, 30, 6, 18), (40, 24), (7, 22, 11), (12, 26, 9, 17))


def probe_segments(T=64):
  seg, pos = np.zeros((len(PROBE_ROWS), T), np.int32), np.zeros((len(PROBE_ROWS), T), np.int32)
  for r, lengths in enumerate(PROBE_ROWS):
    used = sum(lengths)  # the rest of the row is padding
    seg[r, :used] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
    pos[r, :used] = np.concatenate([np.arange(k) for k in lengths])
  pos[1, :PROBE_ROWS[1][0]] += PROBE_ROWS[0][-1]  # row 1 opens with row 0's last document
  return seg, pos


def test_gap_and_logit_gap_stderrs_are_calibrated_through_the_real_path():
  """cosine_sums and logit_sums with the probe's clusters, records' fields: mean(SE²)/Var of the
  gap and of each head's logit gap over 600 probes. Bounds: the ratio's MC SD at R = 600 is
  ≈ 0.055 (asserted < 0.07), and CR1 at these 17 unequal documents gives ≈ 0.92, 0.96, 0.95
  (4000 draws of this test; 600 give 0.87, 0.87, 0.92), so 0.7..1.3 is ≥ 3 MC SDs away."""
  seg, pos = probe_segments()
  clusters_BT, C = probe.clusters(probe.document_ids(seg, pos))
  assert C == 17  # 18 segments, one continued across rows
  D, lags, far, R = 8, (1, 2, 8), 8, 600
  rng = np.random.default_rng(0)
  wq, wk = (jnp.asarray(w, jnp.float32) for w in weights(8, D=D, N=2, K=1, H=4))

  def sums_of(x):
    cos, counts = recency.cosine_sums(x, lags, None, seg, clusters_BT, C)
    logit, _ = recency.logit_sums(x, wq, wk, lags, None, seg, clusters_BT, C)
    return cos, counts, logit, recency.delta_norm(x, 1, far, segment_ids=seg)

  doc = rng.standard_normal((R, C, D)) * rng.gamma(2.0, 0.6, (R, C, 1)) + 0.5
  z = rng.standard_normal((R, seg.shape[0], seg.shape[1] + 3, D))
  x = doc[:, clusters_BT] + z[:, :, 3:] + z[:, :, 2:-1] + z[:, :, 1:-2] + z[:, :, :-3]
  cos, counts, logit, delta = jax.device_get(
      jax.jit(jax.vmap(sums_of))(jnp.asarray(x, jnp.float32)))
  fields = []
  for r in range(R):
    sums = {"counts": counts[r], "0/x": cos[r], "0/logit": logit[r],
            "0/m_norms": np.asarray(recency.m_norms(wq, wk)), "0/delta_norm": delta[r]}
    fields.append({**records.boundary_fields(sums, "0/x", lags, far),
                   **records.readout_fields(sums, 0, lags, far, D)})
  column = lambda name: np.array([f[name] for f in fields])
  estimates = [(column("gap_stderr"), column("gap"))] + [
      (column("logit_gap_stderr")[:, h], column("logit_gap")[:, h]) for h in range(2)]
  for se, estimate in estimates:
    ratio, mc_sd = variance_ratio(se, estimate)
    assert mc_sd < 0.07 and 0.7 < ratio < 1.3, (ratio, mc_sd)
  # Pairing matters on this path too: the unpaired error bar is larger (measured ≈ 1.35).
  unpaired = np.hypot(column("stderr")[:, 0], column("stderr")[:, -1])
  assert variance_ratio(unpaired, column("gap"))[0] > variance_ratio(*estimates[0])[0] + 0.25


def haar(rng, batch, D):
  """Haar-random D x D rotations: QR of a Gaussian with R's diagonal made positive."""
  q, r = np.linalg.qr(rng.standard_normal((*batch, D, D)))
  return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def sd_tolerance(values, k=4.0):
  """k Monte Carlo SDs of a sample SD, relative: sqrt((kurtosis − 1) / (4 n))."""
  z = (values - values.mean(0)) / values.std(0)
  return k * np.sqrt((np.mean(z**4, 0) - 1) / (4 * len(values)))


def test_logit_gap_null_and_null_of_mean_match_haar_monte_carlo():
  """Fixed heads M_h (real W_Q, W_K of unequal scales, GQA) and a fixed anisotropic ΔG: the SD of
  ⟨U M_h Vᵀ, ΔG⟩ over Haar U, V is logit_gap_null, and the SD of the mean over 8 heads rotated
  independently is null_of_mean, for logit gaps and alignments (1/(D sqrt 8))."""
  rng = np.random.default_rng(9)
  D, N, H, S = 12, 8, 3, 3000
  wq, wk = weights(10, D=D, N=N, K=4, H=H)
  wq = wq * np.linspace(0.5, 3, N)[None, :, None]  # unequal head norms
  x = jnp.asarray(random_x(B=4, T=120, D=D) + rng.standard_normal(D) * 2, jnp.float32)
  delta = np.asarray(recency.cross_moment(x, 1), np.float64) - np.asarray(
      recency.cross_moment(x, 50), np.float64)
  norms = np.asarray(recency.m_norms(jnp.asarray(wq, jnp.float32), jnp.asarray(wk, jnp.float32)))
  m_NDD = np.einsum("dnh,enh->nde", wq, np.repeat(wk, N // 4, axis=1)) / np.sqrt(H)
  np.testing.assert_allclose(norms, np.linalg.norm(m_NDD, axis=(1, 2)), rtol=1e-5)
  null_N = recency.logit_gap_null(norms, recency.delta_norm(x, 1, 50), D)
  np.testing.assert_allclose(null_N, norms * np.linalg.norm(delta) / D, rtol=1e-5)
  gap_SN = np.einsum("snai,ab,snbj,nij->sn", haar(rng, (S, N), D), delta, haar(rng, (S, N), D),
                     m_NDD, optimize=True)
  assert np.all(np.abs(gap_SN.mean(0)) < 4 * null_N / np.sqrt(S))
  np.testing.assert_array_less(np.abs(gap_SN.std(0) / null_N - 1), sd_tolerance(gap_SN))
  for values, want in ((gap_SN.mean(1), recency.null_of_mean(null_N)),
                       ((gap_SN / (norms * np.linalg.norm(delta))).mean(1),
                        recency.null_of_mean(recency.alignment_null(D, N)))):
    assert abs(values.std() / want - 1) < sd_tolerance(values)
  assert recency.null_of_mean(recency.alignment_null(D, N)) == pytest.approx(1 / (D * np.sqrt(8)))
  # Unequal heads: the null of the mean is not the mean null over sqrt(n).
  assert recency.null_of_mean(null_N) > 1.05 * null_N.mean() / np.sqrt(N)


def test_nan_and_inf_on_padding_never_reach_a_sum():
  x = random_x(T=40)
  seg = packed_segments()
  seg[0, 10:13] = 0  # padding inside a row as well as at its end
  ids = np.unique(document_clusters(seg), return_inverse=True)[1].reshape(seg.shape)
  poisoned = x.copy()
  poisoned[seg == 0] = np.nan
  poisoned[0, 11] = np.inf
  poisoned[-1, -1, 0] = -np.inf
  clean = np.where(seg[..., None] == 0, 0.0, x)
  wq, wk = (jnp.asarray(w, jnp.float32) for w in weights(3))
  lags = (1, 3, 9)

  @jax.jit  # one compilation for both inputs
  def everything(x):
    return (recency.cosine_sums(x, lags, None, seg, ids, ids.max() + 1),
            recency.cosine_sums(x, (1,), None, seg, ids, ids.max() + 1, matched_lag=9),
            recency.logit_sums(x, wq, wk, lags, None, seg, ids, ids.max() + 1),
            recency.cross_moment(x, 3, segment_ids=seg),
            recency.delta_norm(x, 1, 9, segment_ids=seg),
            recency.cosine_profile(x, lags, segment_ids=seg))

  got = jax.tree.leaves(everything(jnp.asarray(poisoned, jnp.float32)))
  want = jax.tree.leaves(everything(jnp.asarray(clean, jnp.float32)))
  for g, w in zip(got, want):
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("positions", [None, np.arange(0, 40, 3)])
def test_matched_lag_counts_only_queries_that_have_the_far_pair(positions):
  """Pairs (i, i − d) count only where (i, i − L) also counts: the loop reference per cluster."""
  x, seg = random_x(), packed_segments()
  ids = np.unique(document_clusters(seg), return_inverse=True)[1].reshape(seg.shape)
  C, L, lags = ids.max() + 1, 12, (1, 2)
  sums, counts = recency.cosine_sums(jnp.asarray(x, jnp.float32), lags, positions, seg, ids, C,
                                     matched_lag=L)
  far_queries = set(counted_pairs(seg, L, positions))
  for n, d in enumerate(lags):
    want_s, want_c = np.zeros(C), np.zeros(C)
    for b, i in counted_pairs(seg, d, positions):
      if (b, i) in far_queries:
        want_s[ids[b, i]] += cos(x[b, i], x[b, i - d])
        want_c[ids[b, i]] += 1
    np.testing.assert_allclose(sums[n], want_s, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(counts[n], want_c)
  assert 0 < counts[0].sum() < len(counted_pairs(seg, 1, positions))  # the filter bites


def test_difference_stderr_matches_the_spread_of_the_difference():
  rng = np.random.default_rng(6)
  diffs, ses = [], []
  for _ in range(300):
    n = rng.integers(5, 40, size=(2, 25))
    effect = rng.normal(0, 0.5, size=25)  # shared by both lags: their errors correlate
    sums = np.array([[rng.normal(e + 0.2 * lag, 1.0, size=k).sum()
                      for e, k in zip(effect, n[lag])] for lag in range(2)])
    diff = sums[0].sum() / n[0].sum() - sums[1].sum() / n[1].sum()
    diffs.append(diff)
    ses.append(float(recency.difference_stderr(sums[0], n[0], sums[1], n[1])))
  assert np.mean(ses) == pytest.approx(np.std(diffs), rel=0.15)
  # Heads broadcast over the leading axis.
  two = recency.difference_stderr(np.stack([sums[0], 2 * sums[0]]), n[0],
                                  np.stack([sums[1], 2 * sums[1]]), n[1])
  assert two[1] == pytest.approx(2 * two[0])


def test_alignment_null_matches_monte_carlo_against_a_real_delta_g():
  """Random M (i.i.d. Gaussian W_Q, W_K; and the layer's own M rotated at random) against one
  fixed, anisotropic ΔG: mean 0, standard deviation 1/D."""
  rng = np.random.default_rng(7)
  D, H, samples = 24, 4, 4000
  x = random_x(B=4, T=200, D=D) + rng.standard_normal(D) * 2
  delta = (np.asarray(recency.cross_moment(jnp.asarray(x, jnp.float32), 1), np.float64)
           - np.asarray(recency.cross_moment(jnp.asarray(x, jnp.float32), 100), np.float64))
  assert np.linalg.svd(delta, compute_uv=False)[0] > 3 * np.median(
      np.linalg.svd(delta, compute_uv=False))  # anisotropic
  align = lambda m: np.sum(m * delta) / np.linalg.norm(m) / np.linalg.norm(delta)
  gaussian = [align(rng.standard_normal((D, H)) @ rng.standard_normal((D, H)).T)
              for _ in range(samples)]
  m0 = rng.standard_normal((D, H)) @ rng.standard_normal((D, H)).T + 0.5 * delta  # not random
  rotated = []
  for _ in range(samples):
    u, _ = np.linalg.qr(rng.standard_normal((D, D)))
    v, _ = np.linalg.qr(rng.standard_normal((D, D)))
    rotated.append(align(u @ m0 @ v.T))
  null = recency.alignment_null(D, 3)
  assert null.shape == (3,)
  for values in (gaussian, rotated):
    values = np.array(values)
    assert abs(values.mean()) < 4 * null[0] / np.sqrt(samples)
    # The sample std of n normal-ish draws has relative SE ≈ 1/sqrt(2n) ≈ 0.011.
    assert values.std() == pytest.approx(null[0], rel=0.05)


def parts_by_hand(a):
  """(tr A, ‖S_A‖, ‖K_A‖) in float64: A's trace, symmetric traceless and antisymmetric parts."""
  D = a.shape[-1]
  sym = (a + a.T) / 2 - np.trace(a) / D * np.eye(D)
  return np.trace(a), np.linalg.norm(sym), np.linalg.norm((a - a.T) / 2)


def test_m_parts_and_matrix_parts_match_the_explicit_split():
  """From H x H products (GQA: query head n reads kv head n // 2) as from the D x D M_h."""
  D, N, K, H = 9, 4, 2, 3
  wq, wk = weights(11, D=D, N=N, K=K, H=H)
  wk[:, 0] = wq[:, 0] + 0.3 * wk[:, 0]  # a head with a large trace
  m_NDD = np.einsum("dnh,enh->nde", wq, np.repeat(wk, N // K, axis=1)) / np.sqrt(H)
  got = np.asarray(recency.m_parts(jnp.asarray(wq, jnp.float32), jnp.asarray(wk, jnp.float32)))
  want = np.array([parts_by_hand(m) for m in m_NDD]).T
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  assert want[0, 0] > 2 * np.abs(want[0, 1:]).max()  # the trace is what head 0 has most of
  for m in m_NDD:
    np.testing.assert_allclose(recency.matrix_parts(jnp.asarray(m, jnp.float32)),
                               parts_by_hand(m), rtol=1e-5)
  # The three pieces are orthogonal: they add up to ‖M‖².
  np.testing.assert_allclose(want[0]**2 / D + want[1]**2 + want[2]**2,
                             np.linalg.norm(m_NDD, axis=(1, 2))**2, rtol=1e-10)


def trace_heavy_delta(D, seed=12):
  """ΔG = G_X(1) − G_X(40) of x_t = e_t + A e_{t−1} + μ with A = 0.8 I + a non-symmetric,
  anisotropic part: a large positive trace, symmetric and antisymmetric traceless parts."""
  rng = np.random.default_rng(seed)
  A = 0.8 * np.eye(D) + rng.standard_normal((D, D)) * np.linspace(0.1, 0.6, D) / np.sqrt(D)
  e = rng.standard_normal((4, 301, D))
  x = e[:, 1:] + e[:, :-1] @ A.T + rng.standard_normal(D)
  delta = np.asarray(recency.delta_g(jnp.asarray(x, jnp.float32), 1, 40), np.float64)
  trace, sym, antisym = parts_by_hand(delta)
  assert trace / np.sqrt(D) > 2 * sym and antisym > 0.2 * sym  # trace-heavy, not symmetric
  return delta


def test_logit_gap_null_trace_matches_conjugation_monte_carlo_and_the_trace_blind_null_fails():
  """⟨U M_h Uᵀ, ΔG⟩ over Haar U on O(D) (QR with the sign fix): mean and SD are
  logit_gap_null_trace's within Monte Carlo error, for heads that read position-blind content
  (W_K = W_Q), mixed heads and random ones. The Haar-both-sides null (mean 0, SD ‖M‖‖ΔG‖/D),
  the right mean with that SD, and one isotropic coefficient for the whole traceless part all
  fail the same check."""
  rng = np.random.default_rng(13)
  D, N, H, S = 10, 4, 4, 4000
  delta = trace_heavy_delta(D)
  wq, wk = weights(14, D=D, N=N, K=N, H=H)
  wk[:, 1] = wq[:, 1]  # M symmetric positive: content matching
  wk[:, 2] = wq[:, 2] + 0.7 * wk[:, 2]  # trace, symmetric and antisymmetric parts
  wk[:, 3] = -wq[:, 3] + 0.3 * wk[:, 3]  # a negative trace
  m_NDD = np.einsum("dnh,enh->nde", wq, wk) / np.sqrt(H)
  parts_3N = np.array([parts_by_hand(m) for m in m_NDD]).T
  mean_N, sd_N = recency.logit_gap_null_trace(*parts_3N, *parts_by_hand(delta), D)
  u_SDD = haar(rng, (S,), D)
  gap_SN = np.einsum("sai,nij,sbj,ab->sn", u_SDD, m_NDD, u_SDD, delta, optimize=True)
  tol_N = sd_tolerance(gap_SN)
  se_N = gap_SN.std(0) / np.sqrt(S)

  def passes(mean, sd):  # per head: mean within 4 MC SEs, SD within 4 MC SEs of the sample SD
    return (np.abs(gap_SN.mean(0) - mean) < 4 * se_N) & (np.abs(gap_SN.std(0) / sd - 1) < tol_N)

  assert passes(mean_N, sd_N).all(), (gap_SN.mean(0), mean_N, gap_SN.std(0), sd_N)
  haar_sd_N = recency.logit_gap_null(np.linalg.norm(m_NDD, axis=(1, 2)), np.linalg.norm(delta), D)
  assert not passes(0.0, haar_sd_N)[1:].any()  # every head with a trace
  assert not passes(mean_N, haar_sd_N)[1:].any()
  traceless = lambda a: a - np.trace(a) / D * np.eye(D)
  lumped_N = np.array([np.linalg.norm(traceless(m)) for m in m_NDD]) * np.linalg.norm(
      traceless(delta)) / np.sqrt(D**2 - 1)
  assert not passes(mean_N, lumped_N).all()
  # A head with a trace sits far from 0: the trace part is most of its null mean's scale.
  assert np.all(np.abs(mean_N[1:]) > 5 * sd_N[1:])


def test_content_matching_m_scores_its_trace_null_mean_and_far_above_the_haar_null():
  """M = c I (W_Q = W_K = a multiple of the identity, H = D) reads no position: its logit gap is
  c tr ΔG, which is the trace-preserving null's mean exactly (SD 0: U c I Uᵀ = c I), while the
  Haar-both-sides null puts it sqrt(D) tr ΔG / ‖ΔG‖ of its SDs above 0."""
  D, c = 10, 0.7
  delta = trace_heavy_delta(D)
  w = jnp.asarray(np.sqrt(c * np.sqrt(D)) * np.eye(D)[:, None], jnp.float32)  # [D, 1, H = D]
  gap = c * np.trace(delta)
  mean, sd = recency.logit_gap_null_trace(c * D, 0.0, 0.0, *parts_by_hand(delta), D)
  assert mean[()] == pytest.approx(gap, rel=1e-12) and sd[()] == 0.0
  # The hook's pieces (float32, from W_Q and W_K): the same up to rounding.
  trace_N, sym_N, antisym_N = (np.asarray(v) for v in recency.m_parts(w, w))
  mean_N, sd_N = recency.logit_gap_null_trace(trace_N, sym_N, antisym_N, *parts_by_hand(delta), D)
  haar_N = recency.logit_gap_null(np.asarray(recency.m_norms(w, w)), np.linalg.norm(delta), D)
  np.testing.assert_allclose(mean_N, gap, rtol=1e-5)
  assert sd_N[0] < 0.01 * haar_N[0]
  assert gap / haar_N[0] == pytest.approx(np.sqrt(D) * np.trace(delta) / np.linalg.norm(delta),
                                          rel=1e-5)
  assert gap / haar_N[0] > 5
