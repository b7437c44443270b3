# Tiers (pytest.ini): the tests marked integration here train with launch/train.py and analyse
# with launch/analyze.py in subprocesses, or take a training step at seq_len 8192, so they are
# `make test-all` only; the configs' parsing and validation and the lease script's syntax stay
# in `make test`.
# test-all only: small.py's RoPE-global controls train two steps and launch/analyze.py scores
# them at 1x and 2x the training length, their G layers recorded with cosines but no logit
# read-out (test_a_rope_global_control_trains_and_is_scored_at_twice_its_length); one step of
# configs/lag4096.py:swa4096 at its paper shape (seq_len 8192, far lag 4096, d_model 512, 8
# layers) trains and evaluates on CPU (test_lag4096_takes_a_training_step_at_the_papers_shape).
"""Configs that reach the claims: small.py's window at its far lag (swa512, nopeswa512), the
RoPE-global controls expected to fail to extrapolate (rope, <hybrid>_globalrope), and
configs/lag4096.py, the paper's far lag of 4096 on seq_len 8192 rows."""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from configs import lag4096, small
from hybrid_nope.analysis.measure import recency
from hybrid_nope.model.pattern import window_of
from hybrid_nope.train import flops
from hybrid_nope.validate import validate
from tests.helpers import REPO

LEASE_SCRIPT = os.path.join(REPO, "benchmarks", "lag4096_lease.sh")


@pytest.mark.parametrize("name, swa_pos", [("swa512", "rope"), ("nopeswa512", "nope")])
def test_a_window_equal_to_the_far_lag_validates(name, swa_pos):
  # w = 512 = metrics.far_lag < seq_len 1024: lag L is the first lag outside the window
  # (keys i - w < j <= i), where the SWA law [1 - d/w]_+ reaches 0; nothing refuses it.
  config = small.get_config(name)
  validate(config)
  assert (config.model.pattern, config.model.window, config.model.swa_pos) == ("SG", 512, swa_pos)
  assert (config.metrics.far_lag, config.data.seq_len) == (512, 1024)
  assert config.model.global_pos == "nope"
  lags = recency.default_lags(config.metrics.far_lag, window_of(config.model))
  assert lags[0] == 1 and lags[-1] == 512 and 512 in lags


@pytest.mark.parametrize("name, pattern, window, layers", [
    ("rope", "G", None, 4), ("swa64_globalrope", "SG", 64, 4),
    ("nopeswa256_globalrope", "SG", 256, 4), ("gla_globalrope", "LG", None, 4),
    ("swa64_globalrope_deep", "SG", 64, 8), ("rope_deep", "G", None, 8)])
def test_rope_global_controls_parse_and_validate(name, pattern, window, layers):
  config = small.get_config(name)
  validate(config)
  assert (config.model.pattern, config.model.num_layers) == (pattern, layers)
  assert config.model.global_pos == "rope"
  if window:
    assert config.model.window == window
    assert config.model.swa_pos == ("nope" if name.startswith("nopeswa") else "rope")
  # The control differs from its NoPE twin in the G layers' position encoding alone.
  twin = small.get_config(name.replace("rope", "nope", 1) if name.startswith("rope")
                          else name.replace("_globalrope", ""))
  assert twin.model.global_pos == "nope"
  twin.model.global_pos = "rope"
  assert config.to_dict() == twin.to_dict()


@pytest.mark.parametrize("name", ["nope_globalrope", "rope_globalrope", "globalrope",
                                  "swa64_deep_globalrope"])
def test_contradictory_or_misordered_rope_names_are_refused(name):
  with pytest.raises(ValueError, match=f"experiment={name!r}: expected"):
    small.get_config(name)


@pytest.mark.parametrize("name", lag4096.EXPERIMENTS)
def test_lag4096_experiments_validate_at_the_papers_lag(name):
  config = lag4096.get_config(name)
  validate(config)
  assert (config.data.seq_len, config.metrics.far_lag, config.data.source) == (
      8192, 4096, "stdlib")
  assert config.model.global_pos == "nope"
  expected = small.get_config(name).model
  for key in ("pattern", "swa_pos", "global_pos"):
    assert config.model[key] == expected[key], key
  if name != "nope":
    assert config.model.window == int(re.search(r"\d+", name).group())
  assert config.metrics.probe_batch_size <= config.metrics.probe_pool_rows


def test_lag4096_names_each_window_once_and_reaches_the_large_window_nope_claim():
  windows = [lag4096.get_config(n).model.window for n in lag4096.EXPERIMENTS
             if n.startswith("swa")]
  assert windows == [64, 256, 1024, 4096]
  nope_in_swa = [n for n in lag4096.EXPERIMENTS if n.startswith("nopeswa")]
  assert nope_in_swa == ["nopeswa4096"]


