# Tiers (pytest.ini): the tests marked integration here analyse a run that tests/analysis_runs.py
# trains end to end (8 steps, once per process), or run launch/analyze.py in a subprocess, so
# they are `make test-all` only; `make test` keeps the unit checks of lags and summarize
# (context positions: tests/test_analysis_checkpoint_context_loss.py).
# test-all only: a checkpoint's analysis reproduces recency.jsonl at the training length
# (test_reproduces_recency_jsonl_at_the_training_length) and the loop's eval loss
# (test_eval_loss_matches_the_training_loop), scores twice the training length
# (test_extrapolation_scores_twice_the_training_length), gives longer profiles at a longer
# length (test_longer_length_gives_longer_profiles), names what is wrong
# (test_errors_name_what_is_wrong) and states the noise levels and the data control
# (test_summary_text_states_the_noise_levels_and_the_data_control); launch/analyze.py on an
# empty workdir ends in one line with exit code 2 (test_cli_reports_an_empty_workdir).
"""Checkpoint analysis against what the training loop recorded, at and beyond its length."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hybrid_nope.run import run_dir
from hybrid_nope.analysis.checkpoint import report
from hybrid_nope.run import checkpoints
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import analyzed_run, trained_run


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
  return analyzed_run(tmp_path_factory)


def _jsonl(path):
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


def _assert_same_records(ours, theirs):
  """Analysis records (with their longer lags, and always the data control) against the loop's."""
  ours = {(r["layer"], r["module"]): r for r in ours}
  theirs = {(r["layer"], r["module"]): r for r in theirs}
  assert len(ours) == 2 * 7 + 2  # 2 layers x 7 boundaries, the final norm, the data control
  assert set(theirs) <= set(ours) and len(theirs) >= len(ours) - 1
  for key, t in theirs.items():
    r = ours[key]
    shared = [d for d in t["lags"] if d in r["lags"]]
    assert shared == t["lags"]
    for field in ("profile", "stderr", "pairs"):
      np.testing.assert_allclose([r[field][r["lags"].index(d)] for d in shared], t[field],
                                 rtol=1e-5, atol=1e-6)
    assert r["floor"] == pytest.approx(t["floor"], abs=1e-6)
    assert r["gap"] == pytest.approx(t["gap"], abs=1e-6)
    assert r["layer_type"] == t["layer_type"]
    assert ("logit_gap" in r) == ("logit_gap" in t)
    if "logit_gap" in t:
      for field in ("logit_gap", "logit_gap_stderr", "alignment_null"):
        np.testing.assert_allclose(r[field], t[field], rtol=1e-4, atol=1e-6)
      np.testing.assert_allclose(r["alignment"], t["alignment"], rtol=1e-4, atol=1e-6)
      np.testing.assert_allclose(r["logit_profile"], t["logit_profile"], rtol=1e-4, atol=1e-6)


@pytest.mark.integration
def test_reproduces_recency_jsonl_at_the_training_length(analyzed):
  workdir, result = analyzed
  a = result["analysis"]
  assert (a["step"], a["seq_len"], a["train_seq_len"], a["far_lag"]) == (8, 64, 64, 32)
  recorded = _jsonl(os.path.join(workdir, "recency.jsonl"))
  _assert_same_records(a["records"], [r for r in recorded if r["step"] == 8])
  _assert_same_records(a["init_records"], [r for r in recorded if r["step"] == 0])
  data_control = [r for r in recorded if r["layer"] == -1]
  assert [r["step"] for r in data_control] == [0]  # written once, at init
  np.testing.assert_equal(a["summary"]["step"], report.summarize(
      [r for r in recorded if r["step"] == 8] + data_control))
  assert np.isfinite(a["summary"]["step"]["gap_stderr"])


@pytest.mark.long
@pytest.mark.integration
def test_eval_loss_matches_the_training_loop(analyzed):
  workdir, result = analyzed
  ev = result["analysis"]["eval"]
  logged = [r for r in _jsonl(os.path.join(workdir, "metrics.jsonl"))
            if "eval_loss" in r and r["step"] == 8][0]
  assert ev["loss"] == pytest.approx(logged["eval_loss"], rel=1e-5)
  assert sum(ev["weights"]) == pytest.approx(sum(logged["eval_bucket_weights"]))
  assert ev["bucket_size"] == 16 and len(ev["loss_by_position"]) == 4
  assert ev["loss_beyond"] is None and ev["ratio"] is None
  assert ev["loss_within"] == pytest.approx(ev["loss"])
  w = np.array(ev["weights"])
  losses = np.array(ev["loss_by_position"])
  assert ev["loss_near"] == pytest.approx((losses * w)[2:].sum() / w[2:].sum(), rel=1e-6)


