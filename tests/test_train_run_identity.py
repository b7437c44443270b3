"""Run identity: a key added to the config after a run was saved does not change that run."""
import pytest

from hybrid_nope.train import run_identity
from tests.helpers import tiny_config


def test_a_checkpoint_from_before_a_key_was_added_resumes_unless_the_key_changes():
  config = tiny_config()
  saved = run_identity.defining(config)
  for key in run_identity.ADDED_KEYS:
    saved.pop(key, None)  # as a checkpoint saved before the key existed (defining ones only)
  assert "model.delta_gate" not in saved
  assert run_identity.check_resume(saved, config, step=4, where="ckpt")[0] == {}
  config.model.delta_gate = "channel"
  with pytest.raises(run_identity.RunChangedError,
                     match='model.delta_gate: "head" -> "channel"'):
    run_identity.check_resume(saved, config, step=4, where="ckpt")


def test_the_delta_kernel_is_free_and_the_gate_defines_the_run():
  assert not run_identity.is_defining("model.delta_impl")
  assert run_identity.is_defining("model.delta_gate")
