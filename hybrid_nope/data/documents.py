"""A prepared directory of byte-tokenised documents (data.source="documents").

Written once by `write` (e.g. launch/prepare_prose.py, the English prose corpus of
hybrid_nope/data/prose.py), read by the pipeline at config.data.path:

  corpus.json  MANIFEST: the corpus's name, title, licence and source, the split rule and
               eval_fraction, the vocabulary (the byte tokenizer's), the documents' sha1 and
               per split its documents, bytes and tokens.
  train/       MDS (hybrid_nope.data.mds, `write_mds`): one document per sample, `input_ids`
  eval/        (uint16: BOS, the UTF-8 bytes, EOS) and `name`, in the order given to `write`.

The split is the stdlib corpus's rule (`is_eval`, on the document's name), so it is fixed by
the names alone. Train rows pack the train documents exactly as the stdlib corpus's files are
packed (hybrid_nope.data.packing); eval rows are one document each from its first token,
padded when shorter (as TextbookChapters's), so a row's index is the position in its document.

Every read checks the directory against corpus.json (counts, token ids, the split of every
name); a missing or inconsistent file fails as a DocumentsError naming it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

from hybrid_nope.data import mds, packing, stdlib_corpus
from hybrid_nope.data.tokenizer import ByteTokenizer
from hybrid_nope.errors import UserError

MANIFEST = "corpus.json"
FORMAT = "hybrid_nope.documents"
SPLITS = stdlib_corpus.SPLITS  # ("train", "eval")
CORPUS_KEYS = ("name", "title", "licence", "source")  # What `write` is told about the corpus.
COLUMNS = {"input_ids": "ndarray:uint16", "name": "str"}  # uint16: byte ids reach EOS_ID 257.
COUNTS = ("documents", "bytes", "tokens")  # Per split, in corpus.json.

is_eval = stdlib_corpus.is_eval_path  # The split rule has one home: the stdlib corpus's.
# What corpus.json says of `is_eval`, for whoever reads the directory without this code.
SPLIT_RULE = "eval iff zlib.crc32(name.encode('utf-8')) < eval_fraction * 2**32"


class DocumentsError(UserError):
  """Documents `write` cannot split, or a directory that is not what `write` wrote."""


# ---- writing ----------------------------------------------------------------------------------

def _sha1(docs: list[tuple[str, bytes]]) -> str:
  """Of the names and bytes in order: tells one corpus from another with the same counts."""
  h = hashlib.sha1()
  for name, data in docs:
    encoded = name.encode("utf-8")
    h.update(len(encoded).to_bytes(8, "little") + encoded + len(data).to_bytes(8, "little"))
    h.update(data)
  return h.hexdigest()


def plan(docs: list[tuple[str, bytes]], eval_fraction: float,
         corpus: dict) -> tuple[dict, dict[str, list[tuple[str, bytes]]]]:
  """(the manifest `write` would write, {split: its documents in order}); checks everything
  `write` needs, so a caller can compare against a directory without writing."""
  if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) or not (
      0 < eval_fraction < 1):
    raise DocumentsError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
  bad = [k for k in CORPUS_KEYS if not (isinstance(corpus.get(k), str) and corpus[k])]
  if bad:
    raise DocumentsError(f"corpus needs non-empty strings {bad} (it names the corpus in "
                         f"corpus.json: {list(CORPUS_KEYS)}), got {corpus!r}")
  if set(corpus) - set(CORPUS_KEYS):
    raise DocumentsError(f"corpus has keys {sorted(set(corpus) - set(CORPUS_KEYS))} that "
                         f"corpus.json does not hold; expected only {list(CORPUS_KEYS)}")
  seen = set()
  for i, (name, data) in enumerate(docs):
    if not (isinstance(name, str) and name and isinstance(data, bytes) and data):
      raise DocumentsError(f"document {i}, {name!r} has an empty name or no bytes; "
                           f"expected a non-empty str name and non-empty bytes")
    if name in seen:
      raise DocumentsError(f"document names repeat: {name!r} (document {i}); each names one "
                           f"document and decides its split")
    seen.add(name)
  splits = {s: [d for d in docs if is_eval(d[0], eval_fraction) == (s == "eval")]
            for s in SPLITS}
  for split, chosen in splits.items():
    if not chosen:
      raise DocumentsError(f"eval_fraction={eval_fraction} leaves the {split!r} split of "
                           f"{len(docs)} documents empty")
  manifest = {"format": FORMAT, **{k: corpus[k] for k in CORPUS_KEYS},
              "split_rule": SPLIT_RULE, "eval_fraction": float(eval_fraction),
              "vocab_size": ByteTokenizer.vocab_size, "sha1": _sha1(docs),
              "splits": {s: {"documents": len(d), "bytes": sum(len(x) for _, x in d),
                             "tokens": sum(len(x) + 2 for _, x in d)}  # + BOS and EOS
                         for s, d in splits.items()}}
  return manifest, splits


def write(out: str, docs: list[tuple[str, bytes]], eval_fraction: float, corpus: dict) -> dict:
  """Writes the new directory `out` (module docstring) from (name, bytes) documents; returns
  its manifest. `corpus` gives CORPUS_KEYS. Written under a temporary name and renamed, so a
  failed write leaves no `out` behind."""
  manifest, splits = plan(docs, eval_fraction, corpus)
  out = os.path.normpath(out)
  if os.path.lexists(out):
    raise DocumentsError(f"{out} already exists; write() makes a new directory")
  parent = os.path.dirname(out) or "."
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
  try:
    tokenizer = ByteTokenizer()
    for split, chosen in splits.items():
      mds.write_mds(os.path.join(tmp, split), COLUMNS,
                    ({"input_ids": tokenizer.encode(data).astype(np.uint16), "name": name}
                     for name, data in chosen))
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1, sort_keys=True, ensure_ascii=False)
      f.write("\n")
    os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would hide the corpus from other users.
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return manifest


# ---- reading ----------------------------------------------------------------------------------

def read_manifest(path: str) -> dict:
  """corpus.json of the directory `path`, checked field by field."""
  file = os.path.join(path, MANIFEST)
  if not os.path.isfile(file):
    raise DocumentsError(f"{file} does not exist: expected a directory written by "
                         f"hybrid_nope.data.documents.write (e.g. launch/prepare_prose.py: "
                         f"make prose)")
  try:
    with open(file, encoding="utf-8") as f:
      manifest = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DocumentsError(f"{file} is not valid JSON: {e}") from None

  def require(ok, what):
    if not ok:
      raise DocumentsError(f"{file}: expected {what}, got {manifest!r:.300}")

  require(isinstance(manifest, dict) and manifest.get("format") == FORMAT,
          f"format {FORMAT!r} (hybrid_nope.data.documents.write's corpus.json)")
  require(all(isinstance(manifest.get(k), str) and manifest[k] for k in CORPUS_KEYS),
          f"non-empty strings {list(CORPUS_KEYS)}")
  fraction = manifest.get("eval_fraction")
  require(isinstance(fraction, float) and 0 < fraction < 1, "eval_fraction, a float in (0, 1)")
  require(manifest.get("vocab_size") == ByteTokenizer.vocab_size,
          f"vocab_size {ByteTokenizer.vocab_size} (the byte tokenizer's)")
  splits = manifest.get("splits")
  require(isinstance(splits, dict) and sorted(splits) == sorted(SPLITS) and all(
      isinstance(s, dict) and sorted(s) == sorted(COUNTS)
      and all(type(s[k]) is int and s[k] > 0 for k in COUNTS) for s in splits.values()),
          f"splits {list(SPLITS)}, each with positive int {list(COUNTS)}")
  return manifest


def _dataset(path: str, split: str, verify_hashes: bool) -> mds.MDSDataset:
  directory = os.path.join(path, split)
  try:
    ds = mds.MDSDataset(directory, verify_hashes=verify_hashes)
  except FileNotFoundError as e:  # The MDS reader's message names the file; this says whose.
    raise DocumentsError(f"{e} (the {split!r} split of the documents directory {path})") from None
  found = {name: c.encoding for name, c in ds.columns.items()}
  if found != COLUMNS:
    raise DocumentsError(f"{os.path.join(directory, mds.INDEX_BASENAME)} has columns {found}, "
                         f"expected {COLUMNS}")
  return ds


@functools.lru_cache(maxsize=8)  # A written directory never changes (write refuses to reuse one).
def _read(path: str, split: str, verify_hashes: bool) -> tuple[np.ndarray, ...]:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  manifest = read_manifest(path)
  want = manifest["splits"][split]
  ds = _dataset(path, split, verify_hashes)
  index = os.path.join(path, split, mds.INDEX_BASENAME)
  if len(ds) != want["documents"]:
    raise DocumentsError(f"{index} holds {len(ds)} documents but {os.path.join(path, MANIFEST)} "
                         f"says {want['documents']}: the directory is from two writes")
  docs = []
  for i in range(len(ds)):
    sample = ds[i]
    ids_L = sample["input_ids"]
    if not (ids_L.size >= 3 and ids_L[0] == ByteTokenizer.BOS_ID
            and ids_L[-1] == ByteTokenizer.EOS_ID and ids_L[1:-1].max() < 256):
      raise DocumentsError(f"{ds.describe(i)}: expected BOS ({ByteTokenizer.BOS_ID}), at least "
                           f"one byte id (< 256) and EOS ({ByteTokenizer.EOS_ID}), got "
                           f"{ids_L.size} ids {ids_L[:4].tolist()}..{ids_L[-2:].tolist()}")
    if is_eval(sample["name"], manifest["eval_fraction"]) != (split == "eval"):
      raise DocumentsError(f"{ds.describe(i)} ({sample['name']!r}) belongs to the other split "
                           f"by {SPLIT_RULE} with eval_fraction {manifest['eval_fraction']}")
    docs.append(ids_L.astype(np.int32))
  tokens = sum(x.size for x in docs)
  if tokens != want["tokens"]:
    raise DocumentsError(f"{index} holds {tokens} tokens but {os.path.join(path, MANIFEST)} says "
                         f"{want['tokens']}: the directory is from two writes")
  for ids_L in docs:
    ids_L.flags.writeable = False  # Shared by every caller through the cache.
  return tuple(docs)


def documents(path: str, split: str, *, verify_hashes: bool = True) -> list[np.ndarray]:
  """The token ids (int32 [L], BOS ... EOS, read-only) of each document of `split`, in order."""
  return list(_read(os.path.abspath(path), split, verify_hashes))


def _frozen(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  for array in rows.values():
    array.flags.writeable = False  # Shared by every caller through the cache.
  return rows


@functools.lru_cache(maxsize=4)
def _train_rows(path: str, seq_len: int, verify_hashes: bool) -> dict[str, np.ndarray]:
  return _frozen(packing.pack_documents(list(_read(path, "train", verify_hashes)), seq_len))


def train_rows(path: str, seq_len: int, *, verify_hashes: bool = True) -> dict[str, np.ndarray]:
  """The train documents packed as the stdlib corpus's (packing.ROW_KEYS, each [S, seq_len],
  read-only)."""
  return _train_rows(os.path.abspath(path), seq_len, verify_hashes)


@functools.lru_cache(maxsize=4)
def _eval_rows(path: str, seq_len: int, verify_hashes: bool) -> dict[str, np.ndarray]:
  # TextbookChapters's row (from its module: one home); imported here, tfds is slow to import.
  from hybrid_nope.data.textbook_chapters import chapter_row  # pylint: disable=g-import-not-at-top
  rows = [chapter_row(ids_L, seq_len) for ids_L in _read(path, "eval", verify_hashes)]
  return _frozen({k: np.stack([r[k] for r in rows]) for k in packing.ROW_KEYS})


def eval_rows(path: str, seq_len: int, *, verify_hashes: bool = True) -> dict[str, np.ndarray]:
  """One eval document per row from its first token, seq_len + 1 tokens at most, padded
  (segment 0, weight 0) when shorter: packing.ROW_KEYS, each [N documents, seq_len], read-only."""
  return _eval_rows(os.path.abspath(path), seq_len, verify_hashes)
