"""mosaicml-streaming's MDS format, read (and written) without mosaicml-streaming.

A dataset is a directory with `index.json` and shard files. This module follows
streaming 0.13's `streaming/base/format/{index,base,mds}` byte for byte:

  index.json   {"version": 2, "shards": [shard, ...]}, written with sort_keys=True; each shard
               {"format": "mds", "version": 2, "column_names", "column_encodings",
               "column_sizes", "compression", "hashes", "size_limit", "samples",
               "raw_data": {"basename", "bytes", "hashes"}, "zip_data": same or null}.
               Columns are sorted by name; column_sizes[c] is the fixed encoded size or null.
  shard file   uint32 num_samples | uint32 offsets[num_samples + 1] (absolute byte offsets of
               each sample's start, and of the end) | the shard config as sort_keys JSON |
               samples. Compressed shards (`zip_data`, e.g. shard.00000.mds.zstd) hold the
               whole file compressed.
  sample       uint32 size of each variable-size column, in column order | column bytes,
               in column order.
  encodings    ndarray[:dtype[:shape]]: [dtype code: 1 byte, if not static]
               [ndim << 2 | shape dtype code: 1 byte, shape: ndim uints, if not static] values;
               scalars (u)int8..64, float16..64: the raw value; int: int64; str: UTF-8;
               bytes: as is; json: UTF-8 JSON; str_int / str_float / str_decimal: digits.

`MDSDataset` memory-maps uncompressed shards (ndarray columns come back as read-only views of
the map: no copy) and decompresses each compressed shard once into a local cache directory
(write to a temporary name, then an atomic rename, so processes racing on one shard are safe).
Every structural check fails with an `MDSFormatError` naming the file, and the sample where
there is one. `pkl` (arbitrary code on load) and the image encodings are refused.

`write_mds` writes exactly what streaming's `MDSWriter` writes (tests compare the bytes with
files that MDSWriter made); the tests and the benchmark build datasets with it.
"""

from __future__ import annotations

import bz2
import collections
import dataclasses
import decimal
import gzip
import hashlib
import json
import logging
import mmap
import os
import threading
import uuid
from typing import Any, Iterable

import numpy as np

from hybrid_nope.errors import UserError

_log = logging.getLogger(__name__)

INDEX_BASENAME = "index.json"

# NDArray dtype / shape-dtype codes (streaming/base/format/mds/encodings.py, NDArray).
_VALUE_DTYPE_CODES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16",
                      32: "uint32", 33: "int32", 34: "float32", 64: "uint64", 65: "int64",
                      66: "float64"}
_VALUE_DTYPE_TO_CODE = {v: k for k, v in _VALUE_DTYPE_CODES.items()}
_SHAPE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
_SCALARS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
            "float16", "float32", "float64")
_VARIABLE = ("str", "bytes", "json", "str_int", "str_float", "str_decimal")
_REFUSED = {
    "pkl": "pickle runs arbitrary code when loaded",
    "pil": "image encodings are not token data", "jpeg": "image encodings are not token data",
    "png": "image encodings are not token data", "jpeg_array": "image encodings are not token data",
    "jpegarray": "image encodings are not token data", "list[pil]": "image encodings are not token data",
    "list[jpeg]": "image encodings are not token data", "list[png]": "image encodings are not token data",
}
COMPRESSIONS = ("zstd", "gz", "bz2")  # streaming also has br and snappy; not supported here.


class MDSFormatError(UserError):
  """A missing, malformed or inconsistent MDS file; the message names the file."""


# ---- encodings -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Column:
  """One column: its encoding parsed. `size` is the fixed encoded size in bytes, or None."""
  name: str
  encoding: str
  kind: str                      # "ndarray", "scalar", "int", or one of _VARIABLE
  dtype: np.dtype | None = None  # ndarray static dtype, or the scalar's dtype
  shape: tuple[int, ...] | None = None  # ndarray static shape
  size: int | None = None


