"""SIGTERM (how Cloud TPU and SLURM announce preemption) -> save at the next step boundary."""
from __future__ import annotations

import signal
import threading

import jax
from absl import logging


class PreemptionWatcher:
  """Single process: a SIGTERM handler sets a flag. Several processes: JAX's preemption sync
  service (started by jax.distributed.initialize) makes every process stop at the same step,
  through orbax's CheckpointManager.reached_preemption."""

  def __init__(self):
    self._signalled = threading.Event()
    self._previous = None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM received: checkpointing at the next step boundary, then exiting")
    self._signalled.set()

  def should_stop(self, step: int, checkpoint_manager) -> bool:
    if jax.process_count() > 1:
      return checkpoint_manager.reached_preemption(step)
    return self._signalled.is_set()

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
