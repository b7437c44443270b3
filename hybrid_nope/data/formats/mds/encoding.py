"""MDS column encodings and the shared constants: parse an encoding, decode and encode a value,
byte for byte as streaming 0.13 does (the layout is in the package docstring)."""

from __future__ import annotations

import dataclasses
import decimal
import json
from typing import Any

import numpy as np

from hybrid_nope.errors import UserError

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


class HeaderError(ValueError):
  """A malformed ndarray header; `sample` is the position of the first bad one in the batch."""

  def __init__(self, sample: int, message: str):
    super().__init__(message)
    self.sample = sample


_ITEMSIZES = np.zeros(256, np.int64)  # Value dtype code -> itemsize (0 = unknown code).
for _code, _name in _VALUE_DTYPE_CODES.items():
  _ITEMSIZES[_code] = np.dtype(_name).itemsize


def _check(bad: np.ndarray, message) -> None:
  if np.any(bad):
    first = int(np.argmax(bad))
    raise HeaderError(first, message(first))


def ndarray_headers(column: Column, u8: np.ndarray, start: np.ndarray, size: np.ndarray):
  """Reads the headers of an ndarray column in many samples at once (the one header decoder).

  `start`, `size`: int64 arrays, where each sample's value lies in `u8`. Returns int64 arrays
  (codes, ndim, shape_code, data_start): the value dtype codes (None when the encoding fixes the
  dtype), the number of dimensions, the code of the shape's integer type (None when the encoding
  fixes the shape; its dims start at data_start − ndim · 2**shape_code) and where the values
  begin. HeaderError names the first sample whose header does not fit its bytes.
  """
  name, end, offset = column.name, start + size, start
  codes = shape_code = None
  if column.dtype is None:
    codes = np.where(size >= 1, u8[np.minimum(start, len(u8) - 1)], 0).astype(np.int64)
    _check(_ITEMSIZES[codes] == 0,
           lambda i: f"column {name!r}: bad ndarray dtype code {int(codes[i]) if size[i] else None}")
    offset = offset + 1
  if column.shape is None:
    _check(offset >= end, lambda i: f"column {name!r}: ndarray header is cut short")
    byte = u8[offset].astype(np.int64)
    shape_code, ndim = byte & 3, byte >> 2
    offset = offset + 1 + ndim * (1 << shape_code)
    _check(offset > end, lambda i: f"column {name!r}: ndarray shape is cut short")
  else:
    ndim = np.full(len(start), len(column.shape), np.int64)
  return codes, ndim, shape_code, offset


def ndarray_itemsizes(column: Column, codes) -> np.ndarray | int:
  return column.dtype.itemsize if codes is None else _ITEMSIZES[codes]


def decode_value(column: Column, buf, start: int, size: int) -> Any:
  """Decodes one column value at buf[start:start+size]. ValueError if the bytes are malformed."""
  end = start + size
  kind = column.kind
  if kind == "ndarray":
    codes, ndim, shape_code, offset = ndarray_headers(
        column, np.frombuffer(buf, np.uint8), np.array([start]), np.array([size]))
    offset, ndim = int(offset[0]), int(ndim[0])
    dtype = column.dtype or np.dtype(_VALUE_DTYPE_CODES[int(codes[0])])
    shape = column.shape
    if shape is None:
      shape_dtype = np.dtype(_SHAPE_DTYPES[int(shape_code[0])])
      shape = tuple(int(d) for d in np.frombuffer(buf, shape_dtype, ndim,
                                                   offset - ndim * shape_dtype.itemsize))
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


def encode_value(column: Column, value: Any) -> bytes:
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


