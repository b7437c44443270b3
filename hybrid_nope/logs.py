"""Log settings every launch script shares."""
from __future__ import annotations

import logging as std_logging

from absl import logging


class _LibraryInfoFilter(std_logging.Filter):
  """Drops INFO chatter of checkpoint and data libraries (orbax logs every file it writes)."""

  def filter(self, record):
    return record.levelno >= std_logging.WARNING or not any(
        lib in record.pathname for lib in ("/orbax/", "/grain/"))


def quiet_library_logs():
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _LibraryInfoFilter) for f in handler.filters):
    handler.addFilter(_LibraryInfoFilter())
