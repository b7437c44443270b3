"""Orbax checkpoints of the train state and the data position, verified when restored.

DIR/checkpoints/<step>/ (`run_dir.py`) holds "state" (TrainState) and "meta" (JSON: a checksum
of every state leaf; the data position; the fingerprint of the training data,
`data/fingerprint.py`; the run-defining config and the run's history, `run/run_identity.py`).
The data position is one global number, the training rows consumed: global row r does not
depend on the process count (`loader.train_dataset`), so a run saved on 8 hosts resumes on 4,
and a resume that changes the batch size reads on from the same row. A restore checks all of
it: a corrupt or truncated state, a data position that does not follow from the step and the
history, or other training data each fail in one line that says how to go on. Older
checkpoints hold the position as batches ("next_index"), or (before "meta") in the
per-process grain item "data".
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback

import grain
import jax
import orbax.checkpoint as ocp
from absl import logging
from flax import struct

from hybrid_nope.run import storage
from hybrid_nope.run.checkpoint_integrity import (SETTLE_SECONDS, corrupt_message,
                                              differing_leaves, read_error, state_checksums,
                                              unreadable_message)
from hybrid_nope.errors import UserError
from hybrid_nope.run.library_errors import LibraryErrors
from hybrid_nope.run.run_dir import CHECKPOINT_DATA, CHECKPOINT_META, CHECKPOINT_STATE, RunDir
from hybrid_nope.run import run_identity

ITEMS = (CHECKPOINT_STATE, CHECKPOINT_DATA, CHECKPOINT_META)  # DATA: only in pre-meta ones.


@struct.dataclass
class TrainState:
  """A checkpoint's "state" item: the trainer's state (train/state.py builds it), whose field
  names are the checksum keys' and the readers' ("params")."""
  step: jax.Array          # Number of optimizer updates applied so far.
  params: dict
  opt_state: object        # optax.OptState; () in an imported workdir.


class CheckpointError(UserError):
  """A checkpoint that cannot be restored as saved (corrupt, truncated, edited)."""


class DataChangedError(UserError):
  """A resume onto training data other than the data the checkpoint was trained on."""


def changed_data(saved: dict, current: dict) -> list[str]:
  """'key: saved -> current' for each fingerprint entry that differs."""
  return [f"{key}: {saved.get(key, '(absent)')!r} -> {current.get(key, '(absent)')!r}"
          for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]


class Checkpointer:
  """Saves {"state", "meta"} under DIR/checkpoints/<step> and verifies a restore."""

  def __init__(self, workdir: str, *, keep: int, directory: str = "", replicated=None):
    """`directory` (config checkpoint.directory) defaults to WORKDIR/checkpoints; a relative
    one is taken inside the workdir; a gs:// path lets every host of a pod write its shards to
    shared storage. `replicated`: the mesh's replicated sharding, where the state's checksums
    are gathered. The directory is probed with a real write here, not at the first save."""
    self.run_dir = RunDir(workdir, directory)
    self.directory = self.run_dir.checkpoints
    _probe_writable(self.directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=ITEMS)
    self._checksums = jax.jit(state_checksums, **(
        {} if replicated is None else {"out_shardings": replicated}))
    self._saving = None  # The step of the last save started, until its errors were checked.
    self._library_errors = None  # Opened at the first save: only a trainer saves.
    self._errors_named = 0  # How many of its records an error line pointed to.

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def step_directory(self, step: int) -> str:
    return self.run_dir.checkpoint(step)

  def checksums(self, state) -> dict[str, int]:
    return {k: int(v) for k, v in jax.device_get(self._checksums(state)).items()}

  def save(self, step: int, state, meta: dict) -> None:
    """Starts an async save of `state` with `meta` (data position, fingerprint, config,
    history) and the state's checksums; a failure is raised by `check_saved()`."""
    self.check_saved()
    if self._library_errors is None and jax.process_index() == 0:
      self._library_errors = LibraryErrors(self.run_dir.library_errors).open()
    meta = {**meta, "checksums": self.checksums(state)}
    self.manager.save(step, args=ocp.args.Composite(**{
        CHECKPOINT_STATE: ocp.args.StandardSave(state), CHECKPOINT_META: ocp.args.JsonSave(meta)}))
    self._saving = step

  def check_saved(self, *, block: bool = False) -> None:
    """Raises CheckpointError, in one line, if the last async save failed (a full disk, a
    revoked permission): the loop calls it every step, so a failure surfaces at the next
    step, not at the next save. `block`: wait for a save in flight first (the run's last)."""
    if self._saving is None or (not block and self.manager.is_saving_in_progress()):
      return
    try:  # The save is over: this returns at once, or raises what failed it.
      self.manager.wait_until_finished()
      self.manager.check_for_errors()
    except Exception as e:  # orbax re-raises the writer thread's error, of any kind.
      step, self._saving = self._saving, None
      raise CheckpointError(self._save_failed(step, e)) from None
    self._saving = None

  def _save_failed(self, step: int, error: Exception) -> str:
    """The one line of a failed save: why, how to go on from what is on disk, and where
    orbax's tracebacks went."""
    older = self._older(step)
    if older:
      then = (f"Free space or fix the directory, then rerun the same command: it resumes from "
              f"step {older[-1]}, the newest good checkpoint")
    else:  # overwrite moves the records of a run without checkpoints aside (run/resume.py).
      then = ("No checkpoint was saved before it: free space or fix the directory, then rerun "
              "with --config.train.overwrite=True to start afresh (the run's records are moved "
              "aside)")
    errors = self._library_errors
    traces = ""
    if errors and errors.diverted:
      traces, self._errors_named = f"; {errors.where()}", errors.diverted
    return (f"saving checkpoint step {step} to {self.directory} failed "
            f"({_save_error(error, self.step_directory(step))}); the run stops. {then}{traces}")

  def _older(self, step: int) -> list[int]:
    return [s for s in self.all_steps() if s < step]

  def _how_to_go_on(self, step: int) -> str:
    older = self._older(step)
    if not older:
      return (f"no older checkpoint is kept: move {self.step_directory(step)} aside and rerun "
              "to start afresh")
    return (f"rerun with --config.checkpoint.restore_step={older[-1]} to resume from step "
            f"{older[-1]}, the newest older one (step {step} and later are moved to "
            f"{self.rolled_back_directory()}/)")

  def _read(self, step: int, items: dict):
    """manager.restore of `items`, every failure as CheckpointError in one line (the full
    traceback goes to a file named in it)."""
    where = self.step_directory(step)
    printed = io.StringIO()  # A failed read also prints from tensorstore's threads.
    try:
      with contextlib.redirect_stderr(printed):
        try:
          restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception:
          time.sleep(SETTLE_SECONDS)  # Reads still in flight finish (and print) here.
          raise
    except Exception as e:  # orbax and tensorstore raise many kinds; the cause is in the text.
      with tempfile.NamedTemporaryFile("w", prefix=f"restore_step_{step}_", suffix=".txt",
                                       delete=False) as log:
        log.write("".join(traceback.format_exception(e)) + printed.getvalue())
      raise CheckpointError(f"{unreadable_message(step, e, where)}; {self._how_to_go_on(step)} "
                            f"(full traceback: {log.name})") from None
    sys.stderr.write(printed.getvalue())  # A good restore's output, passed on.
    return restored

  def read_meta(self, step: int) -> dict | None:
    """Checkpoint `step`'s meta; None for a checkpoint written before meta existed."""
    if not storage.exists(self.run_dir.checkpoint_meta(step)):
      return None
    return self._read(step, {CHECKPOINT_META: ocp.args.JsonRestore()})[CHECKPOINT_META]

  def restore(self, step: int, abstract_state, meta: dict | None, *, data_fingerprint: dict,
              allow_changed_data: bool, batch_size: int) -> tuple[object, int]:
    """(state, training rows consumed) of checkpoint `step`, whose meta `read_meta` gave.
    Raises CheckpointError (corrupt, truncated or edited) or DataChangedError (other data).
    `batch_size`: the run's batch size at `step`, for checkpoints that count batches."""
    where = self.step_directory(step)
    if meta is None:
      logging.warning("checkpoint step %d predates checksums and data fingerprints (%s has no "
                      "meta/): restored without verifying its state or its data", step, where)
      position = _SavedPosition()
      restored = self._read(step, {
          CHECKPOINT_STATE: ocp.args.StandardRestore(abstract_state),
          CHECKPOINT_DATA: grain.checkpoint.CheckpointRestore(position)})
      meta = {"checksums": None, "data": data_fingerprint,
              "data_position": position.get_state()}
    else:
      restored = self._read(step, {CHECKPOINT_STATE: ocp.args.StandardRestore(abstract_state)})
    state = restored[CHECKPOINT_STATE]
    bad = ([] if meta["checksums"] is None else
           differing_leaves(meta["checksums"], self.checksums(state)))
    if bad:
      raise CheckpointError(f"{corrupt_message(step, where, bad)}; {self._how_to_go_on(step)}")
    rows = self._rows(step, meta, batch_size)
    changes = changed_data(meta["data"], data_fingerprint)
    if changes and not allow_changed_data:
      raise DataChangedError(
          f"{_what_changed(changes)} differs from what checkpoint step {step} was trained with ("
          + "; ".join(changes) + "). Resume on the same data, or pass "
          "--config.data.allow_changed_data=True to go on with this data")
    if changes:
      logging.warning("data.allow_changed_data: resuming step %d on other data: %s", step,
                      "; ".join(changes))
    return state, rows

  def _rows(self, step: int, meta: dict, batch_size: int) -> int:
    """The rows consumed that meta records, checked against the step and the history."""
    position, where = meta["data_position"], self.run_dir.checkpoint_meta(step)
    if "rows" in position:
      expected = run_identity.rows_consumed(meta["history"], step)
      if position["rows"] != expected:
        raise CheckpointError(
            f"checkpoint step {step} holds data position rows={position['rows']} in {where}, "
            f"but its history says a run at step {step} has read {expected} rows: the file was "
            f"edited or comes from another run; {self._how_to_go_on(step)}")
      return int(position["rows"])
    batches = position.get("next_index")  # Older checkpoints: one batch per step.
    if batches != step:
      raise CheckpointError(
          f"checkpoint step {step} holds data position next_index={batches} in {where}, but a "
          f"run at step {step} has read exactly {step} batches: the file was edited or comes "
          f"from another run; {self._how_to_go_on(step)}")
    return step * batch_size

  def rolled_back_directory(self) -> str:
    return self.run_dir.rolled_back

  def roll_back_after(self, step: int) -> tuple[list[int], str | None]:
    """Moves every checkpoint newer than `step` to checkpoints/rolled_back/<time>/ (a resume
    from an older step rewrites those steps; nothing is deleted). (steps moved, where)."""
    newer = [s for s in self.all_steps() if s > step]
    if not newer:
      return [], None
    self.manager.wait_until_finished()
    where = self.run_dir.rolled_back_now(newer[-1])
    if jax.process_index() == 0:  # One mover; the others wait, then list the steps anew.
      storage.makedirs(where)
      for s in newer:
        storage.move(self.step_directory(s), storage.join(where, str(s)))  # Its name kept.
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices("hybrid_nope rollback")
    self.manager.reload()
    return newer, where

  def expected_size_warning(self, state) -> str | None:
    """A warning when the directory's free space is under twice one checkpoint (local only)."""
    local = storage.local_path(self.directory)
    if local is None:
      return None
    size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    free = shutil.disk_usage(local).free
    if free >= 2 * size:
      return None
    return (f"{local} has {_bytes(free)} free, under twice one checkpoint ({_bytes(size)}): "
            "a save may fail for lack of space")

  def wait(self) -> None:
    """Blocks until the last save is over; its failure is a one-line CheckpointError."""
    self.check_saved(block=True)

  def let_finish(self) -> None:
    """Lets a save in flight finish while the run stops for another reason: its failure is
    logged, never raised, so it cannot hide the error that stopped the run."""
    try:
      self.check_saved(block=True)
    except CheckpointError as e:
      logging.error("%s", e)

  def close(self) -> None:
    self.manager.close()
    errors = self._library_errors
    if errors is not None:
      errors.close()
      if errors.diverted > self._errors_named:  # Errors no save failure accounted for.
        logging.warning("orbax logged %d errors that stopped nothing: %s", errors.diverted -
                        self._errors_named, errors.where())


