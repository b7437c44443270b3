# Tiers (pytest.ini): test_hooks_run_at_step_zero_every_metrics_steps_and_the_last_step trains a
# run end to end, so it is integration, `make test-all` only.
# test-all only: the loop runs its hooks at step 0, every metrics.every_steps and the last step,
# hands them the eval batches and records their seconds
# (test_hooks_run_at_step_zero_every_metrics_steps_and_the_last_step; the schedule's rules are
# checked in `make test` by test_train_schedule.py).
"""The loop runs the hooks it is handed, at their cadence; the trainer imports no analysis."""
import json
import pathlib

import pytest

from hybrid_nope.train import loop
from hybrid_nope.train.hooks import hook_name
from tests.helpers import tiny_config

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_hooks_run_at_step_zero_every_metrics_steps_and_the_last_step(tmp_path):
  calls, contexts = [], []

  def factory(run):
    contexts.append(run)

    def probe_rows(step, params):
      calls.append(step)
    return probe_rows

  # every_steps 3 is independent of checkpoint.every_steps (4); 8 is the last step.
  loop.train(tiny_config(metrics__every_steps=3), str(tmp_path), hooks=[factory])
  assert calls == [0, 3, 6, 8]
  (run,) = contexts
  assert len(run.eval_batches) == run.config.eval.num_batches
  with open(tmp_path / "metrics.jsonl") as f:
    timed = [r["step"] for r in map(json.loads, f) if "probe_rows_seconds" in r]
  assert timed == [0, 3, 6, 8]


def test_metrics_every_steps_follows_checkpoint_every_steps_unless_set():
  config = tiny_config()
  assert config.metrics.every_steps == config.checkpoint.every_steps == 4
  config.checkpoint.every_steps = 6
  assert config.metrics.every_steps == 6
  config.metrics.every_steps = 2
  assert (config.metrics.every_steps, config.checkpoint.every_steps) == (2, 6)


def test_hook_name():
  class Named:
    name = "recency"
  assert hook_name(Named()) == "recency"
  assert hook_name(test_hook_name) == "test_hook_name"


def test_nothing_under_train_imports_analysis():
  offenders = [str(p.relative_to(REPO)) for p in (REPO / "hybrid_nope" / "train").rglob("*.py")
               if "hybrid_nope.analysis" in p.read_text() or "from hybrid_nope import analysis"
               in p.read_text()]
  assert offenders == []