def parse_encoding(name: str, encoding: str) -> Column:
  """Parses an MDS column encoding; ValueError for unknown or refused ones (caller adds the file)."""
  if not isinstance(encoding, str):
    raise ValueError(f"column {name!r}: encoding must be a string, got {encoding!r}")
  base, sep, rest = encoding.partition(":")
  if base == "ndarray":
    args = rest.split(":") if sep else []
    if len(args) > 2 or (sep and not rest):
      raise ValueError(f"column {name!r}: malformed ndarray encoding {encoding!r}; expected "
                       f"ndarray, ndarray:DTYPE or ndarray:DTYPE:D0,D1,...")
    dtype = shape = None
    if args:
      if args[0] not in _VALUE_DTYPE_TO_CODE:
        raise ValueError(f"column {name!r}: encoding {encoding!r} has unknown dtype "
                         f"{args[0]!r}; MDS ndarray dtypes are {sorted(_VALUE_DTYPE_TO_CODE)}")
      dtype = np.dtype(args[0])
    if len(args) == 2:
      try:
        shape = tuple(int(d) for d in args[1].split(","))
      except ValueError:
        shape = ()
      if not shape or min(shape) < 1:
        raise ValueError(f"column {name!r}: encoding {encoding!r} has a malformed shape "
                         f"{args[1]!r}; expected positive integers separated by commas")
    size = int(np.prod(shape)) * dtype.itemsize if shape is not None else None
    return Column(name, encoding, "ndarray", dtype, shape, size)
  if sep:
    raise ValueError(f"column {name!r}: encoding {encoding!r} takes no arguments "
                     f"(only ndarray does)")
  if encoding in _SCALARS:
    dtype = np.dtype(encoding)
    return Column(name, encoding, "scalar", dtype, None, dtype.itemsize)
  if encoding == "int":
    return Column(name, encoding, "int", np.dtype(np.int64), None, 8)
  if encoding in _VARIABLE:
    return Column(name, encoding, encoding)
  if encoding in _REFUSED:
    raise ValueError(f"column {name!r}: encoding {encoding!r} is refused: {_REFUSED[encoding]}")
  raise ValueError(f"column {name!r}: unknown MDS encoding {encoding!r}; this reader decodes "
                   f"ndarray[:dtype[:shape]], {', '.join(_SCALARS)}, int, {', '.join(_VARIABLE)}")


def _decode(column: Column, buf, start: int, size: int) -> Any:
  """Decodes one column value at buf[start:start+size]. ValueError if the bytes are malformed."""
  end = start + size
  kind = column.kind
  if kind == "ndarray":
    offset = start
    dtype = column.dtype
    if dtype is None:
      if size < 1 or buf[offset] not in _VALUE_DTYPE_CODES:
        raise ValueError(f"column {column.name!r}: bad ndarray dtype code "
                         f"{buf[offset] if size else None!r}")
      dtype = np.dtype(_VALUE_DTYPE_CODES[buf[offset]])
      offset += 1
    shape = column.shape
    if shape is None:
      if offset >= end:
        raise ValueError(f"column {column.name!r}: ndarray header is cut short")
      byte = buf[offset]
      shape_dtype = np.dtype(_SHAPE_DTYPES[byte & 3])
      ndim = byte >> 2
      if offset + 1 + ndim * shape_dtype.itemsize > end:
        raise ValueError(f"column {column.name!r}: ndarray shape is cut short")
      shape = tuple(int(d) for d in np.frombuffer(buf, shape_dtype, ndim, offset + 1))
      offset += 1 + ndim * shape_dtype.itemsize
    count = int(np.prod(shape))
    if (end - offset) != count * dtype.itemsize:
      raise ValueError(f"column {column.name!r}: ndarray of shape {shape} and dtype {dtype} "
                       f"needs {count * dtype.itemsize} bytes, the sample holds {end - offset}")
    return np.frombuffer(buf, dtype, count, offset).reshape(shape)
  if column.size is not None and size != column.size:
    raise ValueError(f"column {column.name!r}: {column.encoding} takes {column.size} bytes, "
                     f"got {size}")
  if kind == "scalar":
    return np.frombuffer(buf, column.dtype, 1, start)[0]
  if kind == "int":
    return int(np.frombuffer(buf, np.int64, 1, start)[0])
  data = bytes(buf[start:end])
  if kind == "bytes":
    return data
  text = data.decode("utf-8")
  if kind == "str":
    return text
  if kind == "json":
    return json.loads(text)
  if kind == "str_int":
    return int(text)
  if kind == "str_float":
    return float(text)
  return decimal.Decimal(text)  # str_decimal


