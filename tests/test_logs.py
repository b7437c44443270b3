"""quiet_library_logs: orbax's and grain's INFO lines go, their warnings and ours stay."""
import logging

from absl import logging as absl_logging

from hybrid_nope.logs import quiet_library_logs


def record(pathname, level):
  return logging.LogRecord("x", level, pathname, 1, "message", None, None)


def test_library_info_is_dropped_and_everything_else_kept():
  quiet_library_logs()
  quiet_library_logs()  # Idempotent: one filter.
  handler = absl_logging.get_absl_handler()
  filters = [f for f in handler.filters if type(f).__name__ == "_LibraryInfoFilter"]
  assert len(filters) == 1
  keep = lambda r: all(f.filter(r) for f in filters)
  assert not keep(record("/site-packages/orbax/checkpoint/x.py", logging.INFO))
  assert not keep(record("/site-packages/grain/_src/y.py", logging.INFO))
  assert keep(record("/site-packages/orbax/checkpoint/x.py", logging.WARNING))
  assert keep(record("/work/hybrid_nope/train/loop.py", logging.INFO))
