import os
import tempfile

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests compile the same tiny train step: share compiled programs between tests, pytest
# workers and the subprocesses they start (jax's persistent cache, keyed by program and flags).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "hybrid_nope_test_jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