def _encode(column: Column, value: Any) -> bytes:
  """MDSWriter's encoding of one value (mds_encode; bytes values pass through unchanged)."""
  if isinstance(value, bytes):
    return value
  kind = column.kind
  if kind == "ndarray":
    value = np.asarray(value)
    if value.dtype.name not in _VALUE_DTYPE_TO_CODE:
      raise ValueError(f"column {column.name!r}: unsupported dtype {value.dtype.name}")
    parts = []
    if column.dtype is None:
      parts.append(bytes([_VALUE_DTYPE_TO_CODE[value.dtype.name]]))
    elif value.dtype != column.dtype:
      raise ValueError(f"column {column.name!r}: expected dtype {column.dtype}, got {value.dtype}")
    if value.size == 0:
      raise ValueError(f"column {column.name!r}: MDS cannot encode an empty array")
    if column.shape is None:
      if value.ndim == 0 or value.ndim >= 64:
        raise ValueError(f"column {column.name!r}: ndarray needs 1 to 63 axes, got {value.ndim}")
      largest = max(value.shape)
      code = next(c for c, limit in enumerate((1 << 8, 1 << 16, 1 << 32, 1 << 64))
                  if largest < limit)
      parts.append(bytes([(value.ndim << 2) | code]))
      parts.append(np.array(value.shape, np.int64).astype(_SHAPE_DTYPES[code]).tobytes())
    elif value.shape != column.shape:
      raise ValueError(f"column {column.name!r}: expected shape {column.shape}, got {value.shape}")
    parts.append(value.tobytes())
    return b"".join(parts)
  if kind == "scalar":
    return column.dtype.type(value).tobytes()
  if kind == "int":
    if not isinstance(value, int):
      raise ValueError(f"column {column.name!r}: 'int' takes a Python int, got {value!r}")
    return np.int64(value).tobytes()
  if kind == "json":
    if isinstance(value, np.ndarray):
      value = value.tolist()
    return json.dumps(value).encode("utf-8")
  if kind == "str":
    if not isinstance(value, str):
      raise ValueError(f"column {column.name!r}: 'str' takes a str, got {type(value).__name__}")
    return value.encode("utf-8")
  if kind == "bytes":
    raise ValueError(f"column {column.name!r}: 'bytes' takes bytes, got {type(value).__name__}")
  return str(value).encode("utf-8")  # str_int, str_float, str_decimal


# ---- index -----------------------------------------------------------------------------------

@dataclasses.dataclass
class _Shard:
  number: int
  samples: int
  raw_basename: str
  raw_bytes: int
  raw_hashes: dict
  zip_basename: str | None
  zip_bytes: int | None
  compression: str | None
  path: str | None = None            # the uncompressed file, once known
  offsets: np.ndarray | None = None  # int64 [samples + 1], once the shard was opened


