import logging
import sys

from hybrid_nope.run.library_errors import LibraryErrors
from tests.test_logs import message


def test_orbax_errors_and_closed_loop_tracebacks_go_to_the_file_and_writes_that_fail_are_said(
    tmp_path):
  orbax_error = message("/site-packages/orbax/checkpoint/_src/futures/future.py",
                        logging.ERROR, "_SignalingThread.run() raised an exception")
  errors = LibraryErrors(str(tmp_path / "library_errors.log")).open()
  try:
    assert not errors.filter(orbax_error)  # Kept off stderr...
    assert errors.filter(message("/work/hybrid_nope/train/loop.py", logging.ERROR, "ours"))
    try:
      raise RuntimeError("Event loop is closed")
    except RuntimeError as e:
      sys.unraisablehook(type("U", (), {"exc_type": RuntimeError, "exc_value": e,
                                        "exc_traceback": e.__traceback__})())
  finally:
    errors.close()
  text = (tmp_path / "library_errors.log").read_text()  # ...and in the file.
  assert "_SignalingThread.run() raised" in text and "Event loop is closed" in text
  assert errors.where() == f"orbax's tracebacks are in {tmp_path / 'library_errors.log'}"
  assert sys.unraisablehook is not errors._unraisable  # Closed: the hook restored.
  (tmp_path / "gone").mkdir()
  lost = LibraryErrors(str(tmp_path / "gone" / "library_errors.log")).open()
  (tmp_path / "gone").rmdir()
  lost.filter(orbax_error)
  lost.close()
  assert lost.where().startswith("orbax's tracebacks could not be written to ") \
      and "(No such file or directory); 0 of 1 were" in lost.where()
