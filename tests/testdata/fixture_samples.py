"""The samples behind the committed MDS fixtures, shared by the script that wrote them
(make_mds_fixtures.py, run with mosaicml-streaming's MDSWriter) and by the tests that read them.

Pure arithmetic on numpy (no random generators), so numpy 2.1 (the fixture venv) and the
project's numpy produce identical values. Token ids are ByteTokenizer ids (bytes 0..255,
BOS 256, EOS 257), so tiny test models (vocab_size 258) train on the fixtures.
"""

import base64
import decimal

import numpy as np

BOS, EOS = 256, 257
WORDS = ("the", "window", "attention", "recency", "global", "local", "layer", "position",
         "model", "residual", "norm", "signal", "token", "sequence", "profile", "gap", "floor",
         "lag", "query", "key", "value", "mixture", "chapter", "proof", "lemma", "theorem")

# ---- every encoding ----------------------------------------------------------------------------

ENCODING_COLUMNS = {
    "nd_any": "ndarray", "nd_u32": "ndarray:uint32", "nd_i16_2x3": "ndarray:int16:2,3",
    "nd_f64_4": "ndarray:float64:4",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "i8": "int8",
    "i16": "int16", "i32": "int32", "i64": "int64", "f16": "float16", "f32": "float32",
    "f64": "float64", "int": "int", "str": "str", "bytes": "bytes", "json": "json",
    "str_int": "str_int", "str_float": "str_float", "str_decimal": "str_decimal",
}
_ND_DTYPES = ("uint32", "int8", "uint16", "int16", "float16", "uint8", "int32", "float32",
              "uint64", "int64", "float64")
_ND_SHAPES = ((5,), (2, 3), (1, 2, 2), (300,), (4, 1), (70000,), (3,), (2, 2, 2, 2), (1,),
              (7,), (6, 2))