def _load_index(directory: str) -> tuple[list[Column], list[_Shard], bytes]:
  index_path = os.path.join(directory, INDEX_BASENAME)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"MDS dataset directory {directory} does not exist")
  try:
    with open(index_path, "rb") as f:
      index_bytes = f.read()
  except FileNotFoundError:
    raise FileNotFoundError(f"{index_path} is missing: an MDS dataset directory needs the "
                            f"index.json written by MDSWriter") from None
  try:
    index = json.loads(index_bytes)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise MDSFormatError(f"{index_path} is not valid JSON: {e}") from None

  def bad(what):
    return MDSFormatError(f"{index_path}: {what}")

  if not isinstance(index, dict) or index.get("version") != 2 or not isinstance(
      index.get("shards"), list):
    raise bad('expected {"version": 2, "shards": [...]} (streaming index version 2)')
  columns = None
  shards = []
  for number, shard in enumerate(index["shards"]):
    where = f"shards[{number}]"
    if not isinstance(shard, dict):
      raise bad(f"{where} is not an object")
    missing = {"format", "version", "column_names", "column_encodings", "column_sizes",
               "samples", "raw_data"} - set(shard)
    if missing:
      raise bad(f"{where} lacks {sorted(missing)}")
    if shard["format"] != "mds" or shard["version"] != 2:
      raise bad(f"{where} has format={shard['format']!r} version={shard['version']!r}; "
                f"expected format 'mds' version 2")
    names, encodings, sizes = (shard["column_names"], shard["column_encodings"],
                               shard["column_sizes"])
    if not (isinstance(names, list) and isinstance(encodings, list) and isinstance(sizes, list)
            and len(names) == len(encodings) == len(sizes) and names
            and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)):
      raise bad(f"{where}: column_names, column_encodings and column_sizes must be lists of "
                f"one entry per column (distinct names)")
    parsed = []
    for name, encoding, size in zip(names, encodings, sizes):
      try:
        column = parse_encoding(name, encoding)
      except ValueError as e:
        raise bad(f"{where}: {e}") from None
      if size != column.size:
        raise bad(f"{where}: column {name!r} with encoding {encoding!r} has column_sizes entry "
                  f"{size!r}, but that encoding's fixed size is {column.size!r}")
      parsed.append(column)
    if columns is None:
      columns = parsed
    elif parsed != columns:
      raise bad(f"{where} has columns {names}/{encodings}, unlike shards[0]: every shard of a "
                f"dataset must have the same columns")
    samples = shard["samples"]
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
      raise bad(f"{where}.samples={samples!r} must be a non-negative int")
    infos = {}
    for key in ("raw_data", "zip_data"):
      info = shard.get(key)
      if info is None and key == "zip_data":
        infos[key] = None
        continue
      if not (isinstance(info, dict) and isinstance(info.get("basename"), str)
              and isinstance(info.get("bytes"), int) and info["bytes"] >= 0):
        raise bad(f"{where}.{key} must be {{'basename': str, 'bytes': int, 'hashes': {{}}}}")
      basename = info["basename"]
      if os.path.isabs(basename) or ".." in basename.replace("\\", "/").split("/"):
        raise bad(f"{where}.{key}.basename={basename!r} must be a path inside the directory")
      infos[key] = info
    compression = shard.get("compression")
    if (compression is None) != (infos["zip_data"] is None):
      raise bad(f"{where}: compression={compression!r} but zip_data is "
                f"{'missing' if infos['zip_data'] is None else 'present'}")
    if compression is not None and compression.partition(":")[0] not in COMPRESSIONS:
      raise bad(f"{where}: compression {compression!r} is not supported (supported: "
                f"{', '.join(COMPRESSIONS)}, with an optional :level); decompress the shards "
                f"with mosaicml-streaming first")
    raw, zipped = infos["raw_data"], infos["zip_data"]
    shards.append(_Shard(
        number=number, samples=samples, raw_basename=raw["basename"], raw_bytes=raw["bytes"],
        raw_hashes=dict(raw.get("hashes") or {}),
        zip_basename=zipped["basename"] if zipped else None,
        zip_bytes=zipped["bytes"] if zipped else None, compression=compression))
  if columns is None:
    raise bad("has no shards")
  return columns, shards, index_bytes


def default_cache_dir() -> str:
  """$HYBRID_NOPE_MDS_CACHE, else $XDG_CACHE_HOME/hybrid_nope/mds, else ~/.cache/..."""
  if os.environ.get("HYBRID_NOPE_MDS_CACHE"):
    return os.environ["HYBRID_NOPE_MDS_CACHE"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "hybrid_nope", "mds")


