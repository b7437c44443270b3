"""Restoring a run for analysis, and the errors for unusable workdirs, steps and configs."""

import jax
import numpy as np
import pytest

from hybrid_nope.analysis import checkpoints
from hybrid_nope.model.definition import init_model
from tests.analysis_runs import trained_run
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return trained_run(tmp_path_factory)


def test_missing_and_empty_workdir(tmp_path):
  with pytest.raises(checkpoints.WorkdirError, match=f"workdir {tmp_path}/nope does not exist"):
    checkpoints.load_config(str(tmp_path / "nope"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(checkpoints.WorkdirError, match=f"workdir {empty} is empty"):
    checkpoints.load_config(str(empty))
  (empty / "metrics.jsonl").write_text("")
  with pytest.raises(checkpoints.WorkdirError, match=f"{empty}/config.json does not exist"):
    checkpoints.load_config(str(empty))


def test_no_checkpoints(tmp_path):
  (tmp_path / "config.json").write_text(tiny_config().to_json_best_effort())
  config = checkpoints.load_config(str(tmp_path))
  with pytest.raises(checkpoints.WorkdirError, match=f"no checkpoints in {tmp_path}/checkpoints"):
    checkpoints.restore_params(str(tmp_path), config)
  assert not (tmp_path / "checkpoints").exists()  # Analysis never creates directories there.


def test_config_round_trips_through_json(run):
  config = checkpoints.load_config(run)
  assert config.model.to_dict() == tiny_config().model.to_dict()
  assert config.data.seq_len == 64 and config.metrics.far_lag == 32


def test_missing_step_lists_available(run):
  config = checkpoints.load_config(run)
  assert checkpoints.available_steps(run, config) == [4, 8]
  with pytest.raises(checkpoints.StepNotFoundError,
                     match=r"step 5 has no checkpoint in .*checkpoints; available steps: \[4, 8\]"):
    checkpoints.restore_params(run, config, step=5)


def test_restore_latest_and_given_step(run):
  config = checkpoints.load_config(run)
  step, model_def, params = checkpoints.restore_params(run, config)
  step4, _, params4 = checkpoints.restore_params(run, config, step=4)
  assert (step, step4) == (8, 4)
  _, init = init_model(config.model, config.train.seed)
  assert jax.tree.structure(params) == jax.tree.structure(init)
  for a, b, c in zip(jax.tree.leaves(params), jax.tree.leaves(params4), jax.tree.leaves(init)):
    assert a.shape == c.shape and a.dtype == c.dtype
    assert a.sharding.device_set == {jax.devices()[0]}
  # Training moved the weights, and step 8 is not step 4.
  wq = lambda p: np.asarray(p["blocks"][1]["attn"]["wq_DNH"])
  assert not np.allclose(wq(params), wq(init)) and not np.allclose(wq(params), wq(params4))
  assert model_def.bind(params).blocks[1].attn.wq_DNH[...].shape == (32, 4, 8)


def test_incompatible_config_names_the_parameter(run):
  config = checkpoints.apply_overrides(checkpoints.load_config(run), {"model.d_model": 48})
  with pytest.raises(checkpoints.IncompatibleCheckpointError) as e:
    checkpoints.restore_params(run, config, step=8)
  message = str(e.value)
  assert "checkpoints/8" in message
  assert "params/blocks/0/attn/wk_DKH has shape (32, 2, 8) in the checkpoint but (48, 2, 8)" \
      in message

  deeper = checkpoints.apply_overrides(checkpoints.load_config(run), {"model.num_layers": 4})
  with pytest.raises(checkpoints.IncompatibleCheckpointError,
                     match=r"checkpoint lacks: \['blocks/2/attn/wk_DKH'"):
    checkpoints.restore_params(run, deeper)


def test_apply_overrides_copies_and_names_unknown_keys(run):
  config = checkpoints.load_config(run)
  changed = checkpoints.apply_overrides(config, {"eval.path": "/x", "metrics.far_lag": 16})
  assert changed.eval.path == "/x" and changed.metrics.far_lag == 16
  assert config.eval.path == "" and config.metrics.far_lag == 32
  with pytest.raises(checkpoints.AnalysisError, match="no key eval.pth"):
    checkpoints.apply_overrides(config, {"eval.pth": "/x"})
  with pytest.raises(checkpoints.AnalysisError, match="no section evl"):
    checkpoints.apply_overrides(config, {"evl.path": "/x"})


def test_invalid_config_json(tmp_path):
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(checkpoints.WorkdirError, match="config.json is not valid JSON"):
    checkpoints.load_config(str(tmp_path))
