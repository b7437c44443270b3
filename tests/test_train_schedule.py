# Tiers (pytest.ini): test_a_user_entry_runs_every_3_steps_and_at_the_last_not_on_a_preempted_step
# trains twice end to end around a preemption, so it is integration, `make test-all` only.
# test-all only: a user's hook with its own period runs through the loop every 3 steps and at the
# last, is skipped on a preempted step and owed on resume, with its records
# (test_a_user_entry_runs_every_3_steps_and_at_the_last_not_on_a_preempted_step; the entries'
# due/resume rules are checked here in `make test`).
"""The loop's side work as one schedule (train/schedule.py): when each entry is due, what a
preempted step and a resumed step do with it, and a user's hook with its own period."""
import json
import logging

import pytest

from hybrid_nope.errors import UserError
from hybrid_nope.train import loop, preemption, schedule
from tests.helpers import tiny_config


def _entry(**kw):
  return schedule.Entry(**{"name": "e", "every": 3, "run": lambda step, state: None, **kw})


def _due_steps(entry, steps=8, preempted_at=None):
  """The steps a loop of `steps` runs `entry` at; a preemption ends the loop at its step."""
  return [s for s in range(1, (preempted_at or steps) + 1)
          if entry.due(s, final=s == steps or s == preempted_at, preempted=s == preempted_at)]


def test_an_entry_is_due_at_multiples_and_the_last_step_and_skipped_when_preempted():
  assert _due_steps(_entry()) == [3, 6, 8]
  assert _due_steps(_entry(at_last=False)) == [3, 6]
  assert _due_steps(_entry(every=0)) == [8]  # Only at the end (e.g. a final export).
  assert _due_steps(_entry(), preempted_at=6) == [3]  # Not even at the preempted "last" step.
  assert _due_steps(_entry(at_preemption=True), preempted_at=6) == [3, 6]  # The save.


def test_another_trigger_is_asked_only_when_the_steps_do_not_decide():
  asked = []
  entry = _entry(also_due=lambda: asked.append(1) or True)
  assert entry.due(3, final=False, preempted=False) and not asked  # A multiple: not asked.
  assert entry.due(4, final=False, preempted=False) and asked == [1]


def test_what_a_resumed_step_may_owe():
  assert _entry(at_start=True).owed_at(0, final=False)
  assert not _entry().owed_at(0, final=False)  # Eval: nothing to evaluate at init.
  assert _entry().owed_at(6, final=False) and not _entry().owed_at(7, final=False)
  assert _entry().owed_at(7, final=True) and not _entry(at_last=False).owed_at(7, final=True)


class _Writer:
  def __init__(self, keys):
    self.keys, self.written, self.dropped = keys, [], []

  def keys_at(self, step):
    return self.keys

  def write(self, step, record):
    self.written.append((step, record))

  def drop_step(self, name, step):
    self.dropped.append((name, step))


class _Progress:
  def __init__(self):
    self.tracked, self.noted = {}, []

  def track(self, kind, every):
    self.tracked[kind] = every

  def note(self, kind, seconds):
    self.noted.append(kind)


def test_the_schedule_redoes_what_is_not_on_record_and_drops_its_partial_records():
  ran = []
  hook = lambda step, params: ran.append(step)  # noqa: E731
  hook.record_files = ("recency.jsonl",)
  entries = [_entry(name="eval", done_key="eval_loss", run=lambda s, st: ran.append(("eval", s))),
             schedule.hook_entry(hook, 3)]
  writer, progress = _Writer(keys={"eval_loss"}), _Progress()
  side = schedule.Schedule(entries, writer, progress, preemption.PreemptionWatcher())
  owed = side.owed_at_resume(6, final=False)
  assert [e.name for e in owed] == ["<lambda>"]  # Eval is on record at step 6; the hook is not.
  assert writer.dropped == [("recency.jsonl", 6)]
  side.run(owed, 6, state=type("State", (), {"params": "p"}))
  assert ran == [6] and progress.noted == ["<lambda>"]
  assert [r for _, r in writer.written][0].keys() == {"<lambda>_seconds"}
  assert progress.tracked == {"eval": 3, "<lambda>": 3}


def test_the_init_measurement_of_a_fresh_run_is_not_called_a_redo(caplog):
  entries = [_entry(name="init", at_start=True, done_key="init_seconds")]
  side = schedule.Schedule(entries, _Writer(set()), _Progress(), None)
  with caplog.at_level(logging.INFO):
    assert [e.name for e in side.owed_at_resume(0, final=False)] == ["init"]
    assert [e.name for e in side.owed_at_resume(3, final=False)] == ["init"]
  assert caplog.messages == ["step 0: running init at init",
                             "step 3: init was not on record (preempted?); running it now"]


def test_a_bad_period_or_two_entries_of_one_name_fail_naming_them():
  class Hook:
    name, every_steps = "norms", 0

    def __call__(self, step, params):
      pass
  with pytest.raises(UserError, match="hook 'norms': every_steps=0 is invalid"):
    schedule.hook_entry(Hook(), 4)
  with pytest.raises(UserError, match="repeats a name"):
    schedule.Schedule([_entry(), _entry()], _Writer(set()), _Progress(), None)


class EveryThirdStep:
  """A user's hook with its own period, passed as the recency hook is (a RunContext factory)."""
  name, every_steps, at_start = "every_third", 3, False
  calls: list = []

  def __init__(self, run):
    self.writer = run.writer

  def __call__(self, step, params):
    EveryThirdStep.calls.append(step)
    self.writer.write(step, {"every_third_ran": 1.0})


def _recorded(workdir, key):
  with open(workdir / "metrics.jsonl") as f:
    return [r["step"] for r in map(json.loads, f) if key in r]


@pytest.mark.integration
def test_a_user_entry_runs_every_3_steps_and_at_the_last_not_on_a_preempted_step(
    tmp_path, monkeypatch):
  EveryThirdStep.calls = []
  config = tiny_config(train__steps=8)  # checkpoints at 4 and 8; 8 is no multiple of 3.
  monkeypatch.setattr(preemption.PreemptionWatcher, "should_stop",
                      lambda self, step, manager: step == 6)
  first = loop.train(config, str(tmp_path), hooks=[EveryThirdStep])
  assert first["preempted"] and first["step"] == 6
  assert EveryThirdStep.calls == [3]  # Step 6 was preempted: saved, its hook skipped.
  monkeypatch.undo()
  loop.train(config, str(tmp_path), hooks=[EveryThirdStep])
  assert EveryThirdStep.calls == [3, 6, 8]  # The resumed run owed step 6's, then the last.
  assert _recorded(tmp_path, "every_third_seconds") == [3, 6, 8]
  assert _recorded(tmp_path, "every_third_ran") == [3, 6, 8]
