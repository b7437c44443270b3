"""The read side of a run, for analysis, export and sweep: `open_readonly(workdir)` gives its
layout, its config in force and its checkpoints' params by step, and writes nothing.

  reader = run.open_readonly(workdir)
  step, params = reader.restore_params(wanted, step)   # wanted: the config's abstract params

orbax and jax are imported only when a checkpoint or the config is read, so listing a run's
records (sweep, the results page) stays light.
"""
from __future__ import annotations

from hybrid_nope.run.run_dir import RunDir


class RunReader:
  """A run read and never written (`open_readonly`): its layout, its config in force (read when
  first asked for), and its checkpoints' steps and params."""

  def __init__(self, workdir: str, config=None):
    self.workdir, self._config = workdir, config
    self.layout = RunDir(workdir)  # Records; checkpoints are `checkpoint_layout`'s.

  @property
  def config(self):
    if self._config is None:
      from hybrid_nope.run import checkpoints  # pylint: disable=g-import-not-at-top
      self._config = checkpoints.load_config(self.workdir)
    return self._config

  @property
  def checkpoint_layout(self) -> RunDir:
    """The layout with the config's checkpoint.directory (a gs://... of its own, or
    WORKDIR/checkpoints)."""
    from hybrid_nope.run import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.run_dir_of(self.workdir, self.config)

  def steps(self) -> list[int]:
    from hybrid_nope.run import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.available_steps(self.workdir, self.config)

  def restore_params(self, wanted, step: int | None = None) -> tuple[int, dict]:
    """(step, params) shaped as `wanted` (`checkpoints.restore_params`)."""
    from hybrid_nope.run import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.restore_params(self.workdir, self.config, wanted, step)

  def with_config(self, config) -> RunReader:
    """The same run read with `config` (its own with analysis overrides) in force."""
    return RunReader(self.workdir, config)

  def tokenizer_path(self, given: str | None = None) -> str | None:
    from hybrid_nope.run import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.tokenizer_path(self.workdir, given)


def open_readonly(workdir: str, config=None) -> RunReader:
  """A reader of `workdir`; `config` (e.g. with analysis overrides) instead of the run's own."""
  return RunReader(workdir, config)
