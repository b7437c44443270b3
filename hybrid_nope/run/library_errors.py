"""What orbax's save threads print when a save fails (a full disk: a traceback per thread, and
tensorstore's callbacks into a closed event loop) moved into a file of the run, announced once;
the save's own error names the file (run/checkpoint.py)."""
from __future__ import annotations

import logging as std_logging
import os
import sys
import tempfile
import threading

from hybrid_nope.run import storage


def _closed_loop(exc_value) -> bool:
  """tensorstore's completion callback finding orbax's event loop closed after a failed save."""
  return isinstance(exc_value, RuntimeError) and str(exc_value) == "Event loop is closed"


class LibraryErrors(std_logging.Filter):
  """While open, orbax's ERROR records and the 'Event loop is closed' tracebacks go to `path`
  (a local file; for a URL, a local temporary file), not stderr; whoever opened it names the
  file (`where()`) in the error line the failure raises. Writes that fail (the disk that failed
  the save may hold it) are counted, never raised: `where()` then says so."""

  def __init__(self, path: str):
    super().__init__()
    self.path = storage.local_path(path) or os.path.join(
        tempfile.gettempdir(), f"hybrid_nope_{os.path.basename(path)}_{os.getpid()}")
    self.written = self.lost = 0
    self._why_lost = ""
    self._lock = threading.Lock()
    self._format = std_logging.Formatter("%(asctime)s %(levelname)s %(pathname)s:%(lineno)d "
                                         "[%(threadName)s] %(message)s").format
    self._previous_hook = None

  def open(self) -> "LibraryErrors":
    if self._previous_hook is None:
      std_logging.getLogger("absl").addFilter(self)  # orbax logs through absl's logger.
      self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
    return self

  def close(self) -> None:
    if self._previous_hook is not None:
      std_logging.getLogger("absl").removeFilter(self)
      sys.unraisablehook, self._previous_hook = self._previous_hook, None

  def filter(self, record):
    if record.levelno < std_logging.ERROR or "/orbax/" not in record.pathname:
      return True
    self._write(self._format(record))
    return False

  def _unraisable(self, unraisable):
    if not _closed_loop(unraisable.exc_value):
      self._previous_hook(unraisable)
      return
    import traceback  # pylint: disable=g-import-not-at-top
    self._write("".join(traceback.format_exception(unraisable.exc_type, unraisable.exc_value,
                                                   unraisable.exc_traceback)).rstrip())

  def _write(self, text: str) -> None:
    with self._lock:
      try:
        with open(self.path, "a") as f:
          f.write(text + "\n")
        self.written += 1
      except OSError as e:
        self.lost += 1
        self._why_lost = e.strerror or str(e)

  @property
  def diverted(self) -> int:
    return self.written + self.lost

  def where(self) -> str:
    """Where the tracebacks are, for the one line of the error that stops the run."""
    if self.lost:
      return (f"orbax's tracebacks could not be written to {self.path} "
              f"({self._why_lost}); {self.written} of {self.written + self.lost} were")
    return f"orbax's tracebacks are in {self.path}"
