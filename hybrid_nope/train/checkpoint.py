"""Orbax checkpoints holding the train state and the data iterator's position."""
from __future__ import annotations

import os

import grain
import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves {"state": TrainState, "data": grain iterator state} under DIR/checkpoints/<step>."""

  def __init__(self, workdir: str, *, keep: int, directory: str = ""):
    """`directory` (config checkpoint.directory) defaults to WORKDIR/checkpoints; a gs:// path
    lets every host of a pod write its shards to shared storage."""
    directory = directory or os.path.join(workdir, "checkpoints")
    self.directory = directory if "://" in directory else os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=("state", "data"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state, data_iterator) -> None:
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iterator)))

  def restore(self, step: int, abstract_state, data_iterator):
    """Returns the restored state; `data_iterator` is moved to the saved position in place."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=grain.checkpoint.CheckpointRestore(data_iterator)))
    return restored["state"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def abstract(tree):
  """Shapes, dtypes and shardings of a pytree, the target orbax restores into."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