def encoding_samples():
  """11 samples covering each dtype of the generic ndarray, shape dtypes uint8/16/32, and
  edge values of every scalar encoding."""
  samples = []
  for i in range(11):
    dtype, shape = np.dtype(_ND_DTYPES[i]), _ND_SHAPES[i]
    count = int(np.prod(shape))
    nd_any = ((np.arange(count, dtype=np.int64) * (i + 3)) % 97).astype(dtype).reshape(shape)
    if dtype.kind in "iu":
      nd_any.flat[0] = np.iinfo(dtype).max
    samples.append({
        "nd_any": nd_any,
        "nd_u32": (np.arange(1 + 3 * i, dtype=np.uint64) * 2654435761 % 2**32).astype(np.uint32),
        "nd_i16_2x3": (np.arange(6, dtype=np.int16) - 3 * i).reshape(2, 3),
        "nd_f64_4": np.arange(4, dtype=np.float64) / (i + 1),
        "u8": 255 - i, "u16": 65535 - i, "u32": 2**32 - 1 - i, "u64": 2**64 - 1 - i,
        "i8": -128 + i, "i16": -32768 + i, "i32": -2**31 + i, "i64": -2**63 + i,
        "f16": i / 4, "f32": i / 3, "f64": -i / 7,
        "int": (-1) ** i * 2**62 + i,
        "str": ["", "ascii", "Grüße, 世界 🙂", "line\nbreak\x00nul"][i % 4] * (i // 4 + 1),
        "bytes": bytes(range(i * 20 % 256, i * 20 % 256 + i)),
        "json": [None, {"a": [1, 2.5, "x"], "b": {"c": True}}, [], "s", 3, {"ü": None}][i % 6],
        "str_int": 10**30 * (-1) ** i + i,
        "str_float": i / 9,
        "str_decimal": decimal.Decimal(f"{i}.{'0' * i}1"),
    })
  return samples


# ---- ProLong-like token data -------------------------------------------------------------------

def document(d: int) -> np.ndarray:
  """Document d as uint32 ids: BOS, 10..89 pseudo-words, EOS."""
  n_words = 10 + (d * 37) % 80
  text = " ".join(WORDS[(d * 7 + k * k * 13 + k) % len(WORDS)] for k in range(n_words))
  text = f"{d}: {text}."
  ids = np.frombuffer(text.encode(), np.uint8).astype(np.uint32)
  return np.concatenate([[BOS], ids, [EOS]]).astype(np.uint32)


def packed_samples(domain: str, first_doc: int, num_samples: int, sample_len: int):
  """ProLong-style packed samples: documents concatenated, cut at sample_len (the last
  document of a sample is truncated, the next sample starts a new one); `indices` holds each
  document's [start, end)."""
  samples, d = [], first_doc
  for _ in range(num_samples):
    parts, indices, length = [], [], 0
    while length < sample_len:
      doc = document(d)[:sample_len - length]
      d += 1
      indices.append((length, length + doc.size))
      parts.append(doc)
      length += doc.size
    samples.append({"input_ids": np.concatenate(parts).astype(np.uint32),
                    "indices": np.array(indices, np.uint32), "domain": domain})
  return samples


def raw_samples(domain: str, first_doc: int, num_docs: int):
  """ProLong raw (unpacked) release: one document per sample with its length."""
  samples = []
  for d in range(first_doc, first_doc + num_docs):
    doc = document(d)
    samples.append({"input_ids": doc, "length": int(doc.size), "domain": domain})
  return samples


PACKED_COLUMNS = {"input_ids": "ndarray:uint32", "indices": "ndarray:uint32", "domain": "str"}
RAW_COLUMNS = {"input_ids": "ndarray:uint32", "length": "int32", "domain": "str"}
SAMPLE_LEN = 512  # ProLong 64K uses 65536
# name -> (columns, samples, writer kwargs). The committed ProLong-like directory.
PROLONG_DOMAINS = {
    "book-65536": (PACKED_COLUMNS, lambda: packed_samples("book-65536", 0, 6, SAMPLE_LEN),
                   dict(size_limit=4096)),
    "thestackv1_concat_by_repo-65536": (
        PACKED_COLUMNS,
        lambda: packed_samples("thestackv1_concat_by_repo-65536", 1000, 4, SAMPLE_LEN),
        dict(size_limit=4096, compression="zstd")),
    "fineweb-edu": (RAW_COLUMNS, lambda: raw_samples("fineweb-edu", 2000, 40),
                    dict(size_limit=8192)),
}
ENCODING_DATASETS = {
    "encodings": dict(size_limit=4096, hashes=["sha1"]),
    "encodings_zstd": dict(size_limit=1 << 20, compression="zstd:7", hashes=["md5", "sha256"]),
}


def chapters(num: int = 12):
  """TextbookChapters-like records (text field), of very different lengths."""
  out = []
  for c in range(num):
    words = " ".join(WORDS[(c * 5 + k * 3 + k * k) % len(WORDS)] for k in range(20 + 60 * c))
    out.append({"title": f"Chapter {c}", "text": f"Chapter {c}. {words.capitalize()}."})
  return out


def describe(value):
  """A JSON-able, exact description of a decoded value: its type, dtype, shape and content.

  make_mds_fixtures.py stores this for what streaming's MDSReader decodes; the tests compare
  it with what hybrid_nope.data.formats.mds decodes.
  """
  if isinstance(value, np.ndarray):
    return {"type": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
            "hex": value.tobytes().hex(), }
  if isinstance(value, np.generic):
    return {"type": type(value).__name__, "hex": value.tobytes().hex()}
  if isinstance(value, bytes):
    return {"type": "bytes", "b64": base64.b64encode(value).decode()}
  if isinstance(value, (decimal.Decimal, float, int, str)) and not isinstance(value, bool):
    return {"type": type(value).__name__, "repr": repr(value)}
  return {"type": type(value).__name__, "json": value}
