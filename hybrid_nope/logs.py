"""Log settings every launch script shares (`cli.run` applies them before main).

At the default verbosity stderr carries the run's own lines and the one line of an error:
orbax's, grain's and tensorflow_datasets' INFO chatter, jax's probe for a TPU backend this machine lacks and orbax's
warnings about a checkpoint opened read-only are dropped (`--verbosity=1` shows them all).
What orbax's save threads print when a save fails goes to a file of the run instead
(`run/library_errors.py`).
"""
from __future__ import annotations

import logging as std_logging

from absl import logging

_LIBRARIES = ("/orbax/", "/grain/", "/tensorflow_datasets/")  # tfds: "Load dataset info ..."
# (where a record comes from, how its message starts): noise that hides the one line. jax
# probes every backend it knows of; orbax's readers open a checkpoint read-only and say so.
_NOISE = (("/jax/_src/xla_bridge.py", "Unable to initialize backend"),
          ("/orbax/", "Metadata file does not exist"),
          ("/orbax/", "Given directory is read only"))


class _LibraryInfoFilter(std_logging.Filter):
  """Drops INFO chatter of checkpoint and data libraries (orbax logs every file it writes) and,
  unless the verbosity is DEBUG, the lines of _NOISE."""

  def filter(self, record):
    if record.levelno < std_logging.WARNING and any(lib in record.pathname
                                                    for lib in _LIBRARIES):
      return False
    return logging.level_debug() or not any(
        where in record.pathname and str(record.msg).startswith(start)
        for where, start in _NOISE)


def quiet_library_logs():
  """On absl's handler (what launch scripts print through, records of every logger) and on the
  "absl" logger itself, which orbax logs to: where no absl app runs (a notebook or script
  calling loop.train), its records reach Python's own handlers without absl's."""
  for where in (logging.get_absl_handler(), std_logging.getLogger("absl")):
    if not any(isinstance(f, _LibraryInfoFilter) for f in where.filters):
      where.addFilter(_LibraryInfoFilter())
