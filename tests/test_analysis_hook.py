"""The in-loop hook's records against recomputation from saved activations."""
import json

import numpy as np
import pytest

from hybrid_nope.analysis.hook import RecencyHook
from hybrid_nope.data import pipeline
from hybrid_nope.model.transformer import BOUNDARIES
from hybrid_nope.train.metrics_writer import MetricsWriter
from hybrid_nope.train.state import init_model
from tests.helpers import tiny_config


def numpy_profile(x, lags):
  u = x / np.linalg.norm(x, axis=-1, keepdims=True)
  return np.array([np.mean(np.sum(u[:, d:] * u[:, :-d], -1)) for d in lags])


@pytest.mark.parametrize("query_positions", [0, 16])
def test_records_match_recomputation_from_saved_activations(tmp_path, query_positions):
  config = tiny_config(model__pattern="SG", model__num_layers=4,
                       metrics__query_positions=query_positions)
  model_def, params = init_model(config.model, seed=0)
  probe = pipeline.eval_batches(config)[0]
  writer = MetricsWriter(str(tmp_path))
  hook = RecencyHook(config, model_def, probe, writer)
  records = hook.records(3, params)

  saved = {}

  def save(layer, name, x):
    saved[(layer, name)] = np.asarray(x, np.float64)
    return x

  model = model_def.bind(params)
  batch = {k: v[:config.metrics.probe_batch_size] for k, v in probe.items()}
  model(batch["inputs"], positions_BT=batch["positions"], segment_ids_BT=batch["segment_ids"],
        observe=save)

  lags, far = hook.lags, config.metrics.far_lag
  assert lags == (1, 2, 4, 8, 16, 32)  # window 4 is already a power of two
  assert len(records) == 4 * len(BOUNDARIES)
  T = config.data.seq_len
  positions = (np.arange(T) if not query_positions
               else np.unique(np.linspace(0, T - 1, query_positions).round().astype(int)))
  for r in records:
    x = saved[(r["layer"], r["module"])]
    want = []
    for d in lags:
      i = positions[positions >= d]
      a, b = x[:, i], x[:, i - d]
      want.append(np.mean(np.sum(a * b, -1) / np.linalg.norm(a, axis=-1)
                          / np.linalg.norm(b, axis=-1)))
    np.testing.assert_allclose(r["profile"], want, rtol=1e-4, atol=1e-5)
    assert r["floor"] == pytest.approx(want[-1], abs=1e-5)
    assert r["gap"] == pytest.approx(want[0] - want[-1], abs=1e-5)
    assert r["step"] == 3 and r["layer_type"] == ("swa" if r["layer"] % 2 == 0 else "global")
    if r["layer_type"] == "global":
      attn = model.blocks[r["layer"]].attn
      wq, wk = np.asarray(attn.wq_DNH[...], np.float64), np.asarray(attn.wk_DKH[...], np.float64)
      xin = saved[(r["layer"], "pre_mixer_norm")]
      N, K, H = wq.shape[1], wk.shape[1], wq.shape[2]
      i1 = positions[positions >= 1]
      iL = positions[positions >= far]
      g1 = np.einsum("bpd,bpe->de", xin[:, i1], xin[:, i1 - 1]) / (xin.shape[0] * len(i1))
      gL = np.einsum("bpd,bpe->de", xin[:, iL], xin[:, iL - far]) / (xin.shape[0] * len(iL))
      for h in range(N):
        m = wq[:, h] @ wk[:, h // (N // K)].T / np.sqrt(H)
        assert r["logit_gap"][h] == pytest.approx(np.sum((g1 - gL) * m), rel=1e-3, abs=1e-5)
        cos = np.sum((g1 - gL) * m) / np.linalg.norm(g1 - gL) / np.linalg.norm(m)
        assert r["alignment"][h] == pytest.approx(cos, rel=1e-3, abs=1e-5)
    else:
      assert "logit_gap" not in r


def test_call_writes_jsonl_and_tensorboard(tmp_path):
  config = tiny_config()
  model_def, params = init_model(config.model, seed=0)
  writer = MetricsWriter(str(tmp_path))
  hook = RecencyHook(config, model_def, pipeline.eval_batches(config)[0], writer)
  seconds = hook(0, params)
  writer.close()
  assert seconds > 0
  lines = [json.loads(l) for l in open(tmp_path / "recency.jsonl")]
  assert len(lines) == config.model.num_layers * len(BOUNDARIES)
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_probe_larger_than_eval_batch_fails_naming_the_key():
  config = tiny_config(metrics__probe_batch_size=5)
  model_def, _ = init_model(config.model, seed=0)
  with pytest.raises(ValueError, match="metrics.probe_batch_size"):
    RecencyHook(config, model_def, pipeline.eval_batches(config)[0], writer=None)


def test_custom_lags_must_include_one_and_the_far_lag():
  config = tiny_config()
  model_def, params = init_model(config.model, seed=0)
  probe = pipeline.eval_batches(config)[0]
  with pytest.raises(ValueError, match="must include 1 and metrics.far_lag=32"):
    RecencyHook(config, model_def, probe, writer=None, lags=(2, 32))
  hook = RecencyHook(config, model_def, probe, writer=None, lags=(1, 3, 32, 48))
  assert hook.records(0, params)[0]["lags"] == [1, 3, 32, 48]
