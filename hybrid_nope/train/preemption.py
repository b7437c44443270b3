"""SIGTERM (how Cloud TPU and SLURM announce preemption) or Ctrl-C -> save, then exit.

Between steps the signal sets a flag that the loop reads at the next step boundary. During
work that does not change the train state and may take minutes (an eval, the recency hook),
the loop opens an `interruptible()` section: a signal there stops the work at once, with
`Interrupted`, and the loop saves the state it holds, so a spot VM's notice of ~30 s is
enough. Writes inside such a section (the metrics writer's methods) run `deferred()`: a signal
there raises once the write is whole, since a TensorBoard queue cut mid-put hangs at close.
A second Ctrl-C aborts without saving: KeyboardInterrupt, which `hybrid_nope.cli` prints as one
line with exit code 130 (a third one cuts short the cleanup on the way out, should it hang).
"""
from __future__ import annotations

import contextlib
import signal
import threading

import jax
from absl import logging


class Interrupted(Exception):
  """Raised inside an interruptible section when a stop signal arrives."""


class PreemptionWatcher:
  """Single process: the handlers set a flag. Several processes: JAX's preemption sync service
  (started by jax.distributed.initialize) makes every process stop at the same step, through
  orbax's CheckpointManager.reached_preemption; there a section is not cut short, since one
  process leaving a collective early would hang the others."""

  def __init__(self):
    self._signalled = threading.Event()
    self._interruptible = False
    self._deferring = 0      # > 0 inside deferred(): a signal raises at its end instead.
    self._raise_pending = False
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._on_signal)

  def _on_signal(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if signum == signal.SIGINT and self._signalled.is_set():
      raise KeyboardInterrupt(  # The second Ctrl-C: abort now (cli.run: one line, exit 130).
          "Ctrl-C twice: stopped at once, without saving this step; the checkpoints already "
          "written are kept: rerun the same command to go on from the newest")
    self._signalled.set()
    if self._interruptible and jax.process_count() == 1:
      if self._deferring:
        self._raise_pending = True
        return
      logging.warning("%s received: stopping this eval or hook, checkpointing, then exiting "
                      "(Ctrl-C again aborts without saving)", name)
      raise Interrupted(name)
    logging.warning("%s received: checkpointing at the next step boundary, then exiting "
                    "(Ctrl-C again aborts without saving)", name)

  @property
  def signalled(self) -> bool:
    return self._signalled.is_set()

  @contextlib.contextmanager
  def interruptible(self):
    """A section a stop signal cuts short (raising Interrupted); also raises at entry when a
    signal came before it."""
    if self._signalled.is_set() and jax.process_count() == 1:
      raise Interrupted("signalled before")
    self._interruptible, self._raise_pending = True, False
    try:
      yield
    finally:
      self._interruptible = False

  @contextlib.contextmanager
  def deferred(self):
    """A region a signal must not cut (a record or TensorBoard write inside a hook): an
    interruption due in it is raised when it ends."""
    self._deferring += 1
    try:
      yield
    finally:
      self._deferring -= 1
    if not self._deferring and self._raise_pending and self._interruptible:
      self._raise_pending = False
      logging.warning("stop signal received: stopping this eval or hook, checkpointing, then "
                      "exiting (Ctrl-C again aborts without saving)")
      raise Interrupted("signal during a write")

  def should_stop(self, step: int, checkpoint_manager) -> bool:
    if jax.process_count() > 1:
      return checkpoint_manager.reached_preemption(step)
    return self._signalled.is_set()

  def close(self) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