def _decompressor(compression: str):
  family = compression.partition(":")[0]
  if family == "zstd":
    import zstandard  # pylint: disable=g-import-not-at-top
    return lambda src: zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True)
  if family == "gz":
    return lambda src: gzip.GzipFile(fileobj=src, mode="rb")
  return lambda src: bz2.BZ2File(src, mode="rb")


# ---- the dataset -----------------------------------------------------------------------------

class MDSDataset:
  """Random access to an MDS dataset directory: `len(ds)`, `ds[i]` -> {column: value}.

  Values are decoded exactly as streaming's MDSReader decodes them: ndarray columns as numpy
  arrays (read-only views of the memory-mapped shard), scalar columns as numpy scalars, int as
  int, str as str, bytes as bytes, json as the parsed object.

  Args:
    path: the directory holding index.json.
    cache_dir: where compressed shards are decompressed to (default `default_cache_dir()`);
      a shard whose decompressed file already sits next to it in `path` is used in place.
    max_open_shards: how many shard memory maps stay open (each holds a file descriptor).
    verify_hashes: check an uncompressed shard against index.json's hashes the first time it is
      opened (compressed shards are checked as they are decompressed). A verified shard leaves
      a stamp in the cache keyed by its size and mtime, so it is hashed once per machine and
      version of the file, not at every start.
  """

  def __init__(self, path: str, *, cache_dir: str | None = None, max_open_shards: int = 64,
               verify_hashes: bool = True):
    self.path = os.path.abspath(os.fspath(path))
    columns, self._shards, index_bytes = _load_index(self.path)
    self.columns = {c.name: c for c in columns}
    self._column_list = columns
    self._num_variable = sum(c.size is None for c in columns)
    self._cache_root = os.path.join(
        cache_dir or default_cache_dir(),
        hashlib.sha256(os.path.realpath(self.path).encode() + b"\0" + index_bytes).hexdigest()[:20])
    self._max_open = max(1, int(max_open_shards))
    self._verify_hashes = verify_hashes
    self._open: collections.OrderedDict[int, Any] = collections.OrderedDict()
    self._lock = threading.RLock()
    self._ends = np.cumsum([s.samples for s in self._shards], dtype=np.int64)
    for shard in self._shards:
      self._check_files(shard)

  # -- files

  def _file(self, basename: str) -> str:
    return os.path.join(self.path, basename)

  def _check_size(self, path: str, expected: int, field: str) -> None:
    size = os.path.getsize(path)
    if size != expected:
      raise MDSFormatError(
          f"{path} is {size} bytes but {self._file(INDEX_BASENAME)} says {expected} ({field}): "
          "the shard is truncated or from another write")

  def _check_files(self, shard: _Shard) -> None:
    """Size checks against index.json, before anything is read."""
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

  def _decompressed_path(self, shard: _Shard) -> str:
    """The cached uncompressed copy of a compressed shard, made once (atomic rename)."""
    target = os.path.join(self._cache_root, shard.raw_basename)
    if os.path.exists(target) and os.path.getsize(target) == shard.raw_bytes:
      return target
    zipped = self._file(shard.zip_basename)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
    hashers = {a: hashlib.new(a) for a in shard.raw_hashes if a in hashlib.algorithms_available}
    try:
      with open(zipped, "rb") as src, open(tmp, "wb") as dst:
        reader = _decompressor(shard.compression)(src)
        written = 0
        while chunk := reader.read(1 << 22):
          dst.write(chunk)
          for h in hashers.values():
            h.update(chunk)
          written += len(chunk)
          if written > shard.raw_bytes:
            break
      if written != shard.raw_bytes:
        raise MDSFormatError(
            f"{zipped} decompresses to {'more than ' if written > shard.raw_bytes else ''}"
            f"{written} bytes but {self._file(INDEX_BASENAME)} says {shard.raw_bytes} "
            f"(shards[{shard.number}].raw_data.bytes)")
      for algo, h in hashers.items():
        if h.hexdigest() != shard.raw_hashes[algo]:
          raise MDSFormatError(f"{zipped} decompresses to data whose {algo} is {h.hexdigest()}, "
                               f"but index.json says {shard.raw_hashes[algo]}")
      os.replace(tmp, target)  # atomic; a racing process renames identical bytes
    except Exception as e:
      if os.path.exists(tmp):
        os.unlink(tmp)
      if isinstance(e, MDSFormatError):
        raise
      raise MDSFormatError(f"cannot decompress {zipped} ({shard.compression}): {e}") from e
    return target

  def _verify(self, shard: _Shard, path: str) -> None:
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
    if os.path.exists(stamp):
      return
    h = hashlib.new(algo)
    with open(path, "rb") as f:
      while chunk := f.read(1 << 22):
        h.update(chunk)
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
      if shard.path is None:
        shard.path = self._decompressed_path(shard)
      elif self._verify_hashes and shard.raw_hashes:
        self._verify(shard, shard.path)
      path = shard.path
      size = os.path.getsize(path)
      if size != shard.raw_bytes:
        raise MDSFormatError(f"{path} is {size} bytes but index.json says {shard.raw_bytes}")
      with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
      if shard.offsets is None:
        shard.offsets = self._read_offsets(shard, buf, size)
      self._open[number] = buf
      while len(self._open) > self._max_open:
        self._open.popitem(last=False)  # views into it keep the map alive until dropped
      return buf

  def _read_offsets(self, shard: _Shard, buf, size: int) -> np.ndarray:
    path = shard.path
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
          sample[column.name] = _decode(column, buf, start, size)
        except (ValueError, UnicodeDecodeError) as e:
          raise MDSFormatError(f"{self.describe(index)}: {e}") from None
    return sample

  def __getitem__(self, index: int) -> dict[str, Any]:
    return self.get(index)

  def array_lengths(self, name: str) -> np.ndarray:
    """int64 [len(self)]: the element count of a 1-D ndarray column in every sample.

    Reads only the sample headers, vectorised per shard (no array data is touched).
    """
    column = self.columns.get(name)
    if column is None or column.kind != "ndarray":
      raise KeyError(f"{self.path} has no ndarray column {name!r}; its columns are "
                     f"{ {c.name: c.encoding for c in self._column_list} }")
    if column.shape is not None:
      if len(column.shape) != 1:
        raise MDSFormatError(f"{self.path}: column {name!r} ({column.encoding}) is not 1-D")
      return np.full(len(self), column.shape[0], np.int64)
    lengths = []
    for number, shard in enumerate(self._shards):
      if shard.samples == 0:
        continue
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
      if np.any(start + size > shard.offsets[1:]):
        bad = int(np.argmax(start + size > shard.offsets[1:]))
        raise MDSFormatError(f"{self.describe(int(self._ends[number] - shard.samples) + bad)}: "
                             f"column sizes run past the sample's end; the shard is corrupt")
      itemsize = column.dtype.itemsize if column.dtype is not None else None
      header = np.zeros(shard.samples, np.int64)
      if column.dtype is None:
        codes = u8[start]
        known = np.isin(codes, list(_VALUE_DTYPE_CODES))
        if not known.all():
          bad = int(np.argmin(known))
          raise MDSFormatError(f"{self.describe(int(self._ends[number] - shard.samples) + bad)}:"
                               f" column {name!r} has bad dtype code {codes[bad]}")
        lut = np.zeros(256, np.int64)
        for code, dt in _VALUE_DTYPE_CODES.items():
          lut[code] = np.dtype(dt).itemsize
        itemsize = lut[codes]
        header += 1
      byte = u8[start + header]
      ndim = byte >> 2
      if np.any(ndim != 1):
        bad = int(np.argmax(ndim != 1))
        raise MDSFormatError(f"{self.describe(int(self._ends[number] - shard.samples) + bad)}: "
                             f"column {name!r} has {ndim[bad]} dimensions, expected 1")
      header += 1 + (1 << (byte & 3))
      values = size - header
      if np.any(values % itemsize):
        bad = int(np.argmax(values % itemsize != 0))
        raise MDSFormatError(f"{self.describe(int(self._ends[number] - shard.samples) + bad)}: "
                             f"column {name!r} is not a whole number of elements")
      lengths.append(values // itemsize)
    return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)

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


