"""One workdir per checkpoint directory: CHECKPOINT_DIR/owner.json names the workdir whose run
writes its steps, and that run's id.

The workdir lock (`workdir_lock.py`) keeps one trainer per workdir; a checkpoint directory
outside the workdir (`checkpoint.directory=../shared`, one absolute path for a sweep) needs its
own owner, or two workdirs' runs save, resume and garbage-collect each other's steps. A start
claims the directory before any step is read or written (`resume.plan`): a directory owned by
another workdir is refused in one line naming both. A checkpoint directory inside the workdir
that was moved or copied with it (its recorded path is not this one) goes along with it.

The run id is minted when a directory is first claimed and goes into the start event of the
run's history (`resume.py`) (config_history.jsonl, every checkpoint's meta), so a rerun can tell its own
records (a run killed before its first save) from another run's. On a local directory the
marker is created atomically (a hard link: it appears whole or not at all); on an object store
two starts within the same second could both write it, as with the workdir lock.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import uuid

import jax
from absl import logging

from hybrid_nope.run import run_config, run_dir, storage
from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run import run_identity


class CheckpointOwnedError(UserError):
  """A checkpoint directory that another workdir's run writes."""


@dataclasses.dataclass(frozen=True)
class Owner:
  workdir: str    # As `run_dir.comparable` gives it: a resolved local path, or the URL.
  directory: str  # The checkpoint directory where the marker was written, compared alike.
  run_id: str


def new_run_id() -> str:
  return uuid.uuid4().hex[:12]


def _unreadable(path: str, why: str) -> CheckpointOwnedError:
  return CheckpointOwnedError(
      f"{path} is unreadable ({why}): it should name the workdir that owns this checkpoint "
      "directory. If this workdir's run is the only one writing there, delete it and rerun (it "
      "is written again)")


def _read(path: str) -> Owner | None:
  try:
    found = json.loads(storage.read_text(path))
    fields = [found[f.name] for f in dataclasses.fields(Owner)]
  except FileNotFoundError:
    return None
  except (ValueError, KeyError, TypeError, IsADirectoryError) as e:
    raise _unreadable(path, type(e).__name__) from None
  for field, value in zip(dataclasses.fields(Owner), fields):
    if not isinstance(value, str) or not value:  # Else str() would write `run_id: "[]"` back.
      raise _unreadable(path, f"its {field.name} is {value!r}, expected a non-empty string")
  return Owner(*fields)


def _text(owner: Owner) -> str:
  return json.dumps({**dataclasses.asdict(owner), "host": socket.gethostname(),
                     "pid": os.getpid(), "time": time.time()}) + "\n"


def _create(path: str, owner: Owner) -> bool:
  """Writes the marker if there is none; False if one appeared meanwhile."""
  local = storage.local_path(path)
  if local is None:
    if storage.exists(path):
      return False
    storage.write_text(path, _text(owner))
    return True
  staged = f"{local}.{os.getpid()}.tmp"
  with open(staged, "w") as f:
    f.write(_text(owner))
  try:
    os.link(staged, local)  # Atomic and exclusive: a racing start sees all of it or nothing.
    return True
  except FileExistsError:
    return False
  finally:
    os.remove(staged)


def recorded_start(workdir: str) -> dict | None:
  """The newest start event of the workdir's config_history.jsonl (it names the run id), if
  there is one (a line that is not JSON fails in one line naming it, `run_config.history`)."""
  starts = [e for e in run_config.history(workdir) if e.get("event") == run_identity.EVENT_START]
  return starts[-1] if starts else None


def _unowned_steps(directory: str) -> list[str]:
  if not storage.isdir(directory):
    return []
  return sorted((n for n in storage.listdir(directory) if n.isdigit()), key=int)


def claim(workdir: str, checkpoint_directory: str = "") -> Owner:
  """The owner of the run's checkpoint directory, claimed for `workdir` if nobody holds it;
  raises CheckpointOwnedError, before anything is written there, if another workdir does.
  Process 0 writes the marker; the others read it after it is there."""
  owner = _claim_on_this_process(workdir, checkpoint_directory)
  # Every process reaches this barrier on every path: one that returned early (its read saw
  # process 0's new marker, a race under load) would meet process 0's barrier with its first
  # training collective instead, and both would hang.
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices("hybrid_nope checkpoint owner")
    owner = _read(RunDir(workdir, checkpoint_directory).checkpoint_owner) or owner
  return owner


def _claim_on_this_process(workdir: str, checkpoint_directory: str) -> Owner:
  rd = RunDir(workdir, checkpoint_directory)
  path, here = rd.checkpoint_owner, run_dir.comparable(workdir)
  directory = run_dir.comparable(rd.checkpoints)
  inside = rd.relative(rd.checkpoints) is not None
  found = _read(path)
  # A marker's paths resolved again: one written before paths were resolved may name a link.
  found_at = None if found is None else (run_dir.comparable(found.workdir),
                                         run_dir.comparable(found.directory))
  if found is not None and found_at[0] != here:
    if found_at[1] == directory or not inside:
      raise CheckpointOwnedError(
          f"checkpoint directory {rd.checkpoints} belongs to the run in {found.workdir} (run "
          f"{found.run_id}, {path}), not to this workdir {here}: two workdirs on one checkpoint "
          "directory resume and delete each other's steps. Give this run its own "
          "--config.checkpoint.directory (or leave it unset for WORKDIR/checkpoints); if "
          f"{found.workdir} was moved to {here}, delete {path} and rerun")
    logging.warning("%s: this checkpoint directory was moved or copied here with its workdir "
                    "from %s; this workdir takes it over (run %s)", path, found.workdir,
                    found.run_id)
  if found is not None and found_at == (here, directory):
    return found
  if found is None:
    steps = _unowned_steps(rd.checkpoints)
    records_id = (recorded_start(workdir) or {}).get("run_id")
    if steps and not inside and records_id is None and not storage.exists(rd.config):
      raise CheckpointOwnedError(
          f"checkpoint directory {rd.checkpoints} holds steps {steps} but names no owner "
          f"({path} is missing), and this workdir {here} holds no record of a run: they are "
          "another run's. Give this run its own --config.checkpoint.directory (or leave it "
          "unset for WORKDIR/checkpoints)")
    if steps:
      logging.warning("%s holds steps %s but no %s (saved before owners were recorded): "
                      "this workdir %s claims it", rd.checkpoints, steps, run_dir.CHECKPOINT_OWNER,
                      here)
    # Steps saved before owners were recorded are the workdir's run's; an empty directory is a
    # new one (its records, if any, are of a run whose checkpoints are elsewhere).
    run_id = (records_id if steps else None) or new_run_id()
  else:
    run_id = found.run_id
  owner = Owner(here, directory, run_id)
  if jax.process_index() == 0:
    storage.makedirs(rd.checkpoints)
    if found is not None:
      storage.write_text(path, _text(owner))  # Taken over from a moved copy of this workdir.
    elif not _create(path, owner):
      # Another start won the race: judge it.
      return _claim_on_this_process(workdir, checkpoint_directory)
  return owner
