"""Decompressed copies of compressed shards, and copies of remote shards (gs://, ...), in a
local cache, each checked before it is used.

A compressed or remote shard is decompressed (or fetched) once per machine into the cache (to
a temporary name, then an atomic rename, so processes racing on one shard are safe), checked
against index.json's raw_data size and hashes, and written with a sidecar `<shard>.sha1`
holding the sha1 of the uncompressed bytes (`sha1sum -c` reads it). The first time a process
uses a cached copy it hashes it against its sidecar: a copy changed since (a flipped byte, a
bad disk) is refused, naming the file; a copy without a sidecar (left by an older version) is
made again.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from typing import BinaryIO, Callable

from hybrid_nope.data.formats.mds.encoding import MDSFormatError
from hybrid_nope.data.formats.mds.index import Shard, decompressor

SIDECAR_SUFFIX = ".sha1"
_CHUNK = 1 << 22
_verified: set[tuple] = set()  # (path, size, mtime_ns, inode) of copies this process checked
_lock = threading.Lock()


def _identity(path: str, stat: os.stat_result) -> tuple:
  return (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)


def _recorded_sha1(sidecar: str) -> str | None:
  try:
    with open(sidecar) as f:
      return f.read().split(maxsplit=1)[0]
  except (FileNotFoundError, IndexError):
    return None


def _check_copy(target: str, sidecar: str, zipped: str) -> bool:
  """True if `target` matches its sidecar; False if it has none (decompress it again)."""
  for _ in range(2):  # A second look if another process replaced the file while it was hashed.
    want = _recorded_sha1(sidecar)
    if want is None:
      return False
    with open(target, "rb") as f:
      stat = os.fstat(f.fileno())
      if _identity(target, stat) in _verified:
        return True
      got = hashlib.file_digest(f, "sha1").hexdigest()
    if got == want:
      with _lock:
        _verified.add(_identity(target, stat))
      return True
    if os.stat(target).st_ino == stat.st_ino:
      break
  raise MDSFormatError(
      f"{target} (the cached decompressed copy of {zipped}) has sha1 {got} but {sidecar} "
      f"recorded {want} when it was written: the cached copy is corrupt; delete it "
      f"(rm {target}) and it is decompressed again from {zipped}")


def cached_copy(shard: Shard, zipped: str, target: str, index_path: str,
                open_source: Callable[[], BinaryIO] | None = None,
                compressed: bool = True) -> str:
  """The verified uncompressed copy of `zipped` (shard `shard` of `index_path`) at `target`.
  `open_source` opens `zipped` (default: a local file); `compressed=False` copies it as it is
  (a remote uncompressed shard fetched into the cache)."""
  sidecar = target + SIDECAR_SUFFIX
  if (os.path.exists(target) and os.path.getsize(target) == shard.raw_bytes
      and _check_copy(target, sidecar, zipped)):
    return target
  os.makedirs(os.path.dirname(target), exist_ok=True)
  tmp = f"{target}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
  hashers = {a: hashlib.new(a) for a in shard.raw_hashes if a in hashlib.algorithms_available}
  sha1 = hashers.setdefault("sha1", hashlib.sha1())  # The sidecar's, whatever index.json lists.
  try:
    with (open_source or (lambda: open(zipped, "rb")))() as src, open(tmp, "wb") as dst:
      reader = decompressor(shard.compression)(src) if compressed else src
      written = 0
      while chunk := reader.read(_CHUNK):
        dst.write(chunk)
        for h in hashers.values():
          h.update(chunk)
        written += len(chunk)
        if written > shard.raw_bytes:
          break
    gives = "decompresses to" if compressed else "holds"
    if written != shard.raw_bytes:
      raise MDSFormatError(
          f"{zipped} {gives} {'more than ' if written > shard.raw_bytes else ''}"
          f"{written} bytes but {index_path} says {shard.raw_bytes} "
          f"(shards[{shard.number}].raw_data.bytes)")
    for algo, expected in shard.raw_hashes.items():
      if algo in hashers and hashers[algo].hexdigest() != expected:
        raise MDSFormatError(f"{zipped} {gives} data whose {algo} is "
                             f"{hashers[algo].hexdigest()}, but {index_path} says {expected}")
    with open(tmp + SIDECAR_SUFFIX, "w") as f:
      f.write(f"{sha1.hexdigest()}  {os.path.basename(target)}\n")
    os.replace(tmp + SIDECAR_SUFFIX, sidecar)  # Before the copy: a copy never lacks its sidecar.
    with _lock:
      _verified.add(_identity(target, os.stat(tmp)))  # The inode and times survive the rename.
    os.replace(tmp, target)  # Atomic; a racing process renames identical bytes.
  except Exception as e:
    for path in (tmp, tmp + SIDECAR_SUFFIX):
      if os.path.exists(path):
        os.unlink(path)
    if isinstance(e, MDSFormatError):
      raise
    raise MDSFormatError(f"cannot {'decompress' if compressed else 'fetch'} {zipped} "
                         f"({shard.compression or 'uncompressed'}): {e}") from e
  return target