class _SavedPosition:
  """What grain restores a pre-meta checkpoint's per-process item "data" into (grain passes a
  non-DatasetIterator its JSON state as bytes)."""

  def __init__(self):
    self._state = {}

  def get_state(self) -> dict:
    return self._state

  def set_state(self, state: bytes) -> None:
    self._state = json.loads(state)

  def start_prefetch(self) -> None:
    pass


def _bytes(n: int) -> str:
  """n bytes in the largest binary unit that keeps a whole number in front: 12.0 KiB, not
  0.00 GiB."""
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{n} B"


_OS_ERROR = re.compile(r"\[os_error_code='?(\d+)'?\]")  # How tensorstore names errno.


def _save_error(error: BaseException, where: str) -> str:
  """What failed a save, as the system says it ("No space left on device") when an OSError or
  tensorstore's status names its errno; else tensorstore's status line (`read_error`)."""
  chain = []
  while error is not None and len(chain) < 10:
    chain.append(error)
    error = error.__cause__ or error.__context__
  for e in chain:
    code = e.errno if isinstance(e, OSError) and e.errno else None
    match = code is None and _OS_ERROR.search(str(e))
    if code or match:
      return f"{os.strerror(code or int(match.group(1)))}, in {where}"
  return read_error(chain[0], where)


def _what_changed(changes: list[str]) -> str:
  """Names the data that changed: eval data alone is not the training data."""
  keys = [c.split(":", 1)[0] for c in changes]
  if all(k.startswith("eval.") for k in keys):
    return "the eval data"
  if any(k.startswith("eval.") for k in keys):
    return "the training and the eval data"
  return "the training data"


def _probe_writable(directory: str) -> None:
  """A real write into the checkpoint directory, so a directory no save could use fails now,
  in one line."""
  try:
    storage.makedirs(directory)
    storage.probe_write(directory)
  except Exception as e:  # OSError locally; fsspec backends raise their own kinds.
    why = getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
    raise CheckpointError(f"checkpoint directory {directory} is not writable by this process "
                          f"({why}): set --config.checkpoint.directory to a writable path, or "
                          "fix its permissions") from None
