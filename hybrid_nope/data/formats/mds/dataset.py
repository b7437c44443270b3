"""MDSDataset: random access to an MDS directory through memory-mapped shards."""

from __future__ import annotations

import collections
import hashlib
import logging
import mmap
import os
import threading
from typing import Any, Iterable

import fsspec
import numpy as np

from hybrid_nope.run import storage
from hybrid_nope.config_values import VERIFY_ALWAYS
from hybrid_nope.data.formats.mds import cache
from hybrid_nope.data.formats.mds.encoding import (INDEX_BASENAME, HeaderError, MDSFormatError,
                                                   decode_value, ndarray_headers,
                                                   ndarray_itemsizes)
from hybrid_nope.data.formats.mds.index import Shard, default_cache_dir, load_index

_log = logging.getLogger(__name__)
_warned_unhashed: set[str] = set()  # Datasets (cache keys) this process warned about.

class MDSDataset:
  """Random access to an MDS dataset directory: `len(ds)`, `ds[i]` -> {column: value}.

  Values are decoded exactly as streaming's MDSReader decodes them: ndarray columns as numpy
  arrays (read-only views of the memory-mapped shard), scalar columns as numpy scalars, int as
  int, str as str, bytes as bytes, json as the parsed object.

  Args:
    path: the directory holding index.json: local, or an fsspec URL (gs://, ...) whose shards
      are fetched whole into `cache_dir` at their first open, checked as decompressed ones.
    cache_dir: where compressed shards are decompressed to (default `default_cache_dir()`);
      a shard whose decompressed file already sits next to it in `path` is used in place.
    max_open_shards: how many shard memory maps stay open (each holds a file descriptor).
    verify_hashes: check an uncompressed shard against index.json's hashes the first time it is
      opened (compressed shards are checked as they are decompressed). A verified shard leaves
      a stamp in the cache keyed by its size and mtime, so it is hashed once per machine and
      version of the file, not at every start; "always" hashes it at every open past the
      stamp (bit rot that kept size and mtime). An index.json without hashes is read with one
      warning per process. Cached decompressed copies are checked against the sha1 written
      beside them at their first use in each process either way (cache.py).
  """

  def __init__(self, path: str, *, cache_dir: str | None = None, max_open_shards: int = 64,
               verify_hashes: bool | str = True):
    local = storage.local_path(os.fspath(path))
    self.path = os.path.abspath(local) if local is not None else os.fspath(path).rstrip("/")
    # A URL (gs://, ...): each shard is fetched whole into the cache at its first open.
    self._remote = None if local is not None else fsspec.core.url_to_fs(self.path)
    columns, self._shards, index_bytes = load_index(self.path)
    self.columns = {c.name: c for c in columns}
    self._column_list = columns
    self._num_variable = sum(c.size is None for c in columns)
    where = self.path if self._remote else os.path.realpath(self.path)
    self._cache_root = os.path.join(
        cache_dir or default_cache_dir(),
        hashlib.sha256(where.encode() + b"\0" + index_bytes).hexdigest()[:20])
    self._max_open = max(1, int(max_open_shards))
    self._verify_hashes = verify_hashes
    self._open: collections.OrderedDict[int, Any] = collections.OrderedDict()
    self._lock = threading.RLock()
    self._ends = np.cumsum([s.samples for s in self._shards], dtype=np.int64)
    sizes = self._remote_sizes() if self._remote else None
    for shard in self._shards:
      self._check_files(shard, sizes)
    unhashed = sum(not s.raw_hashes for s in self._shards)
    if verify_hashes and unhashed and self._cache_root not in _warned_unhashed:
      _warned_unhashed.add(self._cache_root)
      _log.warning("%s lists no hashes for %d of its %d shards: their contents are not verified "
                   "(only sizes and structure are checked); write the dataset with hashes "
                   "(write_mds does by default, MDSWriter with hashes=['sha1'])",
                   self._file(INDEX_BASENAME), unhashed, len(self._shards))

  # -- files

  def _file(self, basename: str) -> str:
    return storage.join(self.path, basename)

  def _remote_sizes(self) -> dict[str, int]:
    """{basename: bytes} of every file under a remote directory, from one listing."""
    fs, root = self._remote
    found = fs.find(root, detail=True)
    return {name[len(root):].lstrip("/"): int(info["size"]) for name, info in found.items()}

  def _check_size(self, path: str, expected: int, field: str) -> None:
    size = os.path.getsize(path)
    if size != expected:
      raise MDSFormatError(
          f"{path} is {size} bytes but {self._file(INDEX_BASENAME)} says {expected} ({field}): "
          "the shard is truncated or from another write")

  def _check_files(self, shard: Shard, remote_sizes: dict | None) -> None:
    """Size checks against index.json, before anything is read; a remote shard's from the
    listing (`remote_sizes`), its raw file preferred (nothing to decompress)."""
    if remote_sizes is not None:
      for basename, field, expected in ((shard.raw_basename, "raw_data", shard.raw_bytes),
                                        (shard.zip_basename, "zip_data", shard.zip_bytes)):
        if basename in remote_sizes:
          if remote_sizes[basename] != expected:
            raise MDSFormatError(
                f"{self._file(basename)} is {remote_sizes[basename]} bytes but "
                f"{self._file(INDEX_BASENAME)} says {expected} (shards[{shard.number}]."
                f"{field}.bytes): the shard is truncated or from another write")
          shard.remote = basename
          return
      raise MDSFormatError(f"shard file {self._file(shard.raw_basename)} (shards["
                           f"{shard.number}] of {self._file(INDEX_BASENAME)}) is missing")
    raw = self._file(shard.raw_basename)
    if os.path.exists(raw):
      self._check_size(raw, shard.raw_bytes, f"shards[{shard.number}].raw_data.bytes")
      shard.path = raw
      return
    if shard.zip_basename is None:
      raise MDSFormatError(f"shard file {raw} (shards[{shard.number}] of "
                           f"{self._file(INDEX_BASENAME)}) is missing")
    zipped = self._file(shard.zip_basename)
    if not os.path.exists(zipped):
      raise MDSFormatError(f"shard file {zipped} (shards[{shard.number}] of "
                           f"{self._file(INDEX_BASENAME)}) is missing")
    self._check_size(zipped, shard.zip_bytes, f"shards[{shard.number}].zip_data.bytes")

  def _decompressed_path(self, shard: Shard) -> str:
    """The cached uncompressed copy of a compressed or remote shard, made once and checked
    (cache.py)."""
    target = os.path.join(self._cache_root, shard.raw_basename)
    if self._remote is None:
      return cache.cached_copy(shard, self._file(shard.zip_basename), target,
                               self._file(INDEX_BASENAME))
    fs, root = self._remote
    remote = f"{root}/{shard.remote}"
    return cache.cached_copy(shard, self._file(shard.remote), target, self._file(INDEX_BASENAME),
                             open_source=lambda: fs.open(remote, "rb"),
                             compressed=shard.remote != shard.raw_basename)

  def _verify(self, shard: Shard, path: str) -> None:
    """Hashes an uncompressed shard with one algorithm index.json lists (the first hashlib
    has, sha1 and md5 first: they are the fastest); a stamp in the cache skips it next time."""
    fastest = ("sha1", "md5")
    usable = sorted((a for a in shard.raw_hashes if a in hashlib.algorithms_available),
                    key=lambda a: (fastest.index(a) if a in fastest else len(fastest), a))
    if not usable:
      raise MDSFormatError(f"{path}: index.json lists hashes {sorted(shard.raw_hashes)}, none of "
                           "which hashlib has; set data.verify_hashes=False to read it unchecked")
    algo, stat = usable[0], os.stat(path)
    key = f"{os.path.realpath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0{algo}\0"
    stamp = os.path.join(self._cache_root, "verified",
                         hashlib.sha256((key + shard.raw_hashes[algo]).encode()).hexdigest())
    if os.path.exists(stamp) and self._verify_hashes != VERIFY_ALWAYS:
      return
    with open(path, "rb") as f:
      h = hashlib.file_digest(f, algo)
    if h.hexdigest() != shard.raw_hashes[algo]:
      raise MDSFormatError(f"{path} (shards[{shard.number}] of {self._file(INDEX_BASENAME)}) has "
                           f"{algo} {h.hexdigest()} but index.json says {shard.raw_hashes[algo]}:"
                           " the shard is corrupt or from another write")
    try:
      os.makedirs(os.path.dirname(stamp), exist_ok=True)
      with open(stamp, "w") as f:
        f.write(key + "\n")
    except OSError as e:  # A read-only cache only costs a hash at the next start.
      _log.warning("cannot stamp %s as verified (%s); it is hashed again next time", path, e)

  def _open_shard(self, number: int):
    """The shard's memory map (LRU of open maps); validates its header the first time."""
    with self._lock:
      buf = self._open.get(number)
      if buf is not None:
        self._open.move_to_end(number)
        return buf
      shard = self._shards[number]
      if shard.path is None:  # Compressed: checked at its first use in this process.
        path = self._decompressed_path(shard)
      else:
        path = shard.path
        if self._verify_hashes and shard.raw_hashes:
          self._verify(shard, path)
      size = os.path.getsize(path)
      if size != shard.raw_bytes:
        raise MDSFormatError(f"{path} is {size} bytes but index.json says {shard.raw_bytes}")
      with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
      if shard.offsets is None:
        shard.offsets = self._read_offsets(shard, path, buf, size)
      self._open[number] = buf
      while len(self._open) > self._max_open:
        self._open.popitem(last=False)  # views into it keep the map alive until dropped
      return buf

  def _read_offsets(self, shard: Shard, path: str, buf, size: int) -> np.ndarray:
    if size < 4:
      raise MDSFormatError(f"{path} is {size} bytes: too short for an MDS shard header")
    count = int(np.frombuffer(buf, np.uint32, 1, 0)[0])
    if count != shard.samples:
      raise MDSFormatError(f"{path} holds {count} samples but index.json says "
                           f"{shard.samples} (shards[{shard.number}].samples)")
    header = 4 * (count + 2)
    if size < header:
      raise MDSFormatError(f"{path} is {size} bytes: too short for the offsets of {count} "
                           f"samples; the shard is truncated")
    offsets = np.frombuffer(buf, np.uint32, count + 1, 4).astype(np.int64)
    if offsets[0] < header or np.any(np.diff(offsets) < 0) or offsets[-1] != size:
      raise MDSFormatError(
          f"{path} has inconsistent sample offsets (first {offsets[0]}, last {offsets[-1]}, "
          f"file size {size}): the shard is truncated or corrupt")
    return offsets

  # -- samples

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  @property
  def num_shards(self) -> int:
    return len(self._shards)

  def locate(self, index: int) -> tuple[int, int]:
    """(shard number, sample within the shard) of dataset index `index`."""
    n = len(self)
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
      raise TypeError(f"MDS sample index must be an int, got {index!r}")
    if not -n <= index < n:
      raise IndexError(f"sample {index} is out of range for {self.path} ({n} samples)")
    index = int(index) % n
    number = int(np.searchsorted(self._ends, index, side="right"))
    return number, index - (int(self._ends[number - 1]) if number else 0)

  def describe(self, index: int) -> str:
    """'sample 7 of /path/shard.00003.mds (dataset index 123)', for error messages."""
    number, local = self.locate(index)
    shard = self._shards[number]
    name = self._file(shard.zip_basename or shard.raw_basename)
    return f"sample {local} of {name} (index {int(index)} of {self.path})"

  def _spans(self, index: int):
    """(buffer, [(column, start, size)]) of one sample, checked against its byte span."""
    number, local = self.locate(index)
    buf = self._open_shard(number)
    offsets = self._shards[number].offsets
    begin, end = int(offsets[local]), int(offsets[local + 1])
    pos = begin + 4 * self._num_variable
    if pos > end:
      raise MDSFormatError(f"{self.describe(index)} is {end - begin} bytes, too short for its "
                           f"column sizes")
    variable = iter(np.frombuffer(buf, np.uint32, self._num_variable, begin).tolist())
    spans = []
    for column in self._column_list:
      size = column.size if column.size is not None else next(variable)
      spans.append((column, pos, size))
      pos += size
    if pos != end:
      raise MDSFormatError(f"{self.describe(index)}: its columns take {pos - begin} bytes but "
                           f"the shard gives it {end - begin}; the shard is corrupt")
    return buf, spans

  def get(self, index: int, columns: Iterable[str] | None = None) -> dict[str, Any]:
    """Decodes sample `index`, only `columns` if given."""
    wanted = None if columns is None else set(columns)
    if wanted is not None and not wanted <= set(self.columns):
      raise KeyError(f"{self.path} has no column(s) {sorted(wanted - set(self.columns))}; "
                     f"its columns are {sorted(self.columns)}")
    buf, spans = self._spans(index)
    sample = {}
    for column, start, size in spans:
      if wanted is None or column.name in wanted:
        try:
          sample[column.name] = decode_value(column, buf, start, size)
        except (ValueError, UnicodeDecodeError) as e:
          raise MDSFormatError(f"{self.describe(index)}: {e}") from None
    return sample

  def __getitem__(self, index: int) -> dict[str, Any]:
    return self.get(index)

  def _ndarray_column(self, name: str):
    column = self.columns.get(name)
    if column is None or column.kind != "ndarray":
      raise KeyError(f"{self.path} has no ndarray column {name!r}; its columns are "
                     f"{ {c.name: c.encoding for c in self._column_list} }")
    return column

  def shard_basename(self, number: int) -> str:
    """Shard `number`'s raw basename, as index.json names it (e.g. shard.00003.mds)."""
    return self._shards[number].raw_basename

  def first_index(self, number: int) -> int:
    """The dataset index of shard `number`'s first sample."""
    return int(self._ends[number] - self._shards[number].samples)

  def index_of(self, basename: str, sample: int) -> int:
    """The dataset index of sample `sample` of the shard whose raw basename (as index.json
    names it, e.g. shard.00003.mds) is `basename`; LookupError saying what there is."""
    numbers = [s.number for s in self._shards if s.raw_basename == basename]
    if not numbers:
      raise LookupError(f"{self._file(INDEX_BASENAME)} has no shard {basename!r} (its shards "
                        f"are {self._shards[0].raw_basename} .. {self._shards[-1].raw_basename})")
    samples = self._shards[numbers[0]].samples
    if not 0 <= sample < samples:
      raise LookupError(f"{self._file(basename)} has {samples} samples, so no sample {sample}")
    return self.first_index(numbers[0]) + sample

  def _array_layout(self, column, number: int):
    """(data_start, count, itemsize) of a 1-D ndarray column in each sample of shard `number`:
    where its values begin and how many there are (int64 [samples]; itemsize an int, or an
    array for a column without a declared dtype). Reads only the sample headers, vectorised."""
    shard, name = self._shards[number], column.name
    buf = self._open_shard(number)
    u8 = np.frombuffer(buf, np.uint8)
    begin = shard.offsets[:-1]
    var_sizes = np.zeros((shard.samples, 0), np.int64)
    if self._num_variable:
      idx = begin[:, None] + 4 * np.arange(self._num_variable)[None, :]
      var_sizes = u8[idx[..., None] + np.arange(4)].copy().view("<u4")[..., 0].astype(np.int64)
    start = begin + 4 * self._num_variable
    size = None
    v = 0
    for c in self._column_list:
      csize = var_sizes[:, v] if c.size is None else np.full(shard.samples, c.size)
      v += c.size is None
      if c is column:
        size = csize
        break
      start = start + csize
    first = self.first_index(number)
    if np.any(start + size > shard.offsets[1:]):
      bad = int(np.argmax(start + size > shard.offsets[1:]))
      raise MDSFormatError(f"{self.describe(first + bad)}: column sizes run past the sample's "
                           f"end; the shard is corrupt")
    try:
      codes, ndim, _, data_start = ndarray_headers(column, u8, start, size)
    except HeaderError as e:
      raise MDSFormatError(f"{self.describe(first + e.sample)}: {e}") from None
    if np.any(ndim != 1):
      bad = int(np.argmax(ndim != 1))
      raise MDSFormatError(f"{self.describe(first + bad)}: column {name!r} has {ndim[bad]} "
                           "dimensions, expected 1")
    values, itemsize = start + size - data_start, ndarray_itemsizes(column, codes)
    if np.any(values % itemsize):
      bad = int(np.argmax(values % itemsize != 0))
      raise MDSFormatError(f"{self.describe(first + bad)}: column {name!r} is not a whole "
                           "number of elements")
    return data_start, values // itemsize, itemsize

  def array_lengths(self, name: str) -> np.ndarray:
    """int64 [len(self)]: the element count of a 1-D ndarray column in every sample.

    Reads only the sample headers, vectorised per shard (no array data is touched).
    """
    column = self._ndarray_column(name)
    if column.shape is not None:
      if len(column.shape) != 1:
        raise MDSFormatError(f"{self.path}: column {name!r} ({column.encoding}) is not 1-D")
      return np.full(len(self), column.shape[0], np.int64)
    lengths = [self._array_layout(column, number)[1]
               for number, shard in enumerate(self._shards) if shard.samples]
    return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)

  def array_extremes(self, name: str, number: int) -> tuple[np.ndarray, np.ndarray]:
    """(min, max), int64 [samples], of a 1-D ndarray column with a declared dtype in each
    sample of shard `number` (0, -1 for an empty array; uint64 values past 2**63 - 1 wrap
    negative). Vectorised: one gather of the column's bytes in the shard, one reduceat."""
    column = self._ndarray_column(name)
    if column.dtype is None:
      raise MDSFormatError(f"{self.path}: column {name!r} ({column.encoding}) declares no dtype")
    data_start, count, itemsize = self._array_layout(column, number)
    u8 = np.frombuffer(self._open_shard(number), np.uint8)
    edges = np.zeros(u8.size + 1, np.int8)  # +1 where a value's bytes start, -1 where they end
    np.add.at(edges, data_start, 1)
    np.add.at(edges, data_start + count * itemsize, -1)
    values = u8[np.cumsum(edges[:-1], dtype=np.int8).view(bool)].view(column.dtype)
    lo, hi = np.zeros(count.size, np.int64), np.full(count.size, -1, np.int64)
    nonempty = count > 0
    if values.size:
      starts = (np.cumsum(count) - count)[nonempty]
      lo[nonempty] = np.minimum.reduceat(values, starts)
      hi[nonempty] = np.maximum.reduceat(values, starts)
    return lo, hi

  def __getstate__(self):  # memory maps do not pickle; reopened lazily
    state = self.__dict__.copy()
    state["_open"] = collections.OrderedDict()
    state["_lock"] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.RLock()

  def __repr__(self):
    return (f"MDSDataset({self.path!r}: {len(self)} samples in {len(self._shards)} shards, "
            f"columns { {c.name: c.encoding for c in self._column_list} })")


