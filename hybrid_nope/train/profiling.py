"""`train.profile_start_step` / `train.profile_steps`: a jax.profiler trace of those steps in
DIR/profile/ (TensorBoard's profile plugin or Perfetto read it). The profiler writes to a local
directory; a URL workdir gets the trace copied up when it stops."""
from __future__ import annotations

import os
import tempfile

import jax
from absl import logging

from hybrid_nope.run import storage


class StepProfiler:
  """Starts a trace before step `start` runs and stops it after step start + steps − 1."""

  def __init__(self, target: str, start: int, steps: int):
    """`target`: the run's profile directory (`Run.layout.profile`)."""
    self.start, self.stop = start, start + steps - 1
    self.target = target
    self.local = storage.local_path(self.target)
    self.active = False

  def before(self, step: int) -> None:
    if self.stop >= self.start > 0 and step == self.start:
      directory = self.local or tempfile.mkdtemp(prefix="hybrid_nope_profile_")
      os.makedirs(directory, exist_ok=True)
      jax.profiler.start_trace(directory)
      self.active, self.directory = True, directory

  def after(self, step: int, wait_for) -> None:
    """Ends the trace after step `stop`, once `wait_for` (its outputs) is computed."""
    if self.active and step == self.stop:
      jax.block_until_ready(wait_for)
      self.close()

  def close(self) -> None:
    if not self.active:
      return
    jax.profiler.stop_trace()
    self.active = False
    if self.local is None:
      storage.copy_tree(self.directory, self.target)
    logging.info("profiled steps %d-%d into %s", self.start, self.stop, self.target)
