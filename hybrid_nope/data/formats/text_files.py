"""Documents in the files users keep text in: JSON Lines, parquet, a saved `datasets` dataset.

`data.path` names a file, a glob or a directory, local or any fsspec URL (gs://, hf://datasets/,
file://, memory://); `files` lists what it names, sorted. One document is one record's
`data.text_field` string. A reader per file gives random access to its documents, so a host
reads only the rows of its shard (loader.train_dataset):

  jsonl    one JSON object per line (.jsonl, .json); documents by byte offset (recorded by
           `scan`), each line read by a ranged read; whitespace-only lines are skipped anywhere,
           as pyarrow's reader (hence `datasets`') and pandas' skip them;
  parquet  (.parquet) documents by row group, the text column of the last few row groups kept;
  hf       a directory written by `datasets`' save_to_disk: state.json lists its arrow files
           (Arrow IPC streams) in order; a DatasetDict's directory reads its "train" split.
           Read with pyarrow (memory-mapped where local), so `datasets` is never needed; to
           stream a dataset from the Hub, read its parquet files (data.source=parquet,
           data.path=hf://datasets/NAME/...glob...).

`scan` reads a file once, in order, checking every document (a string; none missing), for the
length index (text_index.py). A bad path, an empty file, a missing or non-string field fails as
one TextDataError naming the file, the record and the key; so does a damaged file: an arrow file
state.json lists that is gone, a stream cut short, a page that does not decompress, fails its
checksum or is not UTF-8.
"""
from __future__ import annotations

import collections
import json
import threading
from typing import Iterator

import fsspec
import numpy as np

from hybrid_nope.errors import UserError

SUFFIXES = {"jsonl": (".jsonl", ".json"), "parquet": (".parquet",), "hf": (".arrow",)}
STATE, DATASET_DICT = "state.json", "dataset_dict.json"  # What save_to_disk writes.
HF_SPLIT = "train"  # The split a DatasetDict's directory is read for.
SCAN_BATCH = 1024  # Documents per list `scan` yields (tokenised together).
_CACHED_GROUPS = 4  # Parquet row groups (or arrow files) whose text a reader keeps decoded.
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # How an Arrow IPC stream ends, closed.


class TextDataError(UserError):
  """A text source's file that cannot be read as the config says; names the file and key."""


def _url(fs, path: str) -> str:
  """How a message names a file: the local path, else the URL."""
  return path if "file" in fs.protocol else fs.unstrip_protocol(path)


def files(kind: str, path: str) -> list[tuple[object, str]]:
  """(filesystem, path) of each file `path` names for `kind` (jsonl, parquet or hf: a SUFFIXES
  key, which the text source of that name passes), in sorted order."""
  if not path:
    raise TextDataError(f"config.data.path is empty: data.source={kind} reads a file, a glob "
                        f"or a directory of {'/'.join(SUFFIXES[kind])} files")
  fs, root = fsspec.core.url_to_fs(path)
  if kind == "hf":
    return [(fs, p) for p in _saved_dataset_files(fs, root, path)]
  if any(c in path for c in "*?["):
    found = sorted(fs.glob(root))
    what = "matches no files"
  elif fs.isdir(root):
    found = sorted(p for p in fs.find(root) if p.endswith(SUFFIXES[kind]))
    what = f"is a directory without {'/'.join(SUFFIXES[kind])} files"
  elif fs.exists(root):
    found, what = [root], ""
  else:
    found, what = [], "does not exist"
  if not found:
    raise TextDataError(f"config.data.path={path!r} {what}: expected a file, a glob or a "
                        f"directory of data.source={kind} files")
  return [(fs, p) for p in found]


def _saved_dataset_files(fs, root: str, path: str) -> list[str]:
  """The arrow files of the save_to_disk directory `root`, as its state.json lists them."""
  if fs.isfile(f"{root}/{DATASET_DICT}"):  # A DatasetDict: one directory per split.
    splits = json.loads(fs.cat_file(f"{root}/{DATASET_DICT}")).get("splits", [])
    if HF_SPLIT not in splits:
      raise TextDataError(f"config.data.path={path!r} is a saved DatasetDict with splits "
                          f"{splits} but no {HF_SPLIT!r}: point data.path at one split's "
                          f"directory")
    root = f"{root}/{HF_SPLIT}"
  state = f"{root}/{STATE}"
  if not fs.isfile(state):
    raise TextDataError(f"config.data.path={path!r} is not a directory written by datasets' "
                        f"save_to_disk (no {STATE} or {DATASET_DICT}); for the Hub, use "
                        f"data.source=parquet with data.path=hf://datasets/NAME/<files>")
  try:
    names = [f["filename"] for f in json.loads(fs.cat_file(state))["_data_files"]]
  except (ValueError, KeyError, TypeError) as e:
    raise TextDataError(f"{_url(fs, state)} is not datasets' state.json (its _data_files list "
                        f"of {{'filename': ...}}): {e!r}") from None
  if not names:
    raise TextDataError(f"{_url(fs, state)} lists no data files: the dataset is empty")
  present = set(fs.ls(root, detail=False))  # One listing; a name not in it is asked once more.
  missing = [n for n in names if f"{root}/{n}" not in present and not fs.exists(f"{root}/{n}")]
  if missing:
    raise TextDataError(f"{_url(fs, state)} lists {len(missing)} arrow file(s) that do not "
                        f"exist, the first {_url(fs, f'{root}/{missing[0]}')}: the saved "
                        f"dataset is incomplete; save it again (config.data.path)")
  return [f"{root}/{n}" for n in names]


