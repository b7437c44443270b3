"""recency.jsonl records from per-cluster sums, against independent numpy from the same sums."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_nope.analysis.measure import recency, records
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY

LAGS, FAR, C, HEADS, D = (1, 2, 4, 8), 8, 7, 3, 16
NEAR_I, FAR_I = 0, 3


def random_counts(rng):
  """Pairs per lag and cluster: fewer at longer lags; cluster 0 too short for the far lag,
  cluster 6 a one-token document with no pair at all."""
  counts = np.maximum(rng.integers(20, 60, C)[None] - np.array(LAGS)[:, None] * 3, 0)
  counts[FAR_I, 0] = 0
  counts[:, 6] = 0
  return counts.astype(np.float64)


def cosine_like(rng, counts, level=0.5):
  """Per-cluster sums with a cluster level shared by every lag (so lags correlate), and noise."""
  shared = 0.2 * rng.standard_normal(counts.shape[-1])
  return counts * (level + shared + 0.05 * rng.standard_normal(counts.shape))


def ratio(s, n):
  return s.sum() / n.sum()


def contrast_se_by_loop(terms):
  """The definition, one cluster at a time: influence_c = Σ_k a_k (s_kc − m_k n_kc) /
  (N_k sqrt(1 − n_kc/N_k)) over the clusters with a pair in any term (CR2 leverage), variance
  Σ_c influence_c²."""
  influence = []
  for c in range(len(terms[0][1])):
    if any(n[c] > 0 for _, _, n in terms):
      influence.append(sum(a * (s[c] - ratio(s, n) * n[c]) / n.sum()
                           / np.sqrt(1 - n[c] / n.sum()) for a, s, n in terms))
  return np.sqrt(np.sum(np.square(influence)))


def gap_by_hand(s, n, near=NEAR_I, far=FAR_I):
  return ratio(s[near], n[near]) - ratio(s[far], n[far])


def gap_terms_by_hand(s, n, sign=1.0, near=NEAR_I, far=FAR_I):
  return [(sign, s[near], n[near]), (-sign, s[far], n[far])]


def test_boundary_fields_match_numpy_from_the_same_sums():
  rng = np.random.default_rng(0)
  n = random_counts(rng)
  s = cosine_like(rng, n)
  matched_n = n[FAR_I]  # contiguous documents: every query with a far pair has its lag-1 pair
  shuffled = np.stack([cosine_like(rng, n[NEAR_I], 0.3), cosine_like(rng, n[FAR_I], 0.3)])
  sums = {"counts": n, "0/mlp": s, "0/mlp/matched": cosine_like(rng, matched_n, 0.7),
          "matched_counts": matched_n, "0/mlp/shuffled": shuffled}
  got = records.boundary_fields(sums, "0/mlp", LAGS, FAR)
  profile = [ratio(s[l], n[l]) for l in range(len(LAGS))]
  np.testing.assert_allclose(got["profile"], profile)
  assert got["floor"] == pytest.approx(profile[FAR_I])
  assert got["gap"] == pytest.approx(profile[NEAR_I] - profile[FAR_I])
  assert got["pairs"] == n.sum(1).astype(int).tolist()
  stderr = [contrast_se_by_loop([(1.0, s[l], n[l])]) for l in range(len(LAGS))]
  np.testing.assert_allclose(got["stderr"], stderr)
  assert got["floor_stderr"] == pytest.approx(stderr[FAR_I])
  assert got["gap_stderr"] == pytest.approx(contrast_se_by_loop(gap_terms_by_hand(s, n)))
  ms = sums["0/mlp/matched"]
  assert got["gap_matched"] == pytest.approx(ratio(ms, matched_n) - profile[FAR_I])
  assert got["gap_matched_stderr"] == pytest.approx(
      contrast_se_by_loop([(1.0, ms, matched_n), (-1.0, s[FAR_I], n[FAR_I])]))
  # The shuffled control: the same pairs (counts at lags 1 and L), its own cosine sums.
  assert got["shuffled_floor"] == pytest.approx(ratio(shuffled[1], n[FAR_I]))
  assert got["shuffled_gap"] == pytest.approx(
      ratio(shuffled[0], n[NEAR_I]) - ratio(shuffled[1], n[FAR_I]))
  shuffled_terms = [(1.0, shuffled[0], n[NEAR_I]), (-1.0, shuffled[1], n[FAR_I])]
  assert got["shuffled_gap_stderr"] == pytest.approx(contrast_se_by_loop(shuffled_terms))
  over = gap_terms_by_hand(s, n) + [(-a, x, c) for a, x, c in shuffled_terms]
  assert got["gap_over_shuffled_stderr"] == pytest.approx(contrast_se_by_loop(over))
  # Paired: the shared per-cluster level cancels, so the paired SE is below the unpaired one.
  assert got["gap_stderr"] < np.hypot(stderr[NEAR_I], stderr[FAR_I])
  # Without matched or shuffled sums (the data control) those fields are absent.
  plain = records.boundary_fields({"counts": n, "tokens": s}, "tokens", LAGS, FAR)
  assert not {"gap_matched", "shuffled_gap"} & set(plain)


def test_change_fields_are_paired_differences_of_the_two_boundaries():
  rng = np.random.default_rng(1)
  n = random_counts(rng)
  after, before = cosine_like(rng, n, 0.6), cosine_like(rng, n, 0.4)
  got = records.change_fields({"counts": n, "2/mlp": after, "2/pre_mlp_norm": before},
                              "2/mlp", "2/pre_mlp_norm", LAGS, FAR)
  assert got["compared_with"] == "pre_mlp_norm"
  assert got["gap_change"] == pytest.approx(gap_by_hand(after, n) - gap_by_hand(before, n))
  assert got["floor_change"] == pytest.approx(
      ratio(after[FAR_I], n[FAR_I]) - ratio(before[FAR_I], n[FAR_I]))
  four = [(1.0, after[NEAR_I], n[NEAR_I]), (-1.0, after[FAR_I], n[FAR_I]),
          (-1.0, before[NEAR_I], n[NEAR_I]), (1.0, before[FAR_I], n[FAR_I])]
  assert got["gap_change_stderr"] == pytest.approx(float(recency.contrast_stderr(four)))
  assert got["gap_change_stderr"] == pytest.approx(contrast_se_by_loop(four))
  assert got["floor_change_stderr"] == pytest.approx(contrast_se_by_loop(
      [(1.0, after[FAR_I], n[FAR_I]), (-1.0, before[FAR_I], n[FAR_I])]))


def readout_sums(rng, n):
  logit = np.stack([cosine_like(rng, n, level) for level in (0.1, -0.3, 2.0)], -1)  # [Λ, C, N]
  shuffled = np.stack([cosine_like(rng, n[[NEAR_I, FAR_I]], level) for level in (0.05, 0.2, 1.0)],
                      -1)  # [2, C, N]
  return {"counts": n, "1/logit": logit, "1/m_norms": np.array([0.5, 1.0, 4.0]),
          "1/delta_norm": np.float64(2.5),
          "1/m_traces": np.array([0.3, -0.8, 6.0]), "1/m_sym_norms": np.array([0.2, 0.5, 1.5]),
          "1/m_antisym_norms": np.array([0.1, 0.6, 0.0]), "1/delta_trace": np.float64(4.0),
          "1/delta_sym_norm": np.float64(0.9), "1/delta_antisym_norm": np.float64(0.4),
          "1/logit/shuffled": shuffled, "1/shuffled_delta_norm": np.float64(1.25)}


def test_readout_fields_match_numpy_from_the_same_sums():
  rng = np.random.default_rng(2)
  n = random_counts(rng)
  sums = readout_sums(rng, n)
  got = records.readout_fields(sums, 1, LAGS, FAR, D)
  logit, m, delta = sums["1/logit"], sums["1/m_norms"], 2.5
  for h in range(HEADS):
    np.testing.assert_allclose(got["logit_profile"][h],
                               [ratio(logit[l, :, h], n[l]) for l in range(len(LAGS))])
  gap = np.array([gap_by_hand(logit[..., h], n) for h in range(HEADS)])
  se = np.array([contrast_se_by_loop(gap_terms_by_hand(logit[..., h], n)) for h in range(HEADS)])
  np.testing.assert_allclose(got["logit_gap"], gap)
  np.testing.assert_allclose(got["logit_gap_stderr"], se)
  np.testing.assert_allclose(got["logit_gap_null"], m * delta / D)
  assert got["logit_gap_mean_null"] == pytest.approx(np.sqrt(np.sum((m * delta / D) ** 2)) / 3)
  np.testing.assert_allclose(got["alignment"], gap / (m * delta))
  np.testing.assert_allclose(got["alignment_stderr"], se / (m * delta))
  np.testing.assert_allclose(got["alignment_null"], [1 / D] * HEADS)
  assert got["alignment_mean_null"] == pytest.approx(1 / (D * np.sqrt(HEADS)))


def test_readout_trace_null_and_shuffled_control_match_numpy_from_the_same_sums():
  rng = np.random.default_rng(8)
  n = random_counts(rng)
  sums = readout_sums(rng, n)
  got = records.readout_fields(sums, 1, LAGS, FAR, D)
  tr, sym, anti = (sums[f"1/{k}"] for k in ("m_traces", "m_sym_norms", "m_antisym_norms"))
  mean = tr * 4.0 / D
  sd = np.sqrt(2 * sym**2 * 0.9**2 / ((D - 1) * (D + 2)) + 2 * anti**2 * 0.4**2 / (D * (D - 1)))
  np.testing.assert_allclose(got["logit_gap_null_trace_mean"], mean)
  np.testing.assert_allclose(got["logit_gap_null_trace"], sd)
  np.testing.assert_allclose(got["logit_gap_null_trace_z"],
                             (np.array(got["logit_gap"]) - mean) / sd)
  logit, sh, two = sums["1/logit"], sums["1/logit/shuffled"], n[[NEAR_I, FAR_I]]
  for h in range(HEADS):
    want = gap_by_hand(sh[..., h], two, 0, 1)
    assert got["shuffled_logit_gap"][h] == pytest.approx(want)
    assert got["shuffled_alignment"][h] == pytest.approx(want / (sums["1/m_norms"][h] * 1.25))
    shuffled_terms = gap_terms_by_hand(sh[..., h], two, near=0, far=1)
    assert got["shuffled_logit_gap_stderr"][h] == pytest.approx(
        contrast_se_by_loop(shuffled_terms))
    assert got["shuffled_alignment_stderr"][h] == pytest.approx(
        got["shuffled_logit_gap_stderr"][h] / (sums["1/m_norms"][h] * 1.25))
    # Paired: the model's gap and its control share documents.
    paired = contrast_se_by_loop(gap_terms_by_hand(logit[..., h], n)
                                 + gap_terms_by_hand(sh[..., h], two, -1.0, 0, 1))
    assert got["logit_gap_over_shuffled_stderr"][h] == pytest.approx(paired)
  # M = c I reads no position: its gap is the trace null's mean, its SD 0, its z undefined.
  content = {**sums, "1/m_sym_norms": np.zeros(3), "1/m_antisym_norms": np.zeros(3)}
  content_fields = records.readout_fields(content, 1, LAGS, FAR, D)
  assert np.all(np.isnan(content_fields["logit_gap_null_trace_z"]))
  assert content_fields["logit_gap_null_trace"] == [0.0] * HEADS
  # Sums written before these pieces existed still give the other fields.
  old = {k: sums[k] for k in ("counts", "1/logit", "1/m_norms", "1/delta_norm")}
  assert set(records.readout_fields(old, 1, LAGS, FAR, D)) == set(got) - {
      "logit_gap_null_trace", "logit_gap_null_trace_mean", "logit_gap_null_trace_z",
      "shuffled_logit_gap", "shuffled_logit_gap_stderr", "logit_gap_over_shuffled_stderr",
      "shuffled_alignment", "shuffled_alignment_stderr"}


def test_readout_alignment_from_real_sums_is_recency_alignment():
  """Sums as the hook forms them (logit_sums, m_norms, delta_norm) give recency.alignment."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((2, 40, 6)).cumsum(1) * 0.3 + 1.0, jnp.float32)
  seg = np.repeat([[1] * 25 + [2] * 12 + [0] * 3], 2, 0)
  ids = np.where(seg > 0, np.arange(2)[:, None] * 2 + seg - 1, 0)
  wq, wk = (jnp.asarray(rng.standard_normal(shape), jnp.float32)
            for shape in ((6, 2, 3), (6, 1, 3)))

  @jax.jit  # one compilation, not op-by-op dispatch
  def measure(x, wq, wk):
    logit, counts = recency.logit_sums(x, wq, wk, LAGS, None, seg, ids, 4)
    sums = {"counts": counts, "0/logit": logit, "0/m_norms": recency.m_norms(wq, wk),
            "0/delta_norm": recency.delta_norm(x, 1, FAR, segment_ids=seg)}
    return sums, recency.alignment(x, wq, wk, 1, FAR, segment_ids=seg)

  sums, want = jax.device_get(measure(x, wq, wk))
  got = records.readout_fields(sums, 0, LAGS, FAR, 6)["alignment"]
  np.testing.assert_allclose(got, want, rtol=1e-4)


