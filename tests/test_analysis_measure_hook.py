# Tiers (pytest.ini): test_a_paper_config_writes_every_field runs configs/swa256_350m.py's shapes
# at seq_len 8192 (a paper-config shape), and the GLA and delta-rule mixer tests compile a hook
# and a model of their own (~16 s each cold on 2 cores), so they are integration, `make test-all`
# only.
# test-all only: at a paper config's seq_len and far lag every record carries every field,
# finite, with pairs that never cross padding, and the global layer's nulls at its d_model
# (test_a_paper_config_writes_every_field; `make test` checks tiny configs' records against
# loops over pairs and that their fields are documented); GLA layers are local mixers with their
# mean decay (test_gated_linear_attention_layers_are_local_mixers_with_their_mean_decay); delta
# rule layers with their mean decay, beta and recency scale
# (test_delta_rule_layers_are_local_mixers_with_their_mean_decay_beta_and_recency_scale).
"""The in-loop hook's records against recomputation from saved activations, by loops over pairs
inside documents (float64)."""
import json
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_nope.analysis.measure import hook as hook_lib
from hybrid_nope.analysis.measure import probe as probe_lib
from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.analysis.measure.records import COMPARED_WITH
from hybrid_nope.data.pipeline import loader
from hybrid_nope.errors import ConfigError
from hybrid_nope.model.delta import DeltaAttention
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY
from hybrid_nope.train.hooks import RunContext
from hybrid_nope.run.metrics_writer import MetricsWriter
from hybrid_nope.model.definition import init_model
from hybrid_nope.run.run_dir import RECENCY_PROBE
from tests.helpers import REPO, tiny_config


def reference(values_fn, seg, docs, lags, positions):
  """Per lag: mean over counted pairs, cluster standard error over documents (a document split
  across rows is one cluster), and
  the pair count."""
  out = []
  for d in lags:
    by_doc = {}
    for b in range(seg.shape[0]):
      for i in positions[positions >= d]:
        if seg[b, i] == seg[b, i - d] != 0:
          by_doc.setdefault(docs[b, i], []).append(values_fn(b, i, i - d))
    s = np.array([np.sum(v) for v in by_doc.values()])
    n = np.array([len(v) for v in by_doc.values()])
    m = s.sum() / n.sum() if n.sum() else np.nan
    k = len(s)
    # Cluster-robust with each document's leverage n_c / N (CR2).
    se = (np.sqrt(np.sum((s - m * n) ** 2 / (1 - n / n.sum()))) / n.sum() if k >= 2
          else np.nan)
    out.append((m, se, int(n.sum())))
  return [np.array(v) for v in zip(*out)]


@pytest.fixture(scope="module")
def measured():
  # 192 rows of 64 tokens span the first three eval files (6189, 3400, 19014 bytes): only the
  # rows that hold a boundary cover more than one.
  config = tiny_config(model__pattern="SG", model__num_layers=4, eval__batch_size=8,
                       eval__num_batches=24, metrics__probe_batch_size=4,
                       metrics__query_positions=16)
  model_def, params = init_model(config.model, seed=0)
  batches = loader.eval_batches(config)
  hook = RecencyHook(config, model_def, batches, writer=None)
  return config, model_def, params, batches, hook, hook.records(0, params)


def test_probe_rows_are_chosen_over_the_whole_eval_set(measured):
  config, _, _, batches, hook, _ = measured
  rows = {k: np.concatenate([b[k] for b in batches]) for k in ("segment_ids", "positions")}
  doc_ids = probe_lib.document_ids(rows["segment_ids"], rows["positions"])
  np.testing.assert_array_equal(hook.rows, probe_lib.choose_rows(doc_ids, 4))
  assert hook.num_docs > len(np.unique(doc_ids[:4][doc_ids[:4] >= 0]))
  np.testing.assert_array_equal(hook.probe["segment_ids"], rows["segment_ids"][hook.rows])


