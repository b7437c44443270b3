"""write_mds: what streaming's MDSWriter writes, byte for byte (tests and benchmarks build
datasets with it)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable

import numpy as np

from hybrid_nope.data.formats.mds.encoding import INDEX_BASENAME, encode_value, parse_encoding

DEFAULT_HASHES = ("sha1",)  # What the reader verifies a shard with (the fastest of hashlib's).

def write_mds(out: str, columns: dict[str, str], samples: Iterable[dict[str, Any]], *,
              compression: str | None = None, hashes: Iterable[str] = DEFAULT_HASHES,
              size_limit: int | None = 1 << 26) -> None:
  """Writes `samples` to the new directory `out` exactly as streaming's MDSWriter would.

  Same shard boundaries, bytes, basenames and index.json. `compression` is None or "zstd[:L]"
  (bytes as libzstd's one-shot compressor writes them); `hashes` names hashlib algorithms,
  sha1 by default (MDSWriter's default is none: pass hashes=() for its bytes), so the reader
  can verify every shard.
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
      datum = encode_value(column, sample[column.name])
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