def test_lag4096_docstring_states_the_flops_and_seconds_the_code_gives():
  doc = lag4096.__doc__
  seconds = {n: lag4096.gpu_seconds(n) for n in lag4096.EXPERIMENTS}
  total = sum(seconds.values())
  assert 6 * 60 <= total <= 8 * 60, total  # ~8 min with the measurements and checkpoints
  assert f"six in {total:.0f} s" in doc
  for name, s in seconds.items():
    assert re.search(rf"{name} {s:.1f}( s)?[,:]", doc), (name, s)
    config = lag4096.get_config(name)
    per_token = flops.flops_per_token(config.model, config.data.seq_len)
    assert f"{name} {per_token / 1e6:.0f} M" in " ".join(doc.split()), (name, per_token)
  per_run = lag4096.STEPS * 8 * 8192
  assert f"{per_run / 1e6:.1f} M tokens" in doc


def test_the_lease_script_is_valid_bash_and_runs_the_lag4096_sweep():
  subprocess.run(["bash", "-n", LEASE_SCRIPT], check=True, timeout=30)
  with open(LEASE_SCRIPT, encoding="utf-8") as f:
    text = f.read()
  assert "--config_file=configs/lag4096.py" in text
  assert "docs/results/runs_lag4096" in text and "timeout" in text
  proc = subprocess.run(["bash", LEASE_SCRIPT], capture_output=True, text=True, timeout=30)
  assert proc.returncode != 0 and "usage: bash benchmarks/lag4096_lease.sh SEED" in proc.stderr


def run_script(*args, timeout=900):
  proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


@pytest.mark.parametrize("name", ["rope", "swa64_globalrope"])
@pytest.mark.long
@pytest.mark.integration
def test_a_rope_global_control_trains_and_is_scored_at_twice_its_length(name, tmp_path):
  workdir = str(tmp_path / name)
  run_script("launch/train.py", f"--config=configs/small.py:{name}", f"--workdir={workdir}",
             "--config.train.steps=2", "--config.train.warmup_steps=1",
             "--config.checkpoint.every_steps=2", "--config.eval.every_steps=2",
             "--config.metrics.every_steps=2")
  with open(os.path.join(workdir, "recency.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  assert {r["step"] for r in records} == {0, 2}
  glob = [r for r in records if r["layer_type"] == "global"]
  assert glob and all("gap" in r and "floor" in r for r in glob)
  assert not any("logit_gap" in r or "alignment" in r for r in records)  # RoPE: no read-out
  run_script("launch/analyze.py", f"--workdir={workdir}", "--lengths=1,2")
  with open(os.path.join(workdir, "analysis", "step_2", "extrapolation.json"),
            encoding="utf-8") as f:
    lengths = {l["factor"]: l for l in json.load(f)["lengths"]}
  assert sorted(lengths) == [1, 2] and lengths[2]["seq_len"] == 2048
  assert all(l["loss"] == l["loss"] for l in lengths.values())  # finite, not NaN
  assert lengths[2]["loss_beyond"] is not None  # scored past the training length


def test_lag4096_probe_has_pairs_at_the_far_lag_in_enough_documents():
  """The recency probe (32 of the first 128 eval rows of 8192 stdlib bytes) holds pairs at lag
  4096 in at least probe.MIN_CLUSTERS documents, so the floor f(L) has a standard error."""
  from hybrid_nope.analysis.measure import probe  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.pipeline import loader  # pylint: disable=g-import-not-at-top
  config = lag4096.get_config("swa4096")
  rows = loader.probe_pool(config)
  doc_ids_RT = probe.document_ids(rows["segment_ids"], rows["positions"])
  chosen_BT = doc_ids_RT[probe.choose_rows(doc_ids_RT, config.metrics.probe_batch_size)]
  far = config.metrics.far_lag
  query, key = chosen_BT[:, far:], chosen_BT[:, :-far]
  paired = (query == key) & (query != probe.NOT_A_DOCUMENT)
  assert len(np.unique(query[paired])) >= probe.MIN_CLUSTERS  # 28 at this commit's stdlib


@pytest.mark.long
@pytest.mark.integration
def test_lag4096_takes_a_training_step_at_the_papers_shape(tmp_path):
  """One step (and an eval) of swa4096 at seq_len 8192, far lag 4096 and its model shape, one
  row a batch; without the recency hook, whose two measurements of this shape take minutes on
  2 CPU cores (its probe: test_lag4096_probe_has_pairs_at_the_far_lag_in_enough_documents)."""
  from hybrid_nope.train import loop  # pylint: disable=g-import-not-at-top
  config = lag4096.get_config("swa4096")
  config.train.update(dict(steps=1, warmup_steps=0))
  config.data.batch_size = 1
  config.eval.update(dict(batch_size=1, num_batches=1, every_steps=1))
  config.checkpoint.every_steps = 1
  validate(config)
  assert (config.data.seq_len, config.metrics.far_lag, config.model.d_model) == (8192, 4096, 512)
  start = time.time()
  summary = loop.train(config, str(tmp_path))
  print(f"lag4096:swa4096, one step on CPU: {time.time() - start:.1f} s")
  assert summary["step"] == 1
  assert np.isfinite(summary["loss"]) and np.isfinite(summary["eval_loss"])
