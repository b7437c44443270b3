"""Orbax checkpoints of the train state and the data position, verified when restored.

DIR/checkpoints/<step>/ holds "state" (TrainState) and "meta" (JSON: a checksum of every state
leaf, the data position and the fingerprint of the training data, `data/fingerprint.py`). The
data position is one global number, the next batch index: every process reads one batch per
step and global batch k does not depend on the process count (`pipeline.train_dataset`), so a
run saved on 8 hosts resumes on 4. A restore checks all of it: a corrupt or truncated state, a
data position that is not the step, or other training data each fail in one line that says how
to go on. (Checkpoints from before "meta" hold the per-process grain item "data" instead.)
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
import tempfile
import time
import traceback

import grain
import jax
import orbax.checkpoint as ocp
from absl import logging

from hybrid_nope import storage
from hybrid_nope.checkpoint_integrity import META_ITEM, state_checksums
from hybrid_nope.errors import UserError

ITEMS = ("state", "data", "meta")  # "data": only in checkpoints written before "meta".
_SETTLE_SECONDS = 1.0  # After a failed read, how long tensorstore's threads take to stop.


class CheckpointError(UserError):
  """A checkpoint that cannot be restored as saved (corrupt, truncated, edited)."""


class DataChangedError(UserError):
  """A resume onto training data other than the data the checkpoint was trained on."""


def changed_data(saved: dict, current: dict) -> list[str]:
  """'key: saved -> current' for each fingerprint entry that differs."""
  return [f"{key}: {saved.get(key, '(absent)')!r} -> {current.get(key, '(absent)')!r}"
          for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]


def _read_error(error: BaseException, where: str) -> str:
  """The line that says what failed (tensorstore's status, e.g. OUT_OF_RANGE reading "w/0.0"),
  from an exception chain whose outer messages hold pages of TensorStore spec."""
  chain = []
  while error is not None and len(chain) < 10:
    chain.append(error)
    error = error.__cause__ or error.__context__
  for e in reversed(chain):  # The innermost cause is the most specific.
    status = re.search(r"\b(OUT_OF_RANGE|DATA_LOSS|NOT_FOUND|INVALID_ARGUMENT|FAILED_PRECONDITION"
                       r"|INTERNAL|UNKNOWN|UNAVAILABLE|PERMISSION_DENIED)\b: [^\n]{0,300}", str(e))
    if status:
      return status.group(0)
  text = str(chain[0]).strip()
  return f"{where}: {text.splitlines()[0][:200] if text else type(chain[0]).__name__}"


class Checkpointer:
  """Saves {"state", "data", "meta"} under DIR/checkpoints/<step> and verifies a restore."""

  def __init__(self, workdir: str, *, keep: int, directory: str = "", replicated=None):
    """`directory` (config checkpoint.directory) defaults to WORKDIR/checkpoints; a gs:// path
    lets every host of a pod write its shards to shared storage. `replicated`: the mesh's
    replicated sharding, where the state's checksums are gathered."""
    self.directory = storage.checkpoint_directory(workdir, directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=ITEMS)
    self._checksums = jax.jit(state_checksums, **(
        {} if replicated is None else {"out_shardings": replicated}))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def step_directory(self, step: int) -> str:
    return storage.join(self.directory, str(step))

  def checksums(self, state) -> dict[str, int]:
    return {k: int(v) for k, v in jax.device_get(self._checksums(state)).items()}

  def save(self, step: int, state, data_iterator, data_fingerprint: dict) -> None:
    meta = {"checksums": self.checksums(state), "data": data_fingerprint,
            "data_position": data_iterator.get_state()}
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta)))

  def _how_to_go_on(self, step: int) -> str:
    older = [s for s in self.all_steps() if s < step]
    if not older:
      return (f"no older checkpoint is kept: move {self.step_directory(step)} aside and rerun "
              "to start afresh")
    return (f"rerun with --config.checkpoint.restore_step={older[-1]} to resume from step "
            f"{older[-1]}, the newest older one (this discards step {step} and later)")

  def restore(self, step: int, abstract_state, data_iterator, *, data_fingerprint: dict,
              allow_changed_data: bool):
    """The restored state; `data_iterator` is moved to the saved position in place. Raises
    CheckpointError (corrupt, truncated or edited) or DataChangedError (other data)."""
    where = self.step_directory(step)
    has_meta = storage.exists(storage.join(where, "meta"))
    if not has_meta:
      logging.warning("checkpoint step %d predates checksums and data fingerprints (%s has no "
                      "meta/): restored without verifying its state or its data", step, where)
    items = ({"meta": ocp.args.JsonRestore()} if has_meta else
             {"data": grain.checkpoint.CheckpointRestore(data_iterator)})
    printed = io.StringIO()  # A failed read also prints from tensorstore's threads.
    try:
      with contextlib.redirect_stderr(printed):
        try:
          restored = self.manager.restore(step, args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract_state), **items))
        except Exception:
          time.sleep(_SETTLE_SECONDS)  # Reads still in flight finish (and print) here.
          raise
    except Exception as e:  # orbax and tensorstore raise many kinds; the cause is in the text.
      with tempfile.NamedTemporaryFile("w", prefix=f"restore_step_{step}_", suffix=".txt",
                                       delete=False) as log:
        log.write("".join(traceback.format_exception(e)) + printed.getvalue())
      raise CheckpointError(f"checkpoint step {step} cannot be read ({_read_error(e, where)}); "
                            f"{self._how_to_go_on(step)} (full traceback: {log.name})") from None
    sys.stderr.write(printed.getvalue())  # A good restore's output, passed on.
    state = restored["state"]
    meta = restored["meta"] if has_meta else {"checksums": None, "data": data_fingerprint}
    if has_meta:
      data_iterator.set_state(meta["data_position"])
    bad = [] if meta["checksums"] is None else [
        k for k, v in self.checksums(state).items() if meta["checksums"].get(k) != v]
    if bad:
      raise CheckpointError(
          f"checkpoint step {step} is corrupt: {len(bad)} leaves of {where}/state differ from "
          f"the checksums saved with them (first: {bad[0]}); {self._how_to_go_on(step)}")
    position = data_iterator.get_state().get("next_index")
    if position != step:
      raise CheckpointError(
          f"checkpoint step {step} holds data position next_index={position} in {where}/"
          f"{'meta' if has_meta else 'data'}, but a run at step {step} has read exactly {step} "
          f"batches: the file was edited or comes from another run; {self._how_to_go_on(step)}")
    changes = changed_data(meta["data"], data_fingerprint)
    if changes and not allow_changed_data:
      raise DataChangedError(
          f"the training data differs from what checkpoint step {step} was trained on ("
          + "; ".join(changes) + "). Resume on the same data, or pass "
          "--config.data.allow_changed_data=True to go on with this data")
    if changes:
      logging.warning("data.allow_changed_data: resuming step %d on other data: %s", step,
                      "; ".join(changes))
    return state

  def discard_after(self, step: int) -> list[int]:
    """Deletes every checkpoint newer than `step` (a resume from an older step rewrites them)."""
    newer = [s for s in self.all_steps() if s > step]
    for s in newer:
      self.manager.delete(s)
    return newer

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