@pytest.mark.integration
def test_extrapolation_scores_twice_the_training_length(analyzed):
  workdir, result = analyzed
  ext = result["extrapolation"]
  with open(os.path.join(result["out_dir"], run_dir.EXTRAPOLATION_FILE)) as f:
    assert json.load(f) == json.loads(json.dumps(ext))
  assert result["out_dir"] == os.path.join(workdir, "analysis", "step_8")
  one, two = ext["lengths"]
  assert (one["factor"], one["seq_len"], two["factor"], two["seq_len"]) == (1, 64, 2, 128)
  assert one["loss"] == result["analysis"]["eval"]["loss"]
  assert one["gap"] == result["analysis"]["summary"]["step"]["gap"]
  assert len(two["loss_by_position"]) == 8
  # Packed demo rows hold documents longer than 64 tokens, so some context positions are beyond.
  assert two["loss_beyond"] is not None and sum(two["weights"][4:]) > 0
  assert two["ratio"] == pytest.approx(two["loss_beyond"] / two["loss_near"])
  w = np.array(two["weights"])
  losses = np.array([0.0 if l is None else l for l in two["loss_by_position"]])
  # Buckets of 16 positions: [0, 32) is 0-1, [32, 64) is 2-3 ("near"), [64, 128) is 4-7.
  assert two["loss"] == pytest.approx((losses * w).sum() / w.sum(), rel=1e-6)
  assert two["loss_near"] == pytest.approx((losses * w)[2:4].sum() / w[2:4].sum(), rel=1e-6)
  assert two["loss_beyond"] == pytest.approx((losses * w)[4:].sum() / w[4:].sum(), rel=1e-6)
  assert two["loss_within"] == pytest.approx((losses * w)[:4].sum() / w[:4].sum(), rel=1e-6)
  assert two["gap"] is not None and two["logit_gap"] is not None


@pytest.mark.integration
def test_longer_length_gives_longer_profiles(tmp_path_factory, tmp_path):
  workdir = trained_run(tmp_path_factory)
  result = report.analyze(open_readonly(workdir), step=4, seq_len=128, lengths=(),
                          out_dir=str(tmp_path),
                          figures=False)
  a = result["analysis"]
  assert result["extrapolation"] is None
  assert (a["step"], a["seq_len"], a["train_seq_len"]) == (4, 128, 64)
  assert a["lags"] == [1, 2, 4, 8, 16, 32, 64]
  assert len(a["eval"]["loss_by_position"]) == 8
  for r in a["records"] + a["init_records"]:
    assert r["lags"] == a["lags"] and np.isfinite(r["profile"]).all()
    assert r["gap"] == pytest.approx(r["profile"][0] - r["profile"][5], abs=1e-6)  # L stays 32
  assert sorted(os.listdir(tmp_path)) == ["analysis_T128.json"]


@pytest.mark.integration
def test_errors_name_what_is_wrong(tmp_path_factory, tmp_path):
  workdir = trained_run(tmp_path_factory)
  with pytest.raises(checkpoints.StepNotFoundError, match=r"available steps: \[4, 8\]"):
    report.analyze(open_readonly(workdir), step=3, out_dir=str(tmp_path))
  with pytest.raises(checkpoints.DataPathError, match="config.eval.path=/no/such/textbooks"):
    report.analyze(open_readonly(workdir),
                   overrides={"data.source": "mds", "eval.path": "/no/such/textbooks"},
                   out_dir=str(tmp_path))
  with pytest.raises(checkpoints.DataPathError, match="config.eval.path is empty"):
    report.analyze(open_readonly(workdir), overrides={"data.source": "mds"}, out_dir=str(tmp_path))
  with pytest.raises(checkpoints.AnalysisError, match="metrics.far_lag=32 must be < the analysis "
                     "length 32"):
    report.analyze(open_readonly(workdir), seq_len=32, out_dir=str(tmp_path))
  with pytest.raises(checkpoints.AnalysisError, match="use --seq_len|pass the analysis length"):
    report.analyze(open_readonly(workdir), overrides={"data.seq_len": 128}, out_dir=str(tmp_path))
  with pytest.raises(checkpoints.WorkdirError, match="does not exist"):
    report.analyze(open_readonly(str(tmp_path / "missing")))
  assert os.listdir(tmp_path) == []


def test_analysis_lags():
  assert report.analysis_lags(64, 32, 4) == (1, 2, 4, 8, 16, 32)
  assert report.analysis_lags(256, 32, 24) == (1, 2, 4, 8, 16, 24, 32, 64, 128)
  assert report.analysis_lags(8192, 4096, 256) == tuple(2**i for i in range(13))
  assert report.analysis_lags(100, 48, None) == (1, 2, 4, 8, 16, 32, 48, 64)