def full_sums(rng, kinds, readout_layers, linear_layers):
  n = random_counts(rng)
  sums = {"counts": n, "tokens": cosine_like(rng, n, 0.1), "matched_counts": n[FAR_I]}
  for layer in range(len(kinds)):
    for module in BOUNDARIES + ((FINAL_BOUNDARY,) if layer == len(kinds) - 1 else ()):
      key = f"{layer}/{module}"
      sums[key] = cosine_like(rng, n)
      sums[f"{key}/matched"] = cosine_like(rng, n[FAR_I], 0.6)
      sums[f"{key}/shuffled"] = np.stack([cosine_like(rng, n[i], 0.3) for i in (NEAR_I, FAR_I)])
  for layer in readout_layers:
    sums.update({k.replace("1/", f"{layer}/"): v for k, v in readout_sums(rng, n).items()
                 if k != "counts"})
  for layer in linear_layers:
    sums[f"{layer}/decay"] = np.float64(0.9)
  return sums


@pytest.mark.parametrize("data_control", [True, False])
def test_build_gives_one_record_per_layer_and_boundary(data_control):
  kinds, types = ("S", "G", "L"), ["swa", "global", "linear"]
  sums = full_sums(np.random.default_rng(4), kinds, {1}, {2})
  got = records.build(7, sums, kinds=kinds, layer_types=types, boundaries=BOUNDARIES,
                      final_boundary=FINAL_BOUNDARY, lags=LAGS, far=FAR, d_model=D,
                      readout_layers={1}, linear_layers={2}, data_control=data_control)
  want = [(layer, m) for layer in range(3) for m in BOUNDARIES] + [(2, FINAL_BOUNDARY)]
  if data_control:
    want.insert(0, (records.DATA_LAYER, records.DATA_MODULE))
    assert got[0]["layer_type"] == records.DATA_LAYER_TYPE
    assert got[0]["gap"] == pytest.approx(gap_by_hand(sums["tokens"], sums["counts"]))
  assert [(r["layer"], r["module"]) for r in got] == want
  assert all(r["step"] == 7 for r in got)
  for r in got:
    if r["layer"] == records.DATA_LAYER:
      continue
    assert r["layer_type"] == types[r["layer"]]
    assert r.get("compared_with") == records.COMPARED_WITH.get(r["module"])
    assert ("logit_gap" in r) == (r["layer"] == 1) and ("mean_decay" in r) == (r["layer"] == 2)
    assert ("shuffled_logit_gap" in r) == ("logit_gap_null_trace" in r) == (r["layer"] == 1)
    key = f"{r['layer']}/{r['module']}"
    assert r["gap"] == pytest.approx(gap_by_hand(sums[key], sums["counts"]))
    if "compared_with" in r:
      before = sums[f"{r['layer']}/{r['compared_with']}"]
      assert r["gap_change"] == pytest.approx(
          r["gap"] - gap_by_hand(before, sums["counts"]))
  assert got[-1]["mean_decay"] == 0.9 and got[-1]["recency_scale"] == pytest.approx(10.0)


def test_encode_decode_sums_round_trip_and_give_the_same_records():
  kinds = ("S", "G")
  sums = full_sums(np.random.default_rng(5), kinds, {1}, set())
  decoded, lags, far = records.decode_sums(records.encode_sums(sums, LAGS, FAR))
  assert lags == LAGS and far == FAR and set(decoded) == set(sums)
  for key, value in sums.items():
    exact = np.float64 if key.endswith(("delta_norm",) + records.DELTA_PARTS) else np.float32
    np.testing.assert_array_equal(decoded[key], np.asarray(value, exact))
  build = lambda s: records.build(0, s, kinds=kinds, layer_types=["swa", "global"],
                                  boundaries=BOUNDARIES, final_boundary=FINAL_BOUNDARY,
                                  lags=lags, far=far, d_model=D, readout_layers={1},
                                  linear_layers=set(), data_control=True)
  for a, b in zip(build(sums), build(decoded)):
    assert a.keys() == b.keys()
    for k in ("gap", "gap_stderr", "gap_change", "logit_gap", "alignment",
              "logit_gap_null_trace", "shuffled_logit_gap", "shuffled_alignment"):
      if k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)
