"""Recency metrics against an independent float64 reference that loops over pairs, on rows that
pack several documents and end in padding."""
import numpy as np
import jax.numpy as jnp
import pytest

from hybrid_nope.analysis import recency


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
    m = s.sum() / c.sum()
    k = len(s)
    want = np.sqrt(k / (k - 1) * np.sum((s - m * c) ** 2)) / c.sum()
    assert stderr[n] == pytest.approx(want, rel=1e-5)


def test_cluster_standard_error_is_calibrated():
  """Over many independent draws, |mean − truth| / stderr behaves like a standard normal."""
  rng = np.random.default_rng(4)
  z = []
  for _ in range(300):
    n = rng.integers(5, 40, size=30)                  # 30 documents of unequal length
    effect = rng.normal(0, 0.3, size=30)              # a per-document shift: pairs correlate
    values = [rng.normal(0.5 + e, 1.0, size=k) for e, k in zip(effect, n)]
    sums = np.array([v.sum() for v in values])[None]
    mean, se, _ = recency.mean_and_stderr(sums, n[None])
    z.append((mean[0] - 0.5) / se[0])
  z = np.array(z)
  # The pair-weighted mean of 0.5 + e_c has expectation 0.5 (e_c independent of n_c).
  assert abs(z.mean()) < 3 / np.sqrt(len(z))
  assert 0.8 < z.std() < 1.25
  # A naive per-pair standard error ignores the correlation and is overconfident.
  naive = []
  for _ in range(100):
    n = rng.integers(5, 40, size=30)
    effect = rng.normal(0, 0.3, size=30)
    flat = np.concatenate([rng.normal(0.5 + e, 1.0, size=k) for e, k in zip(effect, n)])
    naive.append((flat.mean() - 0.5) / (flat.std(ddof=1) / np.sqrt(flat.size)))
  assert np.std(naive) > 1.5


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