def test_records_match_loops_over_document_pairs(measured):
  config, model_def, params, _, hook, records = measured
  saved = {}

  def save(layer, name, x):
    saved[(layer, name)] = np.asarray(x, np.float64)
    return x

  model = model_def.bind(params)
  p = hook.probe
  model(p["inputs"], positions_BT=p["positions"], segment_ids_BT=p["segment_ids"], observe=save)
  shuffled, saved = saved, {}
  model(p["shuffled_inputs"], positions_BT=p["positions"], segment_ids_BT=p["segment_ids"],
        observe=save)
  shuffled, saved = saved, shuffled
  by_key = {(r["layer"], r["module"]): r for r in records}
  seg, docs, tokens = np.asarray(p["segment_ids"]), hook.doc_ids_BT, np.asarray(p["inputs"])
  lags, far = hook.lags, config.metrics.far_lag
  T = config.data.seq_len
  positions = np.unique(np.linspace(0, T - 1, 16).round().astype(int))

  expected_modules = [("data", "tokens")] + [
      (kind, name) for layer, kind in enumerate(["swa", "global"] * 2)
      for name in BOUNDARIES + ((FINAL_BOUNDARY,) if layer == 3 else ())]
  assert [(r["layer_type"], r["module"]) for r in records] == expected_modules

  data = records[0]
  assert data["layer"] == -1
  mean, se, pairs = reference(lambda b, i, j: float(tokens[b, i] == tokens[b, j]), seg, docs,
                              lags, positions)
  np.testing.assert_allclose(data["profile"], mean, rtol=1e-6)
  np.testing.assert_allclose(data["stderr"], se, rtol=1e-5)
  assert data["pairs"] == pairs.tolist()

  embed = np.asarray(model.embed(p["inputs"]), np.float64)
  np.testing.assert_allclose(saved[(0, "input")], embed, rtol=1e-6)
  for r in records[1:]:
    x = saved[(r["layer"], r["module"])]
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    mean, se, pairs = reference(lambda b, i, j: u[b, i] @ u[b, j], seg, docs, lags, positions)
    np.testing.assert_allclose(r["profile"], mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r["stderr"], se, rtol=1e-3, atol=1e-6)
    assert r["pairs"] == pairs.tolist()
    assert r["floor"] == pytest.approx(mean[-1], abs=1e-5)
    assert r["gap"] == pytest.approx(mean[0] - mean[-1], abs=1e-5)
    # Matched queries: f(1) over the queries whose far pair also counts.
    matched = [u[b, i] @ u[b, i - 1] for b in range(seg.shape[0])
               for i in positions[positions >= far]
               if seg[b, i] == seg[b, i - 1] == seg[b, i - far] != 0]
    assert r["gap_matched"] == pytest.approx(np.mean(matched) - mean[-1], abs=1e-5)
    # The shuffled-token control: the same model on the probe shuffled within documents.
    xs = shuffled[(r["layer"], r["module"])]
    us = xs / np.linalg.norm(xs, axis=-1, keepdims=True)
    sh, _, _ = reference(lambda b, i, j: us[b, i] @ us[b, j], seg, docs, (1, far), positions)
    assert r["shuffled_gap"] == pytest.approx(sh[0] - sh[1], abs=1e-5)
    assert r["shuffled_floor"] == pytest.approx(sh[1], abs=1e-5)
    if "compared_with" in r:
      before = by_key[(r["layer"], r["compared_with"])]
      assert r["gap_change"] == pytest.approx(r["gap"] - before["gap"], abs=1e-6)
      assert r["floor_change"] == pytest.approx(r["floor"] - before["floor"], abs=1e-6)
    if r["layer_type"] != "global":
      assert "logit_gap" not in r
      continue
    attn = model.blocks[r["layer"]].attn
    wq, wk = np.asarray(attn.wq_DNH[...], np.float64), np.asarray(attn.wk_DKH[...], np.float64)
    xin = saved[(r["layer"], "pre_mixer_norm")]
    N, K, H = wq.shape[1], wk.shape[1], wq.shape[2]
    near, far_i = lags.index(1), lags.index(far)
    for h in range(N):
      m = wq[:, h] @ wk[:, h // (N // K)].T / np.sqrt(H)
      logit, _, _ = reference(lambda b, i, j: xin[b, i] @ m @ xin[b, j], seg, docs, lags,
                              positions)
      np.testing.assert_allclose(r["logit_profile"][h], logit, rtol=1e-3, atol=1e-5)
      assert r["logit_gap"][h] == pytest.approx(logit[near] - logit[far_i], rel=1e-3, abs=1e-5)
      # The gap's standard error: per-document influence of the two ratio means.
      infl = {}
      for idx, (d, sign) in enumerate(((1, 1.0), (far, -1.0))):
        pairs_d = [(b, i) for b in range(seg.shape[0]) for i in positions[positions >= d]
                   if seg[b, i] == seg[b, i - d] != 0]
        mean_d = np.mean([xin[b, i] @ m @ xin[b, i - d] for b, i in pairs_d])
        per_doc = {}
        for b, i in pairs_d:
          per_doc.setdefault(docs[b, i], []).append(xin[b, i] @ m @ xin[b, i - d] - mean_d)
        for doc, resid in per_doc.items():  # CR2: each document's leverage in this lag's mean
          infl[doc] = infl.get(doc, 0.0) + sign * np.sum(resid) / len(pairs_d) / np.sqrt(
              1 - len(resid) / len(pairs_d))
      want_se = np.sqrt(np.sum(np.square(list(infl.values()))))
      assert r["logit_gap_stderr"][h] == pytest.approx(want_se, rel=1e-3)
    assert r["alignment_null"] == [1 / config.model.d_model] * N
    assert r["alignment_mean_null"] == pytest.approx(1 / (config.model.d_model * np.sqrt(N)))
    if r["module"] == "pre_mixer_norm":  # the read-out fields are the layer's, on every module
      check_readout_controls(r, wq, wk, xin, shuffled[(r["layer"], "pre_mixer_norm")], seg, docs,
                             far, positions)


def cross_moment_by_loop(x, seg, d, positions):
  pairs = [(b, i) for b in range(seg.shape[0]) for i in positions[positions >= d]
           if seg[b, i] == seg[b, i - d] != 0]
  return np.mean([np.outer(x[b, i], x[b, i - d]) for b, i in pairs], axis=0)


def check_readout_controls(r, wq, wk, xin, xin_shuffled, seg, docs, far, positions):
  """The trace-preserving null from each head's D x D M and ΔG split by hand, and the
  shuffled-token read-out control by loops over the shuffled probe's pairs."""
  N, K, H = wq.shape[1], wk.shape[1], wq.shape[2]
  D = wq.shape[0]
  delta = cross_moment_by_loop(xin, seg, 1, positions) - cross_moment_by_loop(xin, seg, far,
                                                                              positions)
  delta_sh = (cross_moment_by_loop(xin_shuffled, seg, 1, positions)
              - cross_moment_by_loop(xin_shuffled, seg, far, positions))
  assert np.linalg.norm(delta_sh - delta) > 0.05 * np.linalg.norm(delta)  # the shuffle bites
  split = lambda a: ((a + a.T) / 2 - np.trace(a) / D * np.eye(D), (a - a.T) / 2)
  s_g, k_g = split(delta)
  for h in range(N):
    m = wq[:, h] @ wk[:, h // (N // K)].T / np.sqrt(H)
    s_m, k_m = split(m)
    mean = np.trace(m) * np.trace(delta) / D
    sd = np.sqrt(2 * np.sum(s_m**2) * np.sum(s_g**2) / ((D - 1) * (D + 2))
                 + 2 * np.sum(k_m**2) * np.sum(k_g**2) / (D * (D - 1)))
    assert r["logit_gap_null_trace_mean"][h] == pytest.approx(mean, rel=1e-3, abs=1e-6)
    assert r["logit_gap_null_trace"][h] == pytest.approx(sd, rel=1e-3)
    assert r["logit_gap_null_trace_z"][h] == pytest.approx(
        (r["logit_gap"][h] - r["logit_gap_null_trace_mean"][h]) / r["logit_gap_null_trace"][h])
    logit, _, _ = reference(lambda b, i, j: xin_shuffled[b, i] @ m @ xin_shuffled[b, j], seg,
                            docs, (1, far), positions)
    assert r["shuffled_logit_gap"][h] == pytest.approx(logit[0] - logit[1], rel=1e-3, abs=1e-5)
    assert r["shuffled_alignment"][h] == pytest.approx(
        np.sum(m * delta_sh) / np.linalg.norm(m) / np.linalg.norm(delta_sh), rel=1e-3, abs=1e-5)
    assert r["shuffled_logit_gap_stderr"][h] > 0 and r["logit_gap_over_shuffled_stderr"][h] > 0


def constant_document_rows(num_rows, seq_len, seed=0):
  """Rows of two documents each (from position 0), every document one token repeated."""
  rng = np.random.default_rng(seed)
  cut = seq_len * 3 // 4
  seg = np.where(np.arange(seq_len) < cut, 1, 2)[None].repeat(num_rows, 0).astype(np.int32)
  tokens = rng.integers(1, 200, (num_rows, 2))[np.arange(num_rows)[:, None], seg - 1]
  positions = np.where(seg == 1, np.arange(seq_len), np.arange(seq_len) - cut)
  return [{"inputs": tokens.astype(np.int32), "targets": tokens.astype(np.int32),
           "segment_ids": seg, "positions": positions.astype(np.int32),
           "weights": np.ones_like(seg, np.float32)}]


def test_shuffled_read_out_control_is_the_read_out_when_shuffling_changes_nothing():
  """Documents of one repeated token: shuffling within documents leaves the probe as it is, so
  the shuffled-token control must equal the model's own read-out (same pairs, same lags), while
  the stream still carries position (RoPE in the SWA layers), so the gap is not trivially 0. The
  read-out controls sit on global NoPE records only, and are documented."""
  config = tiny_config(model__pattern="SG", metrics__probe_batch_size=4)
  model_def, params = init_model(config.model, seed=0)
  hook = RecencyHook(config, model_def, constant_document_rows(4, config.data.seq_len),
                     writer=None)
  np.testing.assert_array_equal(hook.probe["shuffled_inputs"], hook.probe["inputs"])
  records = hook.records(0, params)
  readout = {"shuffled_logit_gap", "shuffled_logit_gap_stderr", "logit_gap_over_shuffled_stderr",
             "shuffled_alignment", "shuffled_alignment_stderr", "logit_gap_null_trace",
             "logit_gap_null_trace_mean", "logit_gap_null_trace_z"}
  for r in records:
    assert (readout <= set(r)) == (r["layer_type"] == "global"), (r["layer"], r["module"])
    assert not (readout & set(r)) or r["layer_type"] == "global"
  assert_documented(records)
  glob = [r for r in records if r["layer_type"] == "global"]
  assert len(glob) == len(BOUNDARIES) + 1  # the last layer also has final_norm
  for r in glob:
    np.testing.assert_allclose(r["shuffled_logit_gap"], r["logit_gap"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(r["shuffled_alignment"], r["alignment"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(r["shuffled_logit_gap_stderr"], r["logit_gap_stderr"], rtol=1e-6)
    assert r["shuffled_gap"] == pytest.approx(r["gap"], rel=1e-6, abs=1e-9)
  assert np.min(np.abs(glob[0]["logit_gap"])) > 1e-4  # not 0 = 0


def test_for_run_writes_the_probe_once_and_call_writes_records(tmp_path):
  config = tiny_config()
  model_def, params = init_model(config.model, seed=0)
  writer = MetricsWriter(str(tmp_path))
  run = RunContext(config=config, model_def=model_def, eval_batches=loader.eval_batches(config),
                   probe_rows=loader.probe_pool(config),
                   writer=writer, replicate=lambda tree: tree)
  hook = RecencyHook.for_run(run)
  hook(0, params)
  hook(4, params)
  writer.close()
  described = json.loads((tmp_path / RECENCY_PROBE).read_text())
  assert described["rows"] == hook.rows.tolist() and described["documents"] == hook.num_docs
  assert described["tokens"] == int(np.sum(np.asarray(hook.probe["segment_ids"]) != 0))
  lines = [json.loads(l) for l in open(tmp_path / "recency.jsonl")]
  per_step = config.model.num_layers * len(BOUNDARIES) + 1
  assert len(lines) == 1 + 2 * per_step  # the data control only at step 0
  assert described["pairs"] == lines[0]["pairs"]
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  (tmp_path / RECENCY_PROBE).write_text("kept")
  RecencyHook.for_run(run)
  assert (tmp_path / RECENCY_PROBE).read_text() == "kept"


def test_a_runs_probe_of_one_document_is_refused_before_anything_is_written(tmp_path):
  """Issue 50, item 5: a probe too small for its standard errors (one document: NaN) is refused
  for a run, naming its rows and documents; the pool's size is no longer the rule."""
  config = tiny_config()
  model_def, _ = init_model(config.model, seed=0)
  one_document = loader.eval_batches(config)  # 4 rows of 64 bytes of the first eval file.
  writer = MetricsWriter(str(tmp_path))
  run = RunContext(config=config, model_def=model_def, eval_batches=one_document,
                   probe_rows=one_document, writer=writer, replicate=lambda tree: tree)
  with pytest.raises(ConfigError, match="the recency probe's 2 eval rows .* hold 1 document"):
    RecencyHook.for_run(run)
  writer.close()
  assert not (tmp_path / RECENCY_PROBE).exists()


def test_a_probe_larger_than_the_eval_set_measures_all_of_it_and_says_so(caplog):
  """metrics.probe_batch_size is the most rows the probe measures (issue 50, item 5)."""
  config = tiny_config(metrics__probe_batch_size=5)
  model_def, _ = init_model(config.model, seed=0)
  eval_rows = sum(len(b["inputs"]) for b in loader.eval_batches(config))
  assert eval_rows < 5
  with caplog.at_level("INFO"):
    hook = RecencyHook(config, model_def, loader.eval_batches(config), writer=None)
  assert list(hook.rows) == list(range(eval_rows))
  assert f"recency probe: measures all {eval_rows} eval rows (metrics.probe_batch_size=5 is " \
         "the most it measures)" in caplog.messages


def test_custom_lags_must_include_one_and_the_far_lag():
  config = tiny_config()
  model_def, params = init_model(config.model, seed=0)
  batches = loader.eval_batches(config)
  with pytest.raises(ValueError, match="must include 1 and metrics.far_lag=32"):
    RecencyHook(config, model_def, batches, writer=None, lags=(2, 32))
  hook = RecencyHook(config, model_def, batches, writer=None, lags=(1, 3, 32, 48))
  assert hook.records(0, params)[0]["lags"] == [1, 3, 32, 48]


def assert_documented(records):
  """Every key a record carries is named, in backticks, in docs/analysis.md (the fields' one
  definition, which the paper-config and mixer tests below hold the hook to)."""
  with open(os.path.join(REPO, "docs", "analysis.md")) as f:
    named = set(re.findall(r"`([a-z_]+)`", f.read()))
  missing = sorted({k for r in records for k in r} - named)
  assert not missing, f"recency.jsonl fields not defined in docs/analysis.md: {missing}"


def chapter_rows(num_rows, seq_len, vocab, seed=0):
  """TextbookChapters-shaped eval rows: one chapter per row from position 0, padded."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(seq_len // 4, seq_len + 1, num_rows)
  live = np.arange(seq_len)[None] < lengths[:, None]
  tokens = np.where(live, rng.integers(0, vocab, (num_rows, seq_len)), 0).astype(np.int32)
  return [{"inputs": tokens, "targets": tokens, "segment_ids": live.astype(np.int32),
           "positions": np.where(live, np.arange(seq_len), 0).astype(np.int32),
           "weights": live.astype(np.float32)}]


@pytest.mark.long
@pytest.mark.integration
def test_a_paper_config_writes_every_field():
  """configs/swa256_350m.py's shapes at its seq_len 8192 and far lag 4096, its d_model and
  heads (two layers, a small vocabulary and MLP and two probe rows, for CPU time and memory), on
  padded chapter rows."""
  from configs import swa256_350m
  config = swa256_350m.get_config()
  config.model.update(num_layers=2, vocab_size=512, mlp_dim=256)
  config.metrics.probe_batch_size = 2
  model_def, params = init_model(config.model, seed=0)
  batches = chapter_rows(4, config.data.seq_len, 512)
  # The tests' optimisation level 0 suits milliseconds-long programs; this one runs two
  # forwards over 16k tokens (31 s at level 0, 21 s at 2).
  hook = RecencyHook(config, model_def, batches, writer=None,
                     compiler_options={"xla_backend_optimization_level": 2})
  records = hook.records(0, params)
  assert hook.num_docs == 2 and records[0]["layer_type"] == "data"
  pad_free = int(np.sum(hook.probe["segment_ids"]))
  assert hook.describe()["tokens"] == pad_free
  fields = {"step", "layer", "layer_type", "module", "lags", "far_lag", "profile", "floor", "gap",
            "pairs", "stderr", "floor_stderr", "gap_stderr"}
  # The model's boundaries also carry the matched-query gap and the shuffled-token control,
  # and each module its effect on the stream it receives (docs/analysis.md).
  controls = {"gap_matched", "gap_matched_stderr", "shuffled_gap", "shuffled_floor",
              "shuffled_gap_stderr", "gap_over_shuffled_stderr"}
  effect = {"compared_with", "gap_change", "gap_change_stderr", "floor_change",
            "floor_change_stderr"}
  readout = {"logit_profile", "logit_gap", "logit_gap_stderr", "logit_gap_null",
             "logit_gap_mean_null", "alignment", "alignment_stderr", "alignment_null",
             "alignment_mean_null"}
  for r in records:
    assert fields <= set(r) and r["far_lag"] == 4096
    assert (controls <= set(r)) == (r["layer_type"] != "data")
    assert (effect <= set(r)) == (r["module"] in COMPARED_WITH), r["module"]
    assert (readout <= set(r)) == (r["layer_type"] == "global")
    present = [k for k in (fields | controls | effect | readout) - {"compared_with", "module",
                                                                    "layer_type"} if k in r]
    assert all(np.all(np.isfinite(r[k])) for k in present), r["module"]
    # Padding never pairs: at lag d at most (live tokens - d) pairs per row.
    assert all(p <= pad_free - 2 * d for p, d in zip(r["pairs"], r["lags"]))
    assert np.isfinite(r["gap"])
  assert_documented(records)
  glob = [r for r in records if r["layer_type"] == "global"][0]
  assert glob["alignment_null"] == [1 / 1024] * 16
  assert glob["alignment_mean_null"] == pytest.approx(1 / (1024 * np.sqrt(16)))
  assert np.all(np.asarray(glob["logit_gap_null"]) > 0)
  assert np.all(np.isfinite(glob["logit_gap_stderr"]))


def records_and_first_mixer(config):
  """The hook's layered records at init, and layer 0's mixer with the input it reads on the
  probe (pre_mixer_norm) and the probe's real-token mask, from the model run here."""
  model_def, params = init_model(config.model, seed=0)
  batches = loader.eval_batches(config)
  hook = RecencyHook(config, model_def, batches, writer=None)
  records = [r for r in hook.records(0, params) if r["layer"] >= 0]
  rows = {k: np.concatenate([b[k] for b in batches])[hook.rows] for k in ("inputs", "segment_ids",
                                                                          "positions")}
  model = model_def.bind(params)
  seen = {}
  model(jnp.asarray(rows["inputs"]), positions_BT=jnp.asarray(rows["positions"]),
        segment_ids_BT=jnp.asarray(rows["segment_ids"]),
        observe=lambda layer, name, x: seen.setdefault((layer, name), x))
  return records, model.blocks[0].attn, seen[(0, "pre_mixer_norm")], rows["segment_ids"] != 0


@pytest.mark.integration
def test_gated_linear_attention_layers_are_local_mixers_with_their_mean_decay():
  config = tiny_config(model__pattern="LG", metrics__probe_batch_size=4)
  records, mixer, x, real = records_and_first_mixer(config)
  linear = [r for r in records if r["layer_type"] == "linear"]
  assert {r["layer"] for r in linear} == {0}
  assert {r["layer_type"] for r in records if r["layer"] == 1} == {"global"}
  # The gate's α over the probe's real tokens, computed here straight from the layer.
  alpha = np.exp(np.asarray(mixer.log_decay(x)))
  want = alpha.mean(axis=(2, 3))[real].mean()
  for r in linear:
    assert r["mean_decay"] == pytest.approx(want, rel=1e-5)
    assert r["recency_scale"] == pytest.approx(1 / (1 - want), rel=1e-5)
  assert not any("mean_decay" in r for r in records if r["layer_type"] != "linear")
  assert_documented(records)
  assert any("logit_gap" in r for r in records if r["layer"] == 1)


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_gate_means_average_heads_and_channels_over_real_tokens(gate):
  """The hook's reduction of a D layer's α ([B, T, K] per head, [B, T, K, H] per channel) and β
  ([B, T, K]): the mean over real tokens of the per-token mean over heads (and channels),
  against a float64 loop over tokens; padding (segment 0) does not count."""
  layer = DeltaAttention(d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, norm_eps=1e-6,
                         gate=gate, impl="xla", dtype=jnp.float32, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  x_BTD = jnp.asarray(rng.standard_normal((3, 10, 32)), jnp.float32)
  seg_BT = np.array([[1] * 10, [1] * 4 + [2] * 3 + [0] * 3, [0] * 10])
  for values in (jnp.exp(layer.log_decay(x_BTD)), layer.beta(x_BTD)):
    v = np.asarray(values, np.float64)
    tokens = [v[b, t].mean() for b in range(3) for t in range(10) if seg_BT[b, t] != 0]
    got = float(hook_lib._token_mean(values, jnp.asarray(seg_BT)))
    assert got == pytest.approx(np.mean(tokens), rel=1e-6)


@pytest.mark.integration
def test_delta_rule_layers_are_local_mixers_with_their_mean_decay_beta_and_recency_scale():
  """D layers (per-head gate, Gated DeltaNet): layer_type "delta" with the gate's mean α and the
  mean β over the probe's real tokens and heads, computed here from the layer, and the recency
  scale 1/(1 − α(1 − β/H)) of analysis.theory.delta_cosine. (The per-channel gate's reduction:
  `test_gate_means_average_heads_and_channels_over_real_tokens`.)"""
  config = tiny_config(model__pattern="DG", metrics__probe_batch_size=4)
  records, mixer, x, real = records_and_first_mixer(config)
  delta = [r for r in records if r["layer_type"] == "delta"]
  assert {r["layer"] for r in delta} == {0} and len(delta) == len(BOUNDARIES)
  assert_documented(records)
  alpha = np.exp(np.asarray(mixer.log_decay(x), np.float64))
  beta = np.asarray(mixer.beta(x), np.float64)
  assert alpha.ndim == 3 and beta.ndim == 3
  want_alpha = alpha.mean(-1)[real].mean()
  want_beta = beta.mean(-1)[real].mean()
  H = config.model.head_dim
  for r in delta:
    assert r["mean_decay"] == pytest.approx(want_alpha, rel=1e-5)
    assert r["mean_beta"] == pytest.approx(want_beta, rel=1e-5)
    assert r["recency_scale"] == pytest.approx(1 / (1 - want_alpha * (1 - want_beta / H)),
                                               rel=1e-4)
  assert 0.2 < want_beta < 0.8  # sigmoid of zero-mean logits: β ≈ 1/2, far from the GLA limit
  assert not any("mean_beta" in r or "mean_decay" in r for r in records if r["layer"] == 1)
  assert any("logit_gap" in r for r in records if r["layer"] == 1)

@pytest.mark.parametrize("figures", [True, False])
def test_each_measurement_draws_the_figures_unless_switched_off(tmp_path, figures):
  config = tiny_config(metrics__figures=figures)
  model_def, params = init_model(config.model, seed=0)
  writer = MetricsWriter(str(tmp_path))
  drawn = []
  writer.write_images = lambda step, images: drawn.append((step, sorted(images)))
  run = RunContext(config=config, model_def=model_def, eval_batches=loader.eval_batches(config),
                   probe_rows=loader.probe_pool(config),
                   writer=writer, replicate=lambda tree: tree)
  RecencyHook.for_run(run)(4, params)
  writer.close()
  assert drawn == ([(4, ["recency/floor_heatmap", "recency/gap_heatmap",
                         "recency/global_input_profiles", "recency/logit_profiles"])]
                   if figures else [])
