# Tiers (pytest.ini): every test here scores a run that tests/analysis_runs.py trains end to end
# (8 steps, once per process), and one runs launch/score.py in a subprocess, so the module is
# integration, `make test-all` only.
# test-all only: a file scored in one row matches a whole forward pass
# (test_a_file_scored_in_one_row_matches_a_whole_forward_pass); rows cover each target once and
# buckets recombine (test_rows_cover_each_target_once_and_buckets_recombine); launch/score.py
# refuses a missing file in one line with exit code 2
# (test_the_command_refuses_a_missing_file_in_one_line).
"""Scoring files on a checkpoint: every token after the first scored once, against an
independent log-softmax of the model's logits; bits per byte; any length."""
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

from hybrid_nope.analysis.checkpoint import score
from hybrid_nope.run import checkpoints
from hybrid_nope.model import checkpointed
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import trained_run
from tests.helpers import REPO

TEXT = ("def recency(x):\n    return x[1:] - x[:-1]\n" * 6).encode()  # 246 bytes.


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return trained_run(tmp_path_factory)


def reference_nats(workdir, ids):
  """Σ −log p(ids[i] | ids[:i]) from one forward pass over the whole file and a float64
  log-softmax of its logits."""
  config = checkpoints.load_config(workdir)
  _, model_def, params = checkpointed.restore_params(open_readonly(workdir, config))
  inputs = np.asarray(ids[:-1])[None]
  logits = np.asarray(jax.device_get(model_def.apply(params, {
      "inputs": inputs, "positions": np.arange(inputs.shape[1])[None],
      "segment_ids": np.ones_like(inputs)})), np.float64)[0]
  shifted = logits - logits.max(-1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return -float(logp[np.arange(len(ids) - 1), ids[1:]].sum())


@pytest.mark.integration
def test_a_file_scored_in_one_row_matches_a_whole_forward_pass(run, tmp_path):
  path = tmp_path / "file.py"
  path.write_bytes(TEXT)
  result = score.score_files(open_readonly(run), [str(path)], seq_len=256, bucket_size=64)
  (r,) = result["files"]
  ids = score.tokenizer_for(checkpoints.load_config(run))(TEXT.decode())
  assert r["tokens"] == len(TEXT) == len(ids) - 1  # BOS then every byte is a target.
  np.testing.assert_allclose(r["loss"] * r["tokens"], reference_nats(run, ids), rtol=1e-5)
  assert r["bits_per_byte"] == pytest.approx(r["loss"] / math.log(2))  # Bytes = tokens.
  assert result["seq_len"] == 256 > result["training_seq_len"] == 64  # Past training length.


@pytest.mark.integration
def test_rows_cover_each_target_once_and_buckets_recombine(run, tmp_path):
  rows = score.file_rows(np.arange(131), 64)  # 130 targets: rows of 64, 64 and 2.
  assert rows["weights"].sum() == 130 and rows["weights"].shape == (3, 64)
  np.testing.assert_array_equal(rows["targets"][1, :3], [65, 66, 67])
  np.testing.assert_array_equal(rows["positions"][2, :2], [0, 1])
  path = tmp_path / "file.py"
  path.write_bytes(TEXT)
  result = score.score_files(open_readonly(run), [str(path), str(path)], bucket_size=16)
  total = result["total"]
  assert total["tokens"] == 2 * len(TEXT)
  assert total["loss"] == pytest.approx(result["files"][0]["loss"])
  losses = np.array(total["loss_by_position"], float)
  assert len(losses) == 64 // 16 and np.all(np.isfinite(losses))


@pytest.mark.integration
def test_the_command_refuses_a_missing_file_in_one_line(run, tmp_path):
  path = tmp_path / "file.py"
  path.write_bytes(TEXT)
  ok = subprocess.run([sys.executable, "launch/score.py", f"--workdir={run}", str(path),
                       str(tmp_path / "missing.txt")], cwd=REPO, capture_output=True, text=True,
                      timeout=300)
  assert ok.returncode == 2 and ok.stderr.strip().splitlines()[-1] == (
      f"score.py: {tmp_path / 'missing.txt'} is not a file to score")