# ---- writing (tests, benchmarks) -------------------------------------------------------------

def write_mds(out: str, columns: dict[str, str], samples: Iterable[dict[str, Any]], *,
              compression: str | None = None, hashes: Iterable[str] = (),
              size_limit: int | None = 1 << 26) -> None:
  """Writes `samples` to the new directory `out` exactly as streaming's MDSWriter would.

  Same shard boundaries, bytes, basenames and index.json. `compression` is None or "zstd[:L]"
  (bytes as libzstd's one-shot compressor writes them); `hashes` may name hashlib algorithms.
  """
  hashes = list(hashes)
  if hashes != sorted(set(hashes)) or any(a not in hashlib.algorithms_available for a in hashes):
    raise ValueError(f"hashes must be sorted, distinct hashlib algorithm names, got {hashes}")
  level = None
  if compression is not None:
    family, _, level_text = compression.partition(":")
    if family != "zstd":
      raise ValueError(f"write_mds compresses with zstd only, got {compression!r}")
    level = int(level_text) if level_text else 3
  parsed = [parse_encoding(name, columns[name]) for name in sorted(columns)]
  config = {"version": 2, "format": "mds", "compression": compression, "hashes": hashes,
            "size_limit": size_limit, "column_names": [c.name for c in parsed],
            "column_encodings": [c.encoding for c in parsed],
            "column_sizes": [c.size for c in parsed]}
  config_bytes = json.dumps(config, sort_keys=True).encode("utf-8")
  os.makedirs(out, exist_ok=False)
  shards: list[dict] = []
  pending: list[bytes] = []
  pending_size = 4 + 4 + len(config_bytes)

  def file_info(data: bytes, basename: str) -> dict:
    return {"basename": basename, "bytes": len(data),
            "hashes": {a: hashlib.new(a, data).hexdigest() for a in hashes}}

  def flush():
    raw_basename = f"shard.{len(shards):05}.mds"
    offsets = np.array([0] + [len(s) for s in pending]).cumsum().astype(np.uint32)
    offsets += 4 + offsets.nbytes + len(config_bytes)
    raw = np.uint32(len(pending)).tobytes() + offsets.tobytes() + config_bytes + b"".join(pending)
    raw_info, zip_info, data, basename = file_info(raw, raw_basename), None, raw, raw_basename
    if compression is not None:
      import zstandard  # pylint: disable=g-import-not-at-top
      data = zstandard.ZstdCompressor(level=level).compress(raw)
      basename = raw_basename + ".zstd"
      zip_info = file_info(data, basename)
    with open(os.path.join(out, basename), "wb") as f:
      f.write(data)
    shards.append({"samples": len(pending), "raw_data": raw_info, "zip_data": zip_info, **config})

  for sample in samples:
    sizes, data = [], []
    for column in parsed:
      datum = _encode(column, sample[column.name])
      if column.size is None:
        sizes.append(len(datum))
      elif len(datum) != column.size:
        raise ValueError(f"column {column.name!r}: encoded {len(datum)} bytes, "
                         f"{column.encoding} takes {column.size}")
      data.append(datum)
    encoded = np.array(sizes, np.uint32).tobytes() + b"".join(data)
    if size_limit and size_limit < pending_size + len(encoded) + 4:
      flush()
      pending, pending_size = [], 4 + 4 + len(config_bytes)
    pending.append(encoded)
    pending_size += len(encoded) + 4
  if pending:
    flush()
  with open(os.path.join(out, INDEX_BASENAME), "w") as f:
    json.dump({"version": 2, "shards": shards}, f, sort_keys=True)
