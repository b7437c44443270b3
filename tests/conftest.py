import os
import tempfile

from hybrid_nope import xla_flags

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests compile the same tiny train step: share compiled programs between tests, pytest
# workers and the subprocesses they start (jax's persistent cache, keyed by program and flags).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "hybrid_nope_test_jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
# LLVM's optimisation of XLA's CPU code is much of a tiny program's compile time, and the
# programs run for milliseconds: tests compile at level 0 (14% less CPU on two test modules).
# Subprocesses inherit it (tests/helpers.py: xla_flags).
xla_flags.set_in_environ("--xla_backend_optimization_level", 0)


def pytest_collection_modifyitems(config, items):
  """Modules that hold a `long` test run first. pytest-xdist hands each worker a first block of
  tests and shares the rest out as workers free up, so a long test collected late would leave one
  worker running it alone at the end. Whole modules move, keeping their module fixtures together."""
  module = lambda item: getattr(item, "module", None)
  long_modules = {module(item) for item in items if item.get_closest_marker("long")}
  items.sort(key=lambda item: module(item) not in long_modules)  # A stable sort.
