"""Run identity: a key added to the config after a run was saved does not change that run."""
import pytest

from hybrid_nope.run import run_identity
from tests.helpers import tiny_config


def test_a_checkpoint_from_before_a_key_was_added_resumes_unless_the_key_changes():
  config = tiny_config(train__schedule_offset=0)  # The older runs' behaviour (its default was 1).
  saved = run_identity.defining(config)
  for key in run_identity.ADDED_KEYS:
    saved.pop(key, None)  # as a checkpoint saved before the key existed (defining ones only)
  assert "model.delta_gate" not in saved
  assert run_identity.check_resume(saved, config, step=4, where="ckpt")[0] == {}
  config.model.delta_gate = "channel"
  with pytest.raises(run_identity.RunChangedError,
                     match='model.delta_gate: "head" -> "channel"'):
    run_identity.check_resume(saved, config, step=4, where="ckpt")


def test_an_older_run_resumes_under_the_sweep_configs_pin_not_under_the_new_default():
  # configs/small.py pins train.schedule_offset=0 for its committed runs, saved without the key.
  from configs import small
  pinned = small.get_config("swa64")
  saved = {k: v for k, v in run_identity.defining(pinned).items()
           if k not in run_identity.ADDED_KEYS}
  assert run_identity.check_resume(saved, pinned, step=64, where="ckpt")[0] == {}
  pinned.train.schedule_offset = 1
  with pytest.raises(run_identity.RunChangedError, match="train.schedule_offset: 0 -> 1"):
    run_identity.check_resume(saved, pinned, step=64, where="ckpt")


def test_the_recipe_keys_define_the_run_and_older_runs_read_their_behaviour():
  for key in ("train.schedule", "train.decay_fraction", "train.schedule_offset", "train.z_loss",
              "train.opt_state_dtype", "model.param_dtype", "model.logits_dtype"):
    assert run_identity.is_defining(key) and key in run_identity.ADDED_KEYS, key


def test_the_delta_kernel_is_free_and_the_gate_defines_the_run():
  assert not run_identity.is_defining("model.delta_impl")
  assert run_identity.is_defining("model.delta_gate")


def test_lowering_train_steps_is_allowed_and_is_a_change_to_record():
  # Issue 38 case 7: lowering train.steps on resume left no event, so analysis said steps=8.
  saved = run_identity.defining(tiny_config(train__steps=8))
  found, warnings = run_identity.check_resume(saved, tiny_config(train__steps=6), step=4,
                                              where="ckpt")
  assert found == {"train.steps": (8, 6)}
  assert any("train.steps lowered from 8 to 6" in w for w in warnings)
  event = run_identity.change_event(4, found, tiny_config(train__steps=6))
  assert event["changes"] == {"train.steps": {"from": 8, "to": 6}}
  with pytest.raises(run_identity.RunChangedError, match="train.steps: 8 -> 12"):
    run_identity.check_resume(saved, tiny_config(train__steps=12), step=4, where="ckpt")
