"""quiet_library_logs: orbax's, grain's and tfds' INFO lines go, their warnings and ours stay."""
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
  assert not keep(record("/site-packages/tensorflow_datasets/core/dataset_info.py", logging.INFO))
  assert keep(record("/site-packages/orbax/checkpoint/x.py", logging.WARNING))
  assert keep(record("/work/hybrid_nope/train/loop.py", logging.INFO))


def message(pathname, level, msg):
  return logging.LogRecord("x", level, pathname, 1, msg, None, None)


NOISE = [("/site-packages/jax/_src/xla_bridge.py", logging.INFO,
          "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so"),
         ("/site-packages/orbax/checkpoint/_src/metadata/checkpoint.py", logging.WARNING,
          "Metadata file does not exist: %s"),
         ("/site-packages/orbax/checkpoint/checkpoint_manager.py", logging.WARNING,
          "Given directory is read only=%s")]


def test_jax_and_orbax_noise_is_quiet_at_the_default_verbosity_and_shown_at_debug():
  # Issue 38 case 9: every refusal also printed jax's TPU probe line, and score/analyze
  # printed orbax's metadata warnings, hiding the one line. cli.run applies the filter.
  quiet_library_logs()
  filters = [f for f in absl_logging.get_absl_handler().filters
             if type(f).__name__ == "_LibraryInfoFilter"]
  keep = lambda r: all(f.filter(r) for f in filters)
  # The absl logger's own level, not get_verbosity(): restoring the verbosity would pin the
  # logger at its effective level (WARNING before flags are parsed), and later tests' INFO
  # records through absl would never reach their caplog.
  before = logging.getLogger("absl").level
  try:
    absl_logging.set_verbosity(absl_logging.INFO)
    assert not any(keep(message(*noise)) for noise in NOISE)
    assert keep(message("/site-packages/orbax/checkpoint/x.py", logging.WARNING, "other"))
    assert keep(message("/site-packages/jax/_src/xla_bridge.py", logging.WARNING,
                        "An NVIDIA GPU may be present on this machine"))
    absl_logging.set_verbosity(absl_logging.DEBUG)  # --verbosity=1
    assert all(keep(message(*noise)) for noise in NOISE)
  finally:
    logging.getLogger("absl").setLevel(before)


def test_the_noise_is_quiet_where_no_absl_app_runs(tmp_path):
  """A script or notebook that calls loop.train (which quiets the libraries) without absl's app:
  orbax's records go from the "absl" logger to Python's own handlers, not absl's."""
  import subprocess
  import sys
  from tests.helpers import REPO
  script = f"""
import logging
logging.basicConfig()  # A notebook's or script's own logging set-up.
from hybrid_nope.logs import quiet_library_logs
quiet_library_logs()
absl = logging.getLogger("absl")
for pathname, level, msg in {NOISE[1:]!r} + [("/x/orbax/checkpoint/y.py", logging.WARNING,
                                               "orbax's other warning")]:
  absl.handle(logging.LogRecord("absl", level, pathname, 1, msg, None, None))
"""
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stderr.splitlines() == ["WARNING:absl:orbax's other warning"]
