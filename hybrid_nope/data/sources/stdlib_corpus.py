"""The embedded demo corpus: the running interpreter's own standard-library `.py` files.

Every Python install carries ~30 MB of real source code, so `make demo` and the tests train on
real text with nothing to download. One file is one document. The list is sorted by relative
path and the train/eval split hashes that path with zlib.crc32 (Python's hash() is salted per
process), so the same interpreter always gives the same documents in the same order.
"""

import functools
import os
import pathlib
import sysconfig
import zlib

SPLITS = ("train", "eval")
# Third-party code installed next to the stdlib is not part of the corpus.
_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", ".venv"})


def stdlib_root() -> pathlib.Path:
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=1)
def _all_documents() -> tuple[tuple[str, bytes], ...]:
  """(relative posix path, file bytes) for every stdlib .py file, sorted by path.

  Cached because both splits and every seq_len read the same files.
  """
  root = stdlib_root()
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
    paths.extend(pathlib.Path(dirpath, f) for f in filenames if f.endswith(".py"))
  if not paths:
    raise FileNotFoundError(
        f"no .py files found under the stdlib directory {root} "
        f"(sysconfig.get_paths()['stdlib']); the embedded corpus needs the stdlib sources")
  docs = [(p.relative_to(root).as_posix(), p.read_bytes()) for p in paths]
  return tuple(sorted(docs))


def is_eval_path(relative_path: str, eval_fraction: float) -> bool:
  """Deterministic split: a path is eval iff its crc32 falls in the lowest eval_fraction."""
  return zlib.crc32(relative_path.encode("utf-8")) < eval_fraction * 2**32


def documents(split: str, eval_fraction: float) -> list[tuple[str, bytes]]:
  """The (relative path, bytes) documents of `split`, sorted by relative path."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got split={split!r}")
  if not 0.0 < eval_fraction < 1.0:
    raise ValueError(f"eval_fraction must be in the open interval (0, 1), got {eval_fraction!r}")
  want_eval = split == "eval"
  docs = [d for d in _all_documents() if is_eval_path(d[0], eval_fraction) == want_eval]
  if not docs:
    raise ValueError(
        f"eval_fraction={eval_fraction} leaves the {split!r} split of the stdlib corpus "
        f"({len(_all_documents())} files under {stdlib_root()}) empty")
  return docs
