"""What makes a run one run: the config keys that define it, compared at every resume, and the
run's history (config changes, rollbacks, skipped batches) that each checkpoint carries.

Each checkpoint's meta holds the run-defining config it was trained under and the history of
its lineage: the events from the run's start up to that checkpoint, in order. A resume
compares the new config with the checkpoint's and refuses any change to a defining key, in
one line naming each with both values, before anything is built; `train.allow_changes` names
the keys a resume may change. An allowed change becomes a history event, as does a rollback
(`checkpoint.restore_step`) and a skip (`data.skip_batches`). From the history follows where
the data stream stands: rows consumed, summed over the batch sizes the run has had.
"""
from __future__ import annotations

import json

from hybrid_nope.errors import UserError
# The rule of which keys define a run lives beside the config files (analysis reads it too).
from hybrid_nope.run.run_config import (ADDED_KEYS, DEFINING_KEYS,  # noqa: F401
                                    DEFINING_PREFIXES, EVENT_CHANGE, EVENT_START,
                                    FREE_MODEL_KEYS, allowed_changes, defining, flat,
                                    is_defining)

# train.steps sets the schedule's length: lowering it is allowed with a warning (the run
# stops earlier; the schedule from here on decays faster), raising it needs the opt-in.
STEPS_KEY = "train.steps"

# The start and change events are named beside the file that holds them (run_config.py).
EVENT_ROLLBACK, EVENT_SKIP = "rollback", "skip_batches"


class RunChangedError(UserError):
  """A resume whose config would make the workdir hold another run."""


def _show(value) -> str:
  return json.dumps(value)


def changes(saved: dict, current: dict) -> dict[str, tuple]:
  """{key: (saved value, current value)} for each defining key that differs."""
  saved = {**{k: v for k, v in ADDED_KEYS.items() if k in current}, **saved}
  return {k: (saved.get(k, "(absent)"), current.get(k, "(absent)"))
          for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)}


def check_resume(saved: dict, config, *, step: int, where: str) -> tuple[dict, list[str]]:
  """(allowed changes {key: (old, new)}, warnings) of resuming the checkpoint `where` at
  `step`, whose run-defining config is `saved`, under `config`; raises RunChangedError naming
  every change that is not allowed."""
  found = changes(saved, defining(config))
  allowed = set(allowed_changes(config))
  warnings = []
  old_steps, new_steps = found.get(STEPS_KEY, (None, None))
  lowered = isinstance(old_steps, int) and isinstance(new_steps, int) and new_steps < old_steps
  if lowered:  # Allowed without the opt-in (the run stops earlier), and recorded as a change.
    warnings.append(f"train.steps lowered from {old_steps} to {new_steps}: the run stops "
                    "earlier, and from here the schedule decays to its end at the new "
                    "train.steps")
  refused = {k: v for k, v in found.items()
             if k not in allowed and not (k == STEPS_KEY and lowered)}
  if refused:
    listed = "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, (a, b) in refused.items())
    raise RunChangedError(
        f"{where} (step {step}) was trained under another config: {listed}. A resume keeps "
        "the run it resumes: use a new --workdir for a new run, or pass --config.train."
        f"allow_changes={','.join(refused)} to change it in this run (recorded in "
        "config_history.jsonl)")
  unused = allowed - set(found)
  if unused:
    warnings.append(f"train.allow_changes names {sorted(unused)}, which this resume does not "
                    "change")
  return found, warnings


# ---- history ------------------------------------------------------------------------------

def start_event(config) -> dict:
  return {"step": 0, "event": EVENT_START, "batch_size": int(config.data.batch_size)}


def change_event(step: int, found: dict, config) -> dict:
  return {"step": step, "event": EVENT_CHANGE, "batch_size": int(config.data.batch_size),
          "changes": {k: {"from": a, "to": b} for k, (a, b) in found.items()}}


def rows_consumed(history: list[dict], step: int) -> int:
  """Training rows read by a run at `step` whose lineage is `history`: each step reads one
  batch of the batch size in force, and a skip reads past its rows."""
  rows, at, batch_size = 0, 0, None
  for event in sorted(history, key=lambda e: e["step"]):
    if event["step"] > step:
      break
    if batch_size is not None:
      rows += (event["step"] - at) * batch_size
    at = event["step"]
    batch_size = event.get("batch_size", batch_size)
    rows += event.get("skipped_rows", 0)
  if batch_size is None:
    raise ValueError("a run's history starts with its start event")
  return rows + (step - at) * batch_size


def last_rollback_to(history: list[dict], step: int) -> dict | None:
  """The lineage's newest rollback to `step`, if there was one."""
  done = [e for e in history if e["event"] == EVENT_ROLLBACK and e["step"] == step]
  return done[-1] if done else None


def skip_applied(history: list[dict], batches: int, restore_step: int) -> dict | None:
  """The lineage's skip of `batches` requested with checkpoint.restore_step=`restore_step`, if
  it was applied: a rerun of the same command does not skip again."""
  done = [e for e in history if e["event"] == EVENT_SKIP and e["batches"] == batches
          and e["restore_step"] == restore_step]
  return done[-1] if done else None
