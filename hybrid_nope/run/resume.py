"""Where a run starts, decided before anything is built: afresh, or from which checkpoint, with
which allowed config changes, rollback and skip; and the run's history kept beside config.json.

- The checkpoint directory is claimed for this workdir first (`checkpoint_owner.py`): one
  owned by another workdir is refused before any of its steps is read.
- A fresh start in a workdir that holds records of another run refuses, unless train.overwrite
  moves them aside: a moved or misdirected checkpoint directory must not truncate another
  run's records. Records of this run (the checkpoint directory's run id, the same config) that
  left no checkpoint, a run killed before its first save, are moved aside and the run starts
  afresh: a requeue of the same command always starts or resumes.
- A resume compares the config with the checkpoint's (`run_identity.check_resume`).
- checkpoint.restore_step=N rolls back once: the checkpoints after N move to
  checkpoints/rolled_back/; a rerun of the same command after training has passed N again
  finds that rollback in its newest checkpoint's history and resumes from there.
- data.skip_batches=K skips K batches once per (K, restore_step) in the lineage.
Events go to WORKDIR/config_history.jsonl (append only; `hybrid_nope/run/run_config.py`) and
metrics.jsonl, and into the next checkpoint's meta with the rest of the lineage.
"""
from __future__ import annotations

import dataclasses
import json
import time

import jax
from absl import logging

from hybrid_nope.run import run_config, run_dir, storage
from hybrid_nope.errors import ConfigError, UserError
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run import checkpoint_owner, run_identity
from hybrid_nope.run.checkpoint import Checkpointer

RECORD_FILES = (run_dir.METRICS, run_dir.RECENCY)  # A run has begun once these hold a line.
# What a move aside leaves in place: the folder it moves into, the lock this trainer holds, the
# checkpoint folder (it holds no step, or this were no fresh start, and names its owner) and
# the sweep's log of every attempt (the sweep appends to it while this trainer runs).
KEPT_BY_OVERWRITE = (run_dir.OVERWRITTEN, run_dir.LOCK, run_dir.CHECKPOINTS, run_dir.SWEEP_LOG)


class WorkdirInUseError(UserError):
  pass


@dataclasses.dataclass
class ResumePlan:
  step: int | None        # The checkpoint to restore; None = a fresh start.
  meta: dict | None       # Its meta (None: fresh, or a checkpoint from before meta).
  history: list[dict]     # The lineage's events, including this start's.
  new_events: list[dict]  # The events this start adds (to record once the run is built).
  roll_back: bool         # Move the checkpoints after `step` aside once the restore holds.
  skip_rows: int          # Rows to read past after the restore.
  batch_size_at_step: int  # The batch size the checkpoint's steps were read with.


def _now() -> str:
  return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _has_records(workdir: str) -> list[str]:
  found, rd = [], RunDir(workdir)
  for name in RECORD_FILES:
    path = rd.path(name)
    if storage.exists(path) and storage.read_text(path).strip():
      found.append(name)
  return found


def _move_aside(workdir: str, where: str | None = None) -> str:
  """Moves everything of a run that left no checkpoint into WORKDIR/overwritten/<time>/ (or
  `where`, a move cut short). A marker there names the move unfinished until the last file is
  moved, so a kill halfway leaves no old TensorBoard events or sums in the next run."""
  rd = RunDir(workdir)
  if where is None:
    where = rd.overwritten_now()
    storage.makedirs(where)
  marker = storage.join(where, run_dir.MOVING)
  storage.write_text(marker, f"moving the files of {workdir} here; a start finishes it\n")
  for name in storage.listdir(workdir):
    if name not in KEPT_BY_OVERWRITE and not name.startswith(storage.WRITE_PROBE_PREFIX):
      storage.move(rd.path(name), storage.join(where, name))  # Its name kept.
  storage.remove(marker)
  return where


def _finish_cut_move(workdir: str) -> None:
  """Finishes a move aside that a kill cut short (its folder still holds the marker)."""
  folder = RunDir(workdir).overwritten
  if not storage.exists(folder):
    return
  for name in sorted(storage.listdir(folder)):
    where = storage.join(folder, name)
    if storage.exists(storage.join(where, run_dir.MOVING)):
      _move_aside(workdir, where)
      logging.warning("a move of %s's files into %s was cut short: moved the rest there now",
                      workdir, where)


