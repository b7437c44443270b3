"""A run's directory: its layout, storage, config file and history, checkpoints (save, restore,
integrity, owner), the lock, resume and identity, the records (metrics, TensorBoard, W&B) and the
read-only side analysis and export use. Imports no model, train or analysis code.

`run.open(workdir, config)` and `run.open_readonly(workdir)` (run/handle.py, run/reader.py) give the one object
a process holds for its run.
"""


def __getattr__(name):
  # Lazily: data/ reads files through run.storage, and should not load orbax and jax with it.
  if name in ("open", "Run"):
    from hybrid_nope.run import handle  # pylint: disable=g-import-not-at-top
    return getattr(handle, name)
  if name in ("open_readonly", "RunReader"):
    from hybrid_nope.run import reader  # pylint: disable=g-import-not-at-top
    return getattr(reader, name)
  raise AttributeError(f"module 'hybrid_nope.run' has no attribute {name!r}")