def _require(ok: bool, where: str, key: str, what: str) -> None:
  if not ok:
    raise TextDataError(f"{where}: {what} (config.{key})")


def _check_text(value, where: str, field: str) -> str:
  _require(isinstance(value, str), where, "data.text_field",
           f"field {field!r} is {type(value).__name__}, expected a string")
  return value


class JsonlFile:
  """One JSON Lines file; `offsets` (int64 [n + 1], line starts) come from `scan` or a cache."""

  def __init__(self, fs, path: str, field: str):
    self.fs, self.path, self.field, self.name = fs, path, field, _url(fs, path)
    self.offsets: np.ndarray | None = None
    self._file, self._lock = None, threading.Lock()

  def _document(self, line: bytes, number: int) -> str:
    where = f"{self.name} line {number}"
    try:
      record = json.loads(line)
    except ValueError as e:
      raise TextDataError(f"{where} is not JSON ({e}): expected one JSON object per line "
                          f"(config.data.path)") from None
    _require(isinstance(record, dict) and self.field in record, where, "data.text_field",
             f"no field {self.field!r} (its fields: "
             f"{sorted(record) if isinstance(record, dict) else type(record).__name__})")
    return _check_text(record[self.field], where, self.field)

  def scan(self) -> Iterator[list[str]]:
    offsets, batch, position = [0], [], 0
    with self.fs.open(self.path, "rb") as f:
      for number, line in enumerate(f, 1):
        position += len(line)
        if not line.strip():  # Folded into the document before it (JSON allows the whitespace).
          if len(offsets) > 1:
            offsets[-1] = position
          continue
        offsets.append(position)
        batch.append(self._document(line, number))
        if len(batch) == SCAN_BATCH:
          yield batch
          batch = []
    _require(len(offsets) > 1, self.name, "data.path", "the file is empty, no documents")
    self.offsets = np.array(offsets, np.int64)
    yield batch

  def where(self, i: int) -> str:
    return f"{self.name} line {self._line_number(i)}"

  def _read(self, start: int, end: int) -> bytes:
    with self._lock:  # One open file per reader, read by ranges.
      if self._file is None:
        self._file = self.fs.open(self.path, "rb")
      self._file.seek(start)
      return self._file.read(end - start)

  def _line_number(self, i: int) -> int:
    """The line document i is on. Skipped blank lines shift it from i + 1, so the newlines
    before it are counted: a read of the file up to it, on the error and warning paths only."""
    start, end, lines = int(self.offsets[i]), int(self.offsets[i + 1]), 1
    for at in range(0, start, 1 << 20):
      lines += self._read(at, min(at + (1 << 20), start)).count(b"\n")
    own = self._read(start, end).split(b"\n")  # Blank lines before document 0 are its own.
    return lines + next((k for k, line in enumerate(own) if line.strip()), 0)

  def text(self, i: int) -> str:
    line = self._read(int(self.offsets[i]), int(self.offsets[i + 1]))
    try:
      return self._document(line, i + 1)
    except TextDataError:  # Raised again naming its true line (blank lines shift it).
      return self._document(line, self._line_number(i))