def test_summarize_reads_global_inputs_only_with_noise_and_the_data_control():
  def rec(layer, kind, module, gap, se=0.05, **kw):
    return {"layer": layer, "layer_type": kind, "module": module, "gap": gap, "floor": 1 - gap,
            "lags": [1, 8, 32], "far_lag": 8, "stderr": [0.03, 0.04, 9.0], "gap_stderr": se,
            **kw}
  head = dict(logit_gap_stderr=[0.5, 1.5], alignment_null=[0.125, 0.125],
              logit_gap_null=[0.3, 0.4])
  records = [rec(0, "swa", "pre_mixer_norm", 0.9), rec(1, "global", "mixer", 0.8),
             rec(1, "global", "pre_mixer_norm", 0.2, se=0.5, logit_gap=[1.0, 3.0],
                 alignment=[0.1, 0.3], shuffled_gap=0.01, **head),
             rec(3, "global", "pre_mixer_norm", 0.4, se=1.0, logit_gap=[2.0, 6.0],
                 alignment=[0.0, 0.2], shuffled_gap=0.03, **head),
             rec(-1, "data", "tokens", 0.07),
             rec(2, "linear", "pre_mixer_norm", 0.5, mean_decay=0.9, recency_scale=10.0),
             rec(2, "linear", "mlp", 0.5, mean_decay=0.5, recency_scale=2.0),
             rec(4, "delta", "pre_mixer_norm", 0.5, mean_decay=0.7, mean_beta=0.4,
                 recency_scale=4.0)]
  s = report.summarize(records)
  # gap_stderr: the layers' paired SEs averaged; nulls: of the mean over all 4 heads,
  # sqrt(Σ σ²)/n (alignment: 0.125 / sqrt(4); logit gap: sqrt(2 (0.09 + 0.16)) / 4).
  assert s == pytest.approx({"gap": 0.3, "floor": 0.7, "gap_stderr": 0.75, "gap_matched": None,
                             "shuffled_gap": 0.02, "shuffled_floor": None, "logit_gap": 3.0,
                             "logit_gap_stderr": 1.0, "logit_gap_null": np.sqrt(0.5) / 4,
                             "alignment": 0.15, "alignment_stderr": None,
                             "alignment_null": 0.0625, "data_gap": 0.07, "mean_decay": None,
                             "mean_beta": None, "recency_scale": None,
                             "linear_mean_decay": 0.9, "linear_recency_scale": 10.0,
                             "delta_mean_decay": 0.7, "delta_mean_beta": 0.4,
                             "delta_recency_scale": 4.0})
  # One kind of recurrent layer: its gates under the plain keys (compare's columns).
  delta_only = report.summarize(records[:-3] + records[-1:])
  assert (delta_only["mean_decay"], delta_only["mean_beta"]) == (0.7, 0.4)
  assert not any(k.startswith(("linear_", "delta_")) for k in delta_only)
  assert set(report.summarize(records[:1]).values()) == {None}


@pytest.mark.integration
def test_cli_reports_an_empty_workdir(tmp_path):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, os.path.join(repo, "launch", "analyze.py"),
                         f"--workdir={tmp_path}"], capture_output=True, text=True, cwd=repo,
                        timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(
      f"analyze.py: workdir {tmp_path} is empty: expected config.json and checkpoints/")


@pytest.mark.integration
def test_summary_text_states_the_noise_levels_and_the_data_control(analyzed):
  _, result = analyzed
  a = result["analysis"]
  text = report.summary_text(result)
  now = a["summary"]["step"]
  assert f"data control P(t_i = t_i-d) gap {now['data_gap']:.4f}" in text
  assert f"a random M: ± {now['alignment_null']:.4f}" in text
  assert f"probe {a['probe']['documents']} documents in {len(a['probe']['rows'])} rows" in text
  assert a["probe_sequences"] == len(a["probe"]["rows"])  # what was measured, not the key


@pytest.mark.integration
def test_lengths_outside_recency_lengths_are_scored_for_loss_alone(analyzed, tmp_path):
  """The same losses as a full analysis at 2x, without the hook's records; a recency length that
  is not one of the lengths is refused before anything is restored."""
  workdir, full = analyzed
  result = report.analyze(open_readonly(workdir), step=8, lengths=(1, 2), recency_lengths=(1,),
                          out_dir=str(tmp_path), figures=False)
  one, two = result["extrapolation"]["lengths"]
  _, full_two = full["extrapolation"]["lengths"]
  assert "gap" in one and "gap" not in two and "logit_gap" not in two
  for key in ("loss", "loss_near", "loss_beyond", "ratio", "loss_by_position"):
    assert two[key] == full_two[key]
  assert "2x (128)" in report.summary_text(result)
  with pytest.raises(report.checkpoints.AnalysisError, match=r"recency_lengths=\[4\]"):
    report.analyze(open_readonly(workdir), step=8, lengths=(1, 2), recency_lengths=(4,),
                   out_dir=str(tmp_path))
