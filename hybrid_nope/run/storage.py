"""Files of a run directory that may be a local path or a URL (gs://, file://, memory://, ...).

Records, config, probe file, figures and TensorBoard events go through here (fsspec), so a
workdir on shared storage outlives the machine that trained; orbax reaches checkpoint
directories by itself (local paths and gs://). Writes of whole files are atomic: a local file
is written beside its target and renamed over it, and an object store replaces an object only
when its upload completes. What a run directory holds, and each name, is `run_dir.py`'s.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import uuid

import fsspec
import numpy as np
from absl import logging

from hybrid_nope.errors import UserError


def is_url(path: str) -> bool:
  return "://" in path


def local_path(path: str) -> str | None:
  """The filesystem path of a local path or file:// URL; None for any other URL."""
  if not is_url(path):
    return path
  return path[len("file://"):] if path.startswith("file://") else None


def join(base: str, *parts: str) -> str:
  if is_url(base):
    return "/".join([base.rstrip("/"), *parts])
  return os.path.join(base, *parts)


def _fs(path: str):
  return fsspec.core.url_to_fs(path)


def exists(path: str) -> bool:
  fs, p = _fs(path)
  return fs.exists(p)


def isdir(path: str) -> bool:
  fs, p = _fs(path)
  return fs.isdir(p)


def listdir(path: str) -> list[str]:
  """Names (not paths) of the entries of a directory."""
  fs, p = _fs(path)
  return sorted(os.path.basename(e.rstrip("/")) for e in fs.ls(p, detail=False))


def makedirs(path: str) -> None:
  fs, p = _fs(path)
  fs.makedirs(p, exist_ok=True)


def read_text(path: str) -> str:
  fs, p = _fs(path)
  with fs.open(p, "r") as f:
    return f.read()


def read_bytes(path: str) -> bytes:
  fs, p = _fs(path)
  with fs.open(p, "rb") as f:
    return f.read()


def to_json(obj, **kwargs) -> str:
  """`obj` as JSON text, the one encoder of records and analysis files: a float that is not
  finite (NaN, ±inf; JSON has no spelling for them) is written as null, numpy scalars and
  arrays as numbers and lists. `kwargs` go to json.dumps (indent, sort_keys)."""
  return json.dumps(_finite_or_null(obj), allow_nan=False, **kwargs)


def _finite_or_null(value):
  if isinstance(value, dict):
    return {k: _finite_or_null(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite_or_null(v) for v in value]
  if isinstance(value, np.ndarray):
    return _finite_or_null(value.tolist())
  if isinstance(value, (np.generic,)):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def _nan_for_null(value):
  if value is None:
    return math.nan
  if isinstance(value, dict):
    return {k: _nan_for_null(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_nan_for_null(v) for v in value]
  return value


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSONL file, one per non-blank line, each a JSON object with an integer
  "step". A null is a number the writer could not spell (`to_json`: NaN or ±inf, or an eval
  bucket without tokens) and is read as NaN, so arithmetic on it works as on the written value.
  A torn last line (a writer killed mid-line, or a live run read while it writes) is dropped with
  a warning; any other line that is not JSON, or a record without a step, fails naming the file
  and line."""
  lines = read_text(path).splitlines()
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      if number == len(lines):
        logging.warning("%s: dropped its torn last line %d (%r...)", path, number, line[:60])
        continue
      raise UserError(f"{path} line {number} is not JSON ({e}); only a torn last line is "
                      f"dropped by itself: fix or remove that line") from None
    step = record.get("step") if isinstance(record, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
      raise UserError(f"{path} line {number} is not a record with an integer \"step\" "
                      f"({line[:60]!r}): every record names its step; fix or remove that line")
    records.append(_nan_for_null(record) if "null" in line else record)
  return records


def write_bytes(path: str, data: bytes) -> None:
  """Replaces the file whole; a kill at any instant leaves the old or the new one."""
  local = local_path(path)
  if local is None:
    fs, p = _fs(path)
    fs.pipe_file(p, data)  # One object upload: visible only once complete.
    return
  os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
  staging = f"{local}.tmp-{uuid.uuid4().hex[:8]}"
  try:
    with open(staging, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(staging, local)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(staging)


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode())


WRITE_PROBE_PREFIX = ".write_check_"  # The probe file's name: a reader of a workdir skips it.


def probe_write(directory: str) -> None:
  """Writes a file into the existing `directory` and removes it, raising what the write
  raised: a real write, since os.access says yes to root on a read-only mount."""
  local = local_path(directory)
  if local is not None:
    fd, probe = tempfile.mkstemp(prefix=WRITE_PROBE_PREFIX, dir=local)
    os.close(fd)
    os.unlink(probe)
    return
  probe = join(directory, f"{WRITE_PROBE_PREFIX}{uuid.uuid4().hex}")
  write_text(probe, "")
  remove(probe)


def move(source: str, destination: str) -> None:
  """Renames a file or directory, locally or on an object store (where fsspec copies, then
  deletes)."""
  local_source, local_destination = local_path(source), local_path(destination)
  if local_source is not None and local_destination is not None:
    shutil.move(local_source, local_destination)
    return
  fs, path = _fs(source)
  fs.mv(path, _fs(destination)[1], recursive=True)


def remove(path: str) -> None:
  fs, p = _fs(path)
  fs.rm(p)


def copy_tree(local_dir: str, url: str, uploaded: dict | None = None) -> None:
  """Uploads every file under `local_dir` to the same relative path under `url`. `uploaded`
  ({path: (size, mtime)}, updated here) skips the files unchanged since the last call."""
  for root, _, files in os.walk(local_dir):
    for name in files:
      source = os.path.join(root, name)
      stat = os.stat(source)
      if uploaded is not None and uploaded.get(source) == (stat.st_size, stat.st_mtime_ns):
        continue
      relative = os.path.relpath(source, local_dir).replace(os.sep, "/")
      with open(source, "rb") as f:
        write_bytes(join(url, relative), f.read())
      if uploaded is not None:
        uploaded[source] = (stat.st_size, stat.st_mtime_ns)
