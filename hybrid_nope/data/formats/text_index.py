"""The length index of a text source: every document's token count (and a JSON Lines file's
line offsets), so row k of the packed stream is found without reading what precedes it.

Built by one read of every file (text_files' `scan`), tokenising each document with the
configured tokenizer, and kept in the cache directory (data.cache_dir, else the MDS cache's,
under text-index/) as one .npz named by a hash of the files' identities (fsspec's ukey: path,
size, modification time or object generation; locally ctime too), the text field and the
tokenizer's identity: a changed file, field or tokenizer builds a new index; a start on the
same data reads it back in milliseconds. Measured figures: benchmarks/data.py.

The index also holds each file's sha256, hashed (streamed) when it is built: the content the
run's data fingerprint names, so a file edited under the same token counts is seen at resume.
Why hash once per build and not at every start: the index is found again only under the same
stamps (`_stamp`: locally size, mtime, inode and ctime; an in-place write changes ctime even
where mtime and size are put back, and a copy made with a preserved mtime has a new ctime; on
object stores the generation or etag), so a found index's hashes are those of the file as it
is, as MDS shards' stamps vouch for their hashes (mds/dataset.py), while a multi-GB corpus
costs no re-read per start (sha256 streams at about 1 GB/s on one core).
data.verify_hashes="always" re-hashes every file at every start all the same (bit rot that
kept every stamp), and a difference fails naming the file and both hashes.

Beside the index, under the same key, the documents' token ids from that one tokenisation
(text_ids.py; all but the byte tokenizer): rows slice them and never tokenise again.
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

from hybrid_nope.config_values import VERIFY_ALWAYS
from hybrid_nope.data.formats import text_ids
from hybrid_nope.data.formats.text_files import TextDataError

VERSION = 3  # Of the .npz layout, what the index means and its ids; a change builds anew.
SUBDIR = "text-index"
HASH = "sha256"  # Of each file's bytes; named in the data fingerprint's keys.
_HASH_CHUNK = 1 << 22  # Bytes read at a time: a multi-GB file is hashed in bounded memory.
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TextIndex:
  counts: np.ndarray   # int64 [F]: documents per file
  lengths: np.ndarray  # int64 [N]: tokens per document, files in order (N = counts.sum())
  hashes: tuple[str, ...]  # [F]: each file's sha256 (hex) when the index was built
  # uint16/uint32 [lengths.sum()]: every document's ids in order (memmap, text_ids.py); None
  # where rows tokenise on the fly (the byte tokenizer, or a cache that could not be written).
  ids: np.ndarray | None = None
  ids_sha256: str = ""  # Of the ids file as written ("" where none was kept).

  @property
  def file_starts(self) -> np.ndarray:  # int64 [F + 1]: each file's first document
    return np.concatenate([[0], np.cumsum(self.counts)])

  @property
  def token_starts(self) -> np.ndarray:  # int64 [N + 1]: each document's first id in `ids`
    return np.concatenate([[0], np.cumsum(self.lengths)])


def _stamp(reader) -> list:
  """What tells a file's versions apart without reading it: fsspec's ukey (local: size, mtime,
  inode, and a birth time where the OS keeps one; object stores: generation or etag) and,
  locally, ctime, which no tool sets back: an edit or a copy that restores size and mtime
  still gets a new ctime, so it builds a new index and new hashes."""
  stamp = [reader.fs.ukey(reader.path)]
  if "file" in reader.fs.protocol:
    stamp.append(os.stat(reader.path).st_ctime_ns)
  return stamp


def _key(readers, tokenizer, field: str) -> str:
  identity = {"version": VERSION, "field": field, "tokenizer": tokenizer.identity,
              "files": [[type(r).__name__, r.name, *_stamp(r)] for r in readers]}
  return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def file_hash(reader) -> str:
  """The sha256 (hex) of the bytes of `reader`'s file, read in chunks."""
  h = hashlib.new(HASH)
  with reader.fs.open(reader.path, "rb") as f:
    while chunk := f.read(_HASH_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _check_hashes(built: TextIndex, readers, path: str) -> None:
  """data.verify_hashes="always": each file hashed again against what its index recorded."""
  for r, expected in zip(readers, built.hashes):
    found = file_hash(r)
    if found != expected:
      raise TextDataError(f"{r.name} has {HASH} {found}, but its text index {path} was built "
                          f"from {HASH} {expected}: the file changed under the same size and "
                          "times; restore it, or delete the index to build it anew")


def _load(path: str, readers) -> TextIndex | None:
  """The cached index, its JSON Lines offsets handed to their readers; None if absent or not
  consistent (then it is built again)."""
  try:
    with np.load(path) as z:
      counts, lengths, offsets = z["counts"], z["lengths"], z["offsets"]
      hashes = tuple(str(h) for h in z["hashes"])
      ids_sha256 = str(z["ids_sha256"])
  except FileNotFoundError:
    return None
  except (OSError, ValueError, KeyError) as e:
    _log.warning("text index %s is unreadable (%s): building it again", path, e)
    return None
  jsonl = [r for r in readers if hasattr(r, "offsets")]
  if (counts.shape != (len(readers),) or len(hashes) != len(readers)
      or lengths.shape != (int(counts.sum()),)
      or offsets.shape != (sum(int(c) + 1 for r, c in zip(readers, counts)
                               if hasattr(r, "offsets")),)):
    _log.warning("text index %s does not fit its %d files: building it again", path,
                 len(readers))
    return None
  at = 0
  for r, count in zip(readers, counts):
    if r in jsonl:
      r.offsets, at = offsets[at:at + count + 1], at + count + 1
  return TextIndex(counts, lengths, hashes, ids_sha256=ids_sha256)


def _build(readers, tokenizer, ids: text_ids.Writer | None) -> tuple[TextIndex, np.ndarray]:
  """The index of `readers`, every document tokenised once (its ids appended to `ids`), and
  the JSON Lines files' offsets."""
  counts, lengths, empty, first_empty = [], [], 0, None
  for r in readers:
    n = 0
    for batch in r.scan():
      encoded = tokenizer.encode_batch(batch)
      if ids is not None:
        ids.append(encoded)
      sizes = np.array([e.size for e in encoded], np.int64)
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
  hashes = tuple(file_hash(r) for r in readers)
  return (TextIndex(np.array(counts, np.int64), np.concatenate(lengths), hashes),
          np.concatenate(offsets) if offsets else np.zeros(0, np.int64))


def index(readers, tokenizer, field: str, cache_dir: str, *,
          verify_hashes: bool | str) -> TextIndex:
  """The length index of `readers` (text_files.readers) under `tokenizer`: from the cache in
  `cache_dir` (its files hashed again where `verify_hashes` is "always"), else built and
  cached."""
  path = os.path.join(cache_dir, SUBDIR, _key(readers, tokenizer, field) + ".npz")
  ids_path = text_ids.path(path, tokenizer)
  found = _load(path, readers)
  if found is not None and text_ids.caches(tokenizer):
    ids = text_ids.load(ids_path, int(found.lengths.sum()), text_ids.dtype(tokenizer),
                        found.ids_sha256 if verify_hashes == VERIFY_ALWAYS else None)
    found = None if ids is None else dataclasses.replace(found, ids=ids)  # None: built again.
  if found is not None:
    if verify_hashes == VERIFY_ALWAYS:
      _check_hashes(found, readers, path)
    return found
  start = time.time()
  writer = text_ids.Writer(ids_path, tokenizer) if text_ids.caches(tokenizer) else None
  try:
    built, offsets = _build(readers, tokenizer, writer)
  except BaseException:
    if writer is not None:
      writer.discard()  # A bad file leaves no partial ids behind.
    raise
  if writer is not None:  # Renamed into place before the index: a found index finds its ids.
    built = dataclasses.replace(built, ids=writer.finish(int(built.lengths.sum())),
                                ids_sha256=writer.sha256)
  _log.info("text index: %d documents, %d tokens in %d files, built in %.1f s -> %s",
            built.lengths.size, int(built.lengths.sum()), len(readers), time.time() - start, path)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    staging = f"{path}.tmp-{uuid.uuid4().hex[:8]}.npz"
    np.savez(staging, counts=built.counts, lengths=built.lengths, offsets=offsets,
             hashes=np.array(built.hashes, dtype=f"U{2 * hashlib.new(HASH).digest_size}"),
             ids_sha256=np.array(built.ids_sha256))
    os.replace(staging, path)  # Atomic: a racing process renames an identical index.
  except OSError as e:  # A read-only cache only costs the scan at the next start.
    _log.warning("cannot cache the text index at %s (%s): it is built again next start", path, e)
  return built
