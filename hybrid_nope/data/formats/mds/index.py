"""index.json: its shards, checked field by field; where compressed shards are decompressed to."""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import os

import numpy as np

from hybrid_nope.run import storage
from hybrid_nope.data.formats.mds.encoding import (COMPRESSIONS, INDEX_BASENAME, Column, MDSFormatError,
                                           parse_encoding)

@dataclasses.dataclass
class Shard:
  """One shard as index.json lists it, and what the reader learns of it on opening."""
  number: int
  samples: int
  raw_basename: str
  raw_bytes: int
  raw_hashes: dict
  zip_basename: str | None
  zip_bytes: int | None
  compression: str | None
  path: str | None = None            # the uncompressed local file, once known
  remote: str | None = None          # the basename fetched from a remote directory
  offsets: np.ndarray | None = None  # int64 [samples + 1], once the shard was opened


def load_index(directory: str) -> tuple[list[Column], list[Shard], bytes]:
  """index.json of `directory` (a local path or an fsspec URL), checked field by field."""
  index_path = storage.join(directory, INDEX_BASENAME)
  if not storage.isdir(directory):
    raise FileNotFoundError(f"MDS dataset directory {directory} does not exist")
  try:
    index_bytes = storage.read_bytes(index_path)
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
    shards.append(Shard(
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


def decompressor(compression: str):
  """A function of a binary file object to a reader of its decompressed bytes."""
  family = compression.partition(":")[0]
  if family == "zstd":
    import zstandard  # pylint: disable=g-import-not-at-top
    return lambda src: zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True)
  if family == "gz":
    return lambda src: gzip.GzipFile(fileobj=src, mode="rb")
  return lambda src: bz2.BZ2File(src, mode="rb")


