"""The loop's side work as one schedule (levanter's hooks with an interval; nanodo's hook list).

Eval, samples, checkpoints and the hooks the loop is handed are `Entry`s of one `Schedule`. An
entry says when it is due (every N steps, the last step, step 0 of a fresh run, a clock), what a
preempted step does with it (skip it, or run it: the save), whether a stop signal may cut it
short, and how a resumed run tells that it ran (a key on record at that step). `_train` asks the
schedule what is due once per step and runs it in one place, with one timing, one ETA note and
one preemption path, so the rules cannot drift between kinds of side work.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import logging

from hybrid_nope.errors import UserError
from hybrid_nope.train.hooks import hook_name


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  every: int                      # Due at multiples of this step (0: at no multiple).
  run: Callable[[int, Any], Any]  # (step, train state) -> anything; its result is `ran`'s.
  at_last: bool = True            # Also due at the run's last step.
  at_start: bool = False          # Also due at step 0 of a fresh run (the init measurement).
  at_preemption: bool = False     # True: runs on a preempted step (the save); False: skipped.
  interruptible: bool = True      # A stop signal cuts it short (preemption.Interrupted).
  done_key: str | None = None     # A metrics key on record once it ran at a step; a resumed
                                  # run redoes a due entry whose key is missing (None: never).
  record_files: tuple = ()        # Its records at a step, dropped before a redo.
  also_due: Callable[[], bool] | None = None  # Another trigger (checkpoint.every_minutes).
  log_seconds: bool = False       # Writes `<name>_seconds` at its step and logs start and end.
  eta_kind: str = ""              # The ETA's bucket (train/progress.py); the name if empty.

  @property
  def kind(self) -> str:
    return self.eta_kind or self.name

  def due(self, step: int, final: bool, preempted: bool) -> bool:
    """Due at this step of the loop. `final`: the run's last step; `preempted`: a stop signal
    ends the run here (the step is then the run's last, but only a save still runs)."""
    if preempted:
      return self.at_preemption
    if (self.every and step % self.every == 0) or (self.at_last and final):
      return True
    return bool(self.also_due and self.also_due())

  def owed_at(self, step: int, final: bool) -> bool:
    """What a run resumed at `step` may owe: due there, or at step 0 the init entries."""
    if step == 0:
      return self.at_start
    return bool(self.every and step % self.every == 0) or (self.at_last and final)


def on_every_process(flags: list[bool]) -> list[bool]:
  """Process 0's flags (it alone reads the records), so every process takes the same branch."""
  if jax.process_count() == 1:
    return flags
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return [bool(f) for f in multihost_utils.broadcast_one_to_all(np.array(flags, np.bool_))]


def hook_entry(hook, default_every: int) -> Entry:
  """A hook (`hook(step, params)`, train/hooks.py) as an entry: every `hook.every_steps` steps
  (default `metrics.every_steps`), at the last step and, unless `hook.at_start` is False, at
  step 0 of a fresh run; skipped on a preempted step and redone on resume."""
  name = hook_name(hook)
  every = getattr(hook, "every_steps", default_every)
  if not isinstance(every, int) or isinstance(every, bool) or every < 1:
    raise UserError(f"hook {name!r}: every_steps={every!r} is invalid: expected an integer >= 1")
  return Entry(name=name, every=every, run=lambda step, state: hook(step, state.params),
               at_start=bool(getattr(hook, "at_start", True)), done_key=f"{name}_seconds",
               record_files=tuple(getattr(hook, "record_files", ())), log_seconds=True)


class Schedule:
  """The entries in the order they run at a step; `progress` gets each one's seconds."""

  def __init__(self, entries: Sequence[Entry], writer, progress, watcher):
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
      raise UserError(f"side work {names} repeats a name: each hook needs its own `name`")
    self.entries, self.writer = list(entries), writer
    self.progress, self.watcher = progress, watcher
    for e in self.entries:
      progress.track(e.kind, e.every)

  def due(self, step: int, final: bool, preempted: bool) -> list[Entry]:
    """What runs at `step`, decided once, before the step's records are fetched (a save
    fetches them first). Every process decides the same (also_due broadcasts)."""
    return [e for e in self.entries if e.due(step, final, preempted)]

  def run(self, entries: Sequence[Entry], step: int, state) -> dict:
    """Runs `entries` at `step` in order; {name: result}. A stop signal in an interruptible
    entry raises preemption.Interrupted; the caller saves and stops."""
    results = {}
    for e in entries:
      if e.log_seconds:
        logging.info("step %d: running the %s hook...", step, e.name)
      start = time.perf_counter()
      if e.interruptible:
        with self.watcher.interruptible():
          results[e.name] = e.run(step, state)
      else:
        results[e.name] = e.run(step, state)
      seconds = time.perf_counter() - start
      self.progress.note(e.kind, seconds)
      if e.log_seconds:
        self.writer.write(step, {f"{e.name}_seconds": seconds})
        logging.info("step %d: the %s hook took %.1f s", step, e.name, seconds)
    return results

  def owed_at_resume(self, step: int, final: bool) -> list[Entry]:
    """What the schedule owed at the resumed `step` but is not on record (a preemption save
    skips eval and the hooks; a kill can cut a hook short). Their records at the step, if
    any, are dropped so the redo does not write them twice."""
    keys = self.writer.keys_at(step)
    candidates = [e for e in self.entries if e.done_key is not None]
    flags = on_every_process([e.owed_at(step, final) and e.done_key not in keys
                              for e in candidates])
    owed = [e for e, redo in zip(candidates, flags) if redo]
    for e in owed:
      if step == 0:  # A fresh run's init measurement: nothing was cut short.
        logging.info("step 0: running %s at init", e.name)
      else:
        logging.info("step %d: %s was not on record (preempted?); running it now", step, e.name)
      for name in e.record_files:
        self.writer.drop_step(name, step)
    return owed