def _not_ours(config, workdir: str, run_id: str) -> str | None:
  """None when the workdir's records are this run's, stopped before its first save: their
  start event names `run_id` (the checkpoint directory's) under the same run-defining config.
  Else why they are another run's."""
  start = checkpoint_owner.recorded_start(workdir)
  if start is None or "run_id" not in start:
    return f"{run_dir.CONFIG_HISTORY} names no run id for them"
  if start["run_id"] != run_id:
    return f"they are run {start['run_id']}'s, not run {run_id}'s (the checkpoint directory's)"
  found = run_identity.changes(run_identity.defining(start.get("config", {})),
                               run_identity.defining(config))
  if found:
    listed = "; ".join(f"{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in found.items())
    return f"they are of run {run_id} under another config ({listed})"
  return None


def _fresh(config, workdir: str, ckpt: Checkpointer, run_id: str) -> ResumePlan:
  records = _has_records(workdir)
  why = records and not config.train.overwrite and _not_ours(config, workdir, run_id)
  if why:
    raise WorkdirInUseError(
        f"{workdir} holds a run's records ({', '.join(records)}) but no checkpoint in "
        f"{ckpt.directory}, and {why}: starting afresh would replace them. If the checkpoints "
        "were moved, point --config.checkpoint.directory at them; else use a new --workdir, "
        "or pass --config.train.overwrite=True to move the old records aside and start again")
  if config.data.skip_batches:
    raise ConfigError(f"config.data.skip_batches={config.data.skip_batches} is invalid here: "
                      f"{workdir} has no checkpoint to resume, so there is nothing to skip "
                      "after (expected 0 at a fresh start)")
  rd = RunDir(workdir)
  started = any(storage.exists(p) for p in (rd.config, rd.config_history))
  if jax.process_index() == 0 and (records or started):  # Process 0 alone writes the records.
    where = _move_aside(workdir)  # Kept, never deleted: they may be another run's.
    if config.train.overwrite:
      logging.warning("train.overwrite: moved the records of the run in %s, which has no "
                      "checkpoint, to %s", workdir, where)
    elif records:
      logging.warning("run %s in %s stopped before its first checkpoint: moved its records to "
                      "%s and starting it afresh", run_id, workdir, where)
    else:
      logging.info("moved the config of a start that wrote no record to %s", where)
  start = {**run_identity.start_event(config), "run_id": run_id}  # Tells its records apart.
  return ResumePlan(step=None, meta=None, history=[start], new_events=[start], roll_back=False,
                    skip_rows=0, batch_size_at_step=int(config.data.batch_size))


def _saved_config(workdir: str, meta: dict | None, step: int, where: str):
  """The run-defining config of the checkpoint: in its meta, or (older checkpoints) the
  workdir's config.json, which the trainer rewrote at every start before it was kept."""
  if meta is not None and "config" in meta:
    return meta["config"]
  path = RunDir(workdir).config
  if not storage.exists(path):
    logging.warning("checkpoint step %d (%s) keeps no config and %s is missing: the resume "
                    "cannot check that the config still defines the same run", step, where, path)
    return None
  return run_identity.defining(json.loads(storage.read_text(path)))


def _restore_point(config, ckpt: Checkpointer) -> tuple[int, bool]:
  """(step to resume from, roll back?): the newest checkpoint, or checkpoint.restore_step
  unless the newest checkpoint's lineage already rolled back to it (resumed from it under that
  flag, whether or not newer checkpoints were moved then)."""
  requested, steps = config.checkpoint.restore_step, ckpt.all_steps()
  newest = steps[-1]
  if requested == 0:
    return newest, False
  if requested not in steps:
    raise ConfigError(f"config.checkpoint.restore_step={requested} is invalid: expected 0 "
                      f"(the newest) or a kept step of {ckpt.directory}: {steps}")
  newest_meta = (ckpt.read_meta(newest) or {}) if newest != requested else {}
  done = run_identity.last_rollback_to(newest_meta.get("history", []), requested)
  if done is not None:
    logging.warning("checkpoint.restore_step=%d: this run already rolled back to step %d (at "
                    "%s) and has trained on to step %d since: resuming from step %d, not "
                    "rolling back again (to roll back once more, set restore_step to a step "
                    "kept since)", requested, requested, done.get("time", "?"), newest, newest)
    return newest, False
  return requested, True


def plan(config, workdir: str, ckpt: Checkpointer) -> ResumePlan:
  """Raises CheckpointOwnedError, RunChangedError, WorkdirInUseError or ConfigError before
  anything is built. The checkpoint directory is claimed first: no step of it is read unless
  it is this workdir's."""
  if jax.process_index() == 0:
    _finish_cut_move(workdir)
  owner = checkpoint_owner.claim(workdir, ckpt.run_dir.checkpoint_directory)
  if not ckpt.all_steps():
    return _fresh(config, workdir, ckpt, owner.run_id)
  step, roll_back = _restore_point(config, ckpt)
  if config.train.overwrite:  # Never deletes a checkpoint: a requeue may pass it every time.
    logging.warning("train.overwrite=True: %s holds checkpoints (steps %s), so this resumes "
                    "from step %d and moves nothing aside; train.overwrite only starts afresh "
                    "over records that have no checkpoint (to start afresh here, use a new "
                    "--workdir)", ckpt.directory, ckpt.all_steps(), step)
  meta = ckpt.read_meta(step)
  where = ckpt.step_directory(step)
  saved = _saved_config(workdir, meta, step, where)
  found = {}
  if saved is not None:
    found, warnings = run_identity.check_resume(saved, config, step=step, where=where)
    for warning in warnings:
      logging.warning("%s", warning)
  saved_batch = (saved or {}).get("data.batch_size", int(config.data.batch_size))
  history = list((meta or {}).get("history") or [
      {**run_identity.start_event(config), "batch_size": saved_batch}])
  if jax.process_index() == 0:  # From what the run saved, never from this command line.
    for note in run_config.rebuild_missing(workdir, history, step):
      logging.warning("%s", note)
  events = []
  if found:
    events.append(run_identity.change_event(step, found, config))
  if roll_back:
    newer = [s for s in ckpt.all_steps() if s > step]
    events.append({"step": step, "event": run_identity.EVENT_ROLLBACK,
                   "moved": newer})
  skip = int(config.data.skip_batches)
  restore_step = int(config.checkpoint.restore_step)
  if skip and run_identity.skip_applied(history, skip, restore_step):
    logging.warning("data.skip_batches=%d (with checkpoint.restore_step=%d) was applied earlier "
                    "in this run: not skipping again", skip, restore_step)
    skip = 0
  skip_rows = skip * int(config.data.batch_size)
  if skip:
    events.append({"step": step, "event": run_identity.EVENT_SKIP, "batches": skip,
                   "restore_step": restore_step, "batch_size": int(config.data.batch_size),
                   "skipped_rows": skip_rows})
  events = [{**e, "time": _now()} for e in events]
  return ResumePlan(step=step, meta=meta, history=history + events, new_events=events,
                    roll_back=roll_back, skip_rows=skip_rows,
                    batch_size_at_step=int(saved_batch))


def _without_time(event: dict) -> dict:
  """An event as a rerun would derive it again: without its time and the config written."""
  return {k: v for k, v in event.items()
          if k not in ("time", "config", run_config.REBUILT_FROM)}


def record(workdir: str, config, events: list[dict], writer) -> None:
  """Writes config.json (once: never rewritten), and each event not yet on record to
  config_history.jsonl and metrics.jsonl (a rerun from the same checkpoint repeats its events;
  they are recorded once). Process 0 only."""
  if not writer.active:
    return
  rd = RunDir(workdir)
  config_path = rd.config
  if not storage.exists(config_path):
    storage.write_text(config_path, config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
  recorded = run_config.history(workdir)
  seen = [_without_time(e) for e in recorded]
  added = []
  for event in events:
    if _without_time(event) in seen:
      continue
    seen.append(_without_time(event))
    line = dict(event)
    if event["event"] in (run_identity.EVENT_START, run_identity.EVENT_CHANGE):
      line["config"] = json.loads(config.to_json_best_effort())
    added.append(line)
    if event["event"] != run_identity.EVENT_START:
      writer.write_record(run_dir.METRICS, dict(event))
  if added:
    storage.write_text(rd.config_history,
                       "".join(json.dumps(e) + "\n" for e in recorded + added))
