"""One trainer per workdir: process 0 holds WORKDIR/trainer.lock (host, pid, a heartbeat).

A second trainer on the same workdir refuses in one line naming the holder. A lock whose
holder is gone is taken over with a warning: on this host, a pid that no longer runs; on
another host (shared storage, where a pid cannot be checked), a heartbeat older than
`stale_seconds`; a file that is no lock record (a JSON list, a pid "abc") is nobody's and is
taken over the same way. A live pid on this host whose heartbeat stopped is refused with a
hint (the pid may be reused). A local lock is created atomically (O_EXCL); on an object store (gs://) two
trainers starting within the same second could both write it, so there it guards against a
second launch, not a race.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from absl import logging

from hybrid_nope.run import storage
from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import RunDir

HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 600.0  # Twenty missed heartbeats: the holder on another host is gone.


class WorkdirLockedError(UserError):
  pass


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process: it runs.
    return True
  return True


def _is_record(holder) -> bool:
  """Whether `holder` is a record `WorkdirLock._record` could have written."""
  def number(x, kinds=(int, float)):
    return isinstance(x, kinds) and not isinstance(x, bool)
  return (isinstance(holder, dict) and isinstance(holder.get("host"), str)
          and number(holder.get("pid"), int) and number(holder.get("heartbeat")))


class WorkdirLock:
  """Held from `acquire()` to `release()`; a daemon thread refreshes the heartbeat."""

  def __init__(self, workdir: str, *, heartbeat_seconds: float = HEARTBEAT_SECONDS,
               stale_seconds: float = STALE_SECONDS, clock=time.time):
    self.path = RunDir(workdir).lock
    self._local = storage.local_path(self.path)
    self._heartbeat_seconds, self._stale_seconds, self._clock = (heartbeat_seconds,
                                                                 stale_seconds, clock)
    self._me = {"host": socket.gethostname(), "pid": os.getpid()}
    self._stop = threading.Event()
    self._thread = None

  def _record(self) -> str:
    return json.dumps({**self._me, "heartbeat": self._clock()}) + "\n"

  def _holder(self) -> dict | None:
    """The lock's record; {} when it is not one this class writes (nobody's lock: a write is
    whole, so only another program or a hand edit leaves such a file); None if absent."""
    if self._local is not None and os.path.isdir(self._local):
      raise WorkdirLockedError(f"{self.path} is a directory, not a lock file: remove it "
                               f"(rm -r '{self.path}') and rerun")
    try:
      holder = json.loads(storage.read_text(self.path))
    except FileNotFoundError:
      return None
    except (json.JSONDecodeError, ValueError):
      return {}
    return holder if _is_record(holder) else {}

  def _stale_reason(self, holder: dict) -> str | None:
    """Why `holder` no longer holds the lock, or None if it does."""
    if not holder:
      return (f"{self.path} is not a lock record (expected JSON with host, integer pid and "
              "heartbeat)")
    if holder.get("host") == self._me["host"]:
      return None if _pid_alive(holder["pid"]) else f"pid {holder['pid']} has exited"
    age = self._clock() - holder["heartbeat"]
    return (f"its heartbeat is {age:.0f} s old (stale after {self._stale_seconds:.0f} s)"
            if age > self._stale_seconds else None)

  def _reused_pid_hint(self, pid: int, age: float) -> str:
    """A live pid whose heartbeat stopped: a trainer that hangs, or (after a reboot or a
    container restart) an unrelated process with the dead trainer's pid."""
    if age <= self._stale_seconds:
      return ""
    return (f". Its heartbeat stopped {age / 60:.0f} min ago, so pid {pid} may be an "
            f"unrelated process that reuses a dead trainer's id: if no trainer runs here, remove "
            f"'{self.path}' and rerun")

  def _ours(self, holder: dict | None) -> bool:
    return bool(holder) and {k: holder.get(k) for k in self._me} == self._me

  def _create(self) -> bool:
    """Writes the lock if there is none; False if one exists."""
    if self._local is None:
      if storage.exists(self.path):
        return False
      storage.write_text(self.path, self._record())
      return True
    try:
      fd = os.open(self._local, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(self._record())
    return True

  def acquire(self) -> None:
    if not self._create():
      holder = self._holder()
      if not self._ours(holder):  # Ours: an earlier train() of this process left it.
        why = self._stale_reason(holder)
        if why is None:
          age = self._clock() - holder["heartbeat"]
          raise WorkdirLockedError(
              f"another trainer runs on this workdir: {self.path} is held by pid "
              f"{holder['pid']} on {holder['host']} (heartbeat {age:.0f} s ago). Two trainers "
              "on one workdir write every record twice: stop the other, or use another "
              f"--workdir{self._reused_pid_hint(holder['pid'], age)}")
        logging.warning("taking over %s: %s", self.path, why)
      storage.write_text(self.path, self._record())
    self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_seconds):
      try:
        storage.write_text(self.path, self._record())
      except Exception as e:  # pylint: disable=broad-except  # The workdir is gone: the run
        logging.warning("cannot refresh %s: %s", self.path, e)  # fails on its next write.

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._ours(self._holder()):
      try:
        storage.remove(self.path)
      except FileNotFoundError:
        pass