class _ColumnFile:
  """A file of record batches with a string column `field`: documents by group, the last few
  groups' columns kept. Subclasses give `group_rows` (int [G]) and `_read_group(g)`."""

  group_rows: np.ndarray
  group_name = "row group {g}"  # What a message calls group g.

  def __init__(self, fs, path: str, field: str):
    self.fs, self.path, self.field, self.name = fs, path, field, _url(fs, path)
    self._cache: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def _check_schema(self, schema) -> None:
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    _require(self.field in schema.names, self.name, "data.text_field",
             f"no column {self.field!r} (its columns: {schema.names})")
    kind = schema.field(self.field).type
    _require(pa.types.is_string(kind) or pa.types.is_large_string(kind)
             or pa.types.is_string_view(kind), self.name, "data.text_field",
             f"column {self.field!r} is {kind}, expected a string column")

  def _column(self, g: int):
    with self._lock:
      column = self._cache.get(g)
      if column is None:
        column = self._cache[g] = self._read_group_or_fail(g)
        while len(self._cache) > _CACHED_GROUPS:
          self._cache.popitem(last=False)
      self._cache.move_to_end(g)
      return column

  def _read_group_or_fail(self, g: int):
    """`_read_group(g)`, a file truncated or corrupt after its header (pyarrow's OSError or
    ArrowInvalid: a short message body, a page that does not decompress, fails its checksum or
    is not UTF-8) failing as one line naming it."""
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    try:
      column = self._read_group(g)
      column.validate(full=True)  # A string column's offsets and UTF-8, so no page is garbage.
      return column
    except (pa.ArrowException, OSError) as e:
      what = " ".join(str(e).split())
      raise TextDataError(f"{self.name} is truncated or corrupt: reading "
                          f"{self.group_name.format(g=g)} failed ({what}); replace the file "
                          f"(config.data.path)") from None

  def scan(self) -> Iterator[list[str]]:
    _require(int(np.sum(self.group_rows)) > 0, self.name, "data.path",
             "the file holds no rows, no documents")
    first = 0
    for g in range(len(self.group_rows)):
      column = self._column(g)
      if column.null_count:
        row = first + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        _check_text(None, f"{self.name} row {row}", self.field)
      texts = column.to_pylist()
      first += len(texts)
      for k in range(0, len(texts), SCAN_BATCH):
        yield texts[k:k + SCAN_BATCH]

  def where(self, i: int) -> str:
    return f"{self.name} row {i}"

  def text(self, i: int) -> str:
    starts = np.cumsum(self.group_rows) - self.group_rows  # A few groups: cheap per call.
    g = int(np.searchsorted(starts, i, side="right")) - 1
    return _check_text(self._column(g)[i - int(starts[g])].as_py(),
                       f"{self.name} row {i}", self.field)


class ParquetFile(_ColumnFile):
  def __init__(self, fs, path: str, field: str):
    super().__init__(fs, path, field)
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    try:
      # Pages written with checksums (write_page_checksum) are verified as they are read.
      self._parquet = pq.ParquetFile(fs.open(path, "rb"), page_checksum_verification=True)
    except Exception as e:  # pyarrow's ArrowInvalid and friends for a file that is not parquet.
      raise TextDataError(f"{self.name} is not a parquet file ({e}) (config.data.path)") from None
    self._check_schema(self._parquet.schema_arrow)
    meta = self._parquet.metadata
    self.group_rows = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)],
                               np.int64)

  def _read_group(self, g: int):
    return self._parquet.read_row_group(g, columns=[self.field]).column(0).combine_chunks()


class ArrowFile(_ColumnFile):
  """One arrow file of a saved dataset, the whole file one group: memory-mapped where local,
  else read whole at its first document (save_to_disk writes files of up to 500 MB)."""

  group_name = "its record batches"

  def __init__(self, fs, path: str, field: str):
    super().__init__(fs, path, field)
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    with fs.open(path, "rb") as f:
      self._check_schema(self._open(pa.PythonFile(f, mode="r")).schema)  # Its first message.
    self.group_rows = None  # Known once the table is read.

  def _open(self, source):
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    try:
      try:
        return pa.ipc.open_stream(source)  # What save_to_disk writes.
      except pa.ArrowInvalid:
        if hasattr(source, "seek"):
          source.seek(0)
        return pa.ipc.open_file(source)
    except (pa.ArrowInvalid, OSError) as e:
      raise TextDataError(f"{self.name} is not an Arrow IPC file ({e}) (config.data.path)"
                          ) from None

  def _read_group(self, g: int):
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    del g
    local = "file" in self.fs.protocol
    source = pa.memory_map(self.path) if local else pa.BufferReader(self.fs.cat_file(self.path))
    reader = self._open(source)
    column = reader.read_all().column(self.field)
    if isinstance(reader, pa.ipc.RecordBatchStreamReader):  # Cut at a batch's end reads whole.
      source.seek(source.size() - len(_END_OF_STREAM))
      if source.read() != _END_OF_STREAM:
        raise OSError("the stream stops without its end-of-stream marker")
    self.group_rows = np.array([len(column)], np.int64)
    return column

  def scan(self) -> Iterator[list[str]]:
    self._column(0)  # Reads the table: its row count.
    yield from super().scan()

  def text(self, i: int) -> str:
    self._column(0)
    return super().text(i)


READERS = {"jsonl": JsonlFile, "parquet": ParquetFile, "hf": ArrowFile}


def readers(kind: str, path: str, field: str) -> list:
  """One reader per file of `path` (`files`), schemas checked where the format has one."""
  if not isinstance(field, str) or not field:
    raise TextDataError(f"config.data.text_field={field!r} is invalid: expected the name of "
                        f"the field that holds each document's text, e.g. 'text'")
  return [READERS[kind](fs, p, field) for fs, p in files(kind, path)]
