"""The one object a process holds for its run directory, opened once and handed on.

  with run.open(workdir, config) as r:    # the workdir checked, then locked to this trainer
    plan = r.plan_resume(replicated)      # the checkpointer opened, the owner claimed, the
    writer = r.open_writer(start_step)    #   resume planned; the records opened at the start

The read side is `run.open_readonly` (run/reader.py). Train, analysis, export and sweep receive
these objects, never a workdir string to rebuild the layout from (`run_dir.RunDir` is built in
run/ alone).
"""
from __future__ import annotations

import contextlib

import jax

from hybrid_nope.run import resume
from hybrid_nope.run.checkpoint import Checkpointer
from hybrid_nope.run.metrics_writer import MetricsWriter
from hybrid_nope.run.run_dir import RunDir
from hybrid_nope.run.wandb_sink import WandbSink
from hybrid_nope.run.workdir_check import check_workdir
from hybrid_nope.run.workdir_lock import WorkdirLock


class Run:
  """A run opened for training (`open`): its layout, then the checkpointer and the resume plan
  (`plan_resume`), then the records (`open_writer`)."""

  def __init__(self, workdir: str, config):
    self.workdir, self.config = workdir, config
    self.layout = RunDir(workdir, config.checkpoint.directory)
    self.checkpointer: Checkpointer | None = None
    self.plan: resume.ResumePlan | None = None

  def plan_resume(self, replicated=None) -> resume.ResumePlan:
    """Opens the checkpointer (`replicated`: the mesh's replicated sharding) and plans the resume
    (`resume.plan`, which claims the checkpoint directory's owner); the checkpointer is closed
    again if planning fails."""
    c = self.config.checkpoint
    self.checkpointer = Checkpointer(self.workdir, keep=c.keep, directory=c.directory,
                                     replicated=replicated)
    try:
      self.plan = resume.plan(self.config, self.workdir, self.checkpointer)
    except BaseException:
      self.checkpointer.close()
      raise
    return self.plan

  def open_writer(self, start_step: int) -> MetricsWriter:
    """The records from `start_step` on (metrics, TensorBoard, W&B), with the plan's new events
    (start, allowed changes, rollbacks) written first."""
    writer = MetricsWriter(self.workdir, resume_step=start_step,
                           wandb=WandbSink(self.config, self.workdir))
    resume.record(self.workdir, self.config, self.plan.new_events, writer)
    return writer


@contextlib.contextmanager
def open(workdir: str, config):  # pylint: disable=redefined-builtin
  """A `Run` of `workdir`, checked (`check_workdir`) and locked to this trainer while open; only
  process 0 holds the lock, the other processes share its run."""
  check_workdir(workdir, config.checkpoint.directory)
  lock = WorkdirLock(workdir) if jax.process_index() == 0 else None
  try:
    if lock is not None:
      lock.acquire()
    yield Run(workdir, config)
  finally:
    if lock is not None:
      lock.release()
