"""The length index of a text source: every document's token count (and a JSON Lines file's
line offsets), so row k of the packed stream is found without reading what precedes it.

Built by one read of every file (text_files' `scan`), tokenising each document with the
configured tokenizer, and kept in the cache directory (data.cache_dir, else the MDS cache's,
under text-index/) as one .npz named by a hash of the files' identities (fsspec's ukey: path,
size, modification time or object generation), the text field and the tokenizer's identity:
a changed file, field or tokenizer builds a new index; a start on the same data reads it back
in milliseconds. Measured figures: benchmarks/data.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
import uuid

import numpy as np

VERSION = 1  # Of the .npz layout and of what the index means; a change builds anew.
SUBDIR = "text-index"
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TextIndex:
  counts: np.ndarray   # int64 [F]: documents per file
  lengths: np.ndarray  # int64 [N]: tokens per document, files in order (N = counts.sum())

  @property
  def file_starts(self) -> np.ndarray:  # int64 [F + 1]: each file's first document
    return np.concatenate([[0], np.cumsum(self.counts)])


def _key(readers, tokenizer, field: str) -> str:
  identity = {"version": VERSION, "field": field, "tokenizer": tokenizer.identity,
              "files": [[type(r).__name__, r.name, r.fs.ukey(r.path)] for r in readers]}
  return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def _load(path: str, readers) -> TextIndex | None:
  """The cached index, its JSON Lines offsets handed to their readers; None if absent or not
  consistent (then it is built again)."""
  try:
    with np.load(path) as z:
      counts, lengths, offsets = z["counts"], z["lengths"], z["offsets"]
  except FileNotFoundError:
    return None
  except (OSError, ValueError, KeyError) as e:
    _log.warning("text index %s is unreadable (%s): building it again", path, e)
    return None
  jsonl = [r for r in readers if hasattr(r, "offsets")]
  if (counts.shape != (len(readers),) or lengths.shape != (int(counts.sum()),)
      or offsets.shape != (sum(int(c) + 1 for r, c in zip(readers, counts)
                               if hasattr(r, "offsets")),)):
    _log.warning("text index %s does not fit its %d files: building it again", path,
                 len(readers))
    return None
  at = 0
  for r, count in zip(readers, counts):
    if r in jsonl:
      r.offsets, at = offsets[at:at + count + 1], at + count + 1
  return TextIndex(counts, lengths)


def _build(readers, tokenizer) -> tuple[TextIndex, np.ndarray]:
  counts, lengths, empty, first_empty = [], [], 0, None
  for r in readers:
    n = 0
    for batch in r.scan():
      sizes = np.array([ids.size for ids in tokenizer.encode_batch(batch)], np.int64)
      if first_empty is None and np.any(sizes == 0):
        first_empty = r.where(n + int(np.argmax(sizes == 0)))
      empty += int(np.sum(sizes == 0))
      lengths.append(sizes)
      n += sizes.size
    counts.append(n)
  if empty:  # An empty text under a tokenizer that adds no special token: nothing to pack.
    _log.warning("%d documents give no tokens with data.tokenizer (the first: %s); they add "
                 "nothing to the stream", empty, first_empty)
  offsets = [r.offsets for r in readers if hasattr(r, "offsets")]
  return (TextIndex(np.array(counts, np.int64), np.concatenate(lengths)),
          np.concatenate(offsets) if offsets else np.zeros(0, np.int64))


def index(readers, tokenizer, field: str, cache_dir: str) -> TextIndex:
  """The length index of `readers` (text_files.readers) under `tokenizer`: from the cache in
  `cache_dir`, else built and cached."""
  path = os.path.join(cache_dir, SUBDIR, _key(readers, tokenizer, field) + ".npz")
  found = _load(path, readers)
  if found is not None:
    return found
  start = time.time()
  built, offsets = _build(readers, tokenizer)
  _log.info("text index: %d documents, %d tokens in %d files, built in %.1f s -> %s",
            built.lengths.size, int(built.lengths.sum()), len(readers), time.time() - start, path)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    staging = f"{path}.tmp-{uuid.uuid4().hex[:8]}.npz"
    np.savez(staging, counts=built.counts, lengths=built.lengths, offsets=offsets)
    os.replace(staging, path)  # Atomic: a racing process renames an identical index.
  except OSError as e:  # A read-only cache only costs the scan at the next start.
    _log.warning("cannot cache the text index at %s (%s): it is built again next start", path, e)
  return built
