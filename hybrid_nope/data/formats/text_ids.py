"""Every document's token ids of a text source, tokenised once and kept beside its length index,
so training rows are slices of a memory-mapped array and no document is tokenised again.

A tokenizer.json tokenises at ~0.1-0.2M tokens/s per core: re-tokenising each document a row
overlaps held the whole pipeline to that rate, while a slice of cached ids costs a copy. The ids
are written while text_index builds the index (the scan tokenises every document anyway), as
one flat array of all documents in index order (document d is ids[starts[d]:starts[d + 1]],
starts the cumulative sum of the index's lengths), raw little-endian uint16 where the
vocabulary fits in 2**16 ids, else uint32. The file is named by the index's own key (files'
stamps, text field, tokenizer identity, layout version) with the dtype, so ids of other data
or another tokenizer are never found, and a file of the wrong size is refused (the index and
its ids are built again, said in one warning). The index records the ids' sha256, hashed as
they are written; data.verify_hashes="always" hashes the file again at every start and builds
anew on a difference, as for the wrong size.

The byte tokenizer caches none: its encoding is a copy of the text's bytes (rows read at
millions of tokens/s without a cache), and its ids would take twice the text's disk space.
Where the cache directory cannot be written, the ids are not kept and rows tokenise each
document on the fly (slower; said in one warning), as they do for the byte tokenizer.
"""
from __future__ import annotations

import hashlib
import logging
import os
import uuid

import numpy as np

from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer

_log = logging.getLogger(__name__)


def caches(tokenizer) -> bool:
  """Whether `tokenizer`'s ids are cached (all but the byte tokenizer: module docstring)."""
  return not isinstance(tokenizer, ByteTokenizer)


def dtype(tokenizer) -> np.dtype:
  """The narrowest unsigned dtype holding every id of `tokenizer`, little-endian."""
  return np.dtype("<u2" if tokenizer.vocab_size <= 1 << 16 else "<u4")


def path(index_path: str, tokenizer) -> str:
  """The ids file beside the index at `index_path` (.../KEY.npz -> .../KEY.ids-uint16)."""
  return f"{os.path.splitext(index_path)[0]}.ids-{dtype(tokenizer).name}"


class Writer:
  """Appends each scanned batch's ids to a staging file; `finish` renames it into place. A
  cache directory it cannot write leaves `failed` set and nothing cached (rows then tokenise
  on the fly)."""

  def __init__(self, final_path: str, tokenizer):
    self.path, self.dtype = final_path, dtype(tokenizer)
    self.limit = np.iinfo(self.dtype).max
    self.staging = f"{final_path}.tmp-{uuid.uuid4().hex[:8]}"
    self.failed, self._file, self._hash = None, None, hashlib.sha256()
    try:
      os.makedirs(os.path.dirname(final_path), exist_ok=True)
      self._file = open(self.staging, "wb")  # pylint: disable=consider-using-with
    except OSError as e:
      self.failed = e

  def append(self, batch: list[np.ndarray]) -> None:
    if self._file is None or not batch:
      return
    ids = np.concatenate(batch)
    if ids.size and (ids.min() < 0 or ids.max() > self.limit):  # Never wrapped silently.
      raise ValueError(f"token id {int(ids.max() if ids.max() > self.limit else ids.min())} "
                       f"does not fit the ids cache's {self.dtype.name}")
    data = ids.astype(self.dtype).tobytes()
    self._hash.update(data)
    try:
      self._file.write(data)
    except OSError as e:  # A full disk: nothing cached, the run goes on tokenising on the fly.
      self.failed = e
      self.discard()

  @property
  def sha256(self) -> str:
    """The hex sha256 of the ids written; "" where none were kept."""
    return "" if self.failed is not None else self._hash.hexdigest()

  def discard(self) -> None:
    """Closes and removes the staging file (a failed write, or a scan that failed)."""
    if self._file is not None:
      self._file.close()
      self._file = None
    try:
      os.remove(self.staging)
    except OSError:
      pass

  def finish(self, num_tokens: int) -> np.ndarray | None:
    """The written ids, memory-mapped from their final path; None where they could not be
    written (warned)."""
    if self._file is not None:
      try:
        self._file.close()
        self._file = None
        os.replace(self.staging, self.path)  # Atomic: a racing process renames identical ids.
      except OSError as e:
        self.failed = e
        self.discard()
    if self.failed is not None:
      _log.warning("cannot cache the token ids at %s (%s): every row tokenises its documents "
                   "again (slower)", self.path, self.failed)
      return None
    return load(self.path, num_tokens, self.dtype)


def file_sha256(ids_path: str) -> str:
  h = hashlib.sha256()
  with open(ids_path, "rb") as f:
    while chunk := f.read(1 << 22):
      h.update(chunk)
  return h.hexdigest()


def load(ids_path: str, num_tokens: int, ids_dtype: np.dtype,
         expected_sha256: str | None = None) -> np.ndarray | None:
  """The ids at `ids_path` (read-only memmap, [num_tokens]); None if absent, not of that size,
  or (where `expected_sha256` is given) of other content: warned, the caller builds anew."""
  try:
    size = os.path.getsize(ids_path)
  except OSError:
    return None
  if size != num_tokens * ids_dtype.itemsize:
    _log.warning("token ids %s hold %d bytes, not the %d its index's %d tokens need: building "
                 "the index and its ids again", ids_path, size, num_tokens * ids_dtype.itemsize,
                 num_tokens)
    return None
  if expected_sha256 is not None and (found := file_sha256(ids_path)) != expected_sha256:
    _log.warning("token ids %s have sha256 %s, not the %s recorded when they were written: "
                 "building the index and its ids again", ids_path, found, expected_sha256)
    return None
  if not num_tokens:  # np.memmap refuses an empty file.
    return np.zeros(0, ids_dtype)
  return np.memmap(ids_path, dtype=ids_dtype, mode="r", shape=(num_tokens,))
