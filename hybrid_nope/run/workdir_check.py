"""A --workdir checked before anything is built: a directory (local, file:// or another fsspec
URL) this process can create and write, with room for the run's records."""
from __future__ import annotations

import os
import shutil

from absl import logging

from hybrid_nope.errors import ConfigError
from hybrid_nope.run import storage

ORBAX_URL_SCHEMES = ("gs://",)  # Where orbax writes checkpoints itself (besides local paths).


def check_workdir(workdir: str, checkpoint_directory: str = "") -> None:
  """The workdir must be a directory (local, file:// or another fsspec URL such as gs://) this
  process can create and write; checked before any model is built so a bad --workdir fails in a
  line, not after the set-up. Checkpoints go to WORKDIR/checkpoints unless
  checkpoint.directory is set, which orbax must be able to write. A memory:// workdir (tests)
  is allowed with a warning: it lives in this process, and its records vanish at exit."""
  if not isinstance(workdir, str) or not workdir:
    raise ConfigError(f"--workdir={workdir!r} is invalid: expected a directory path")
  if workdir.startswith("memory://"):
    logging.warning("--workdir=%s is in this process's memory: its records, config and "
                    "TensorBoard events vanish when the run exits (use a local path or gs:// "
                    "for a run to keep)", workdir)
  local = storage.local_path(workdir)
  if (local is None and not checkpoint_directory
      and not workdir.startswith(ORBAX_URL_SCHEMES)):
    raise ConfigError(f"--workdir={workdir}: orbax cannot write checkpoints under this URL "
                      f"scheme; set --config.checkpoint.directory to a local path or gs://")
  if local is None:
    try:
      storage.makedirs(workdir)
      storage.probe_write(workdir)
    except Exception as e:  # fsspec backends raise their own kinds.
      raise ConfigError(f"--workdir={workdir} is not writable by this process: {e}") from None
    return
  workdir = local
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir={workdir} is a file: expected a directory (new or existing)")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"--workdir={workdir} cannot be created: {e.strerror}") from None
  try:
    storage.probe_write(workdir)
  except OSError as e:
    raise ConfigError(f"--workdir={workdir} is not writable by this process: {e.strerror}") from None
  free = shutil.disk_usage(workdir).free
  if free < RECORDS_ROOM:
    raise ConfigError(f"--workdir={workdir} has {free / 2**20:.1f} MiB free: a run's records "
                      f"(metrics, recency and its sums, TensorBoard) need at least "
                      f"{RECORDS_ROOM / 2**20:.0f} MiB there; free space on that disk or use "
                      "another --workdir")


# The free space a local workdir must have before a run starts, so a full disk refuses in one
# line before step 0 rather than as an OSError from a hook later. A run's records are small
# beside it: the small sweep's 640-step run wrote 1.7 MiB (21 measurements, docs/scaling.md).
# The checkpoints' own room is Checkpointer.expected_size_warning's.
RECORDS_ROOM = 64 * 2**20
