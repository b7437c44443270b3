"""A prepared directory of tokenised documents (data.source="documents").

Written once by `write` (e.g. launch/prepare_prose.py, the English prose corpus of
hybrid_nope/data/sources/prose.py), read by the pipeline at config.data.path:

  corpus.json     MANIFEST: the corpus's name, title, licence and source, the split rule and
                  eval_fraction, the vocabulary (vocab_size, and `tokenizer`: its file, sha1,
                  BOS and EOS ids), the documents' sha1 and per split its documents, bytes and
                  tokens.
  tokenizer.json  TOKENIZER, the one the ids are of (hybrid_nope.data.tokenization.bpe: byte-level BPE with
                  BOS and EOS tokens; the prose corpus's is trained on its train split).
  train/          MDS (hybrid_nope.data.formats.mds, `write_mds`): one document per sample, `input_ids`
  eval/           (uint16: BOS, the text's ids, EOS) and `name`, in the order given to `write`.

A directory written before tokenizer.json existed (byte ids, vocab_size 258, no `tokenizer` in
corpus.json) is refused in one line naming it: remove it and prepare it again.

The split is the stdlib corpus's rule (`is_eval`, on the document's name), so it is fixed by
the names alone. Train rows pack the train documents exactly as the stdlib corpus's files are
packed (hybrid_nope.data.pipeline.packing); eval rows are one document each from its first token,
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

from hybrid_nope.data.tokenization import bpe
from hybrid_nope.data.formats import mds
from hybrid_nope.data.pipeline import packing
from hybrid_nope.data.sources import stdlib_corpus
from hybrid_nope.errors import UserError

MANIFEST = "corpus.json"
TOKENIZER = "tokenizer.json"
FORMAT = "hybrid_nope.documents"
SPLITS = stdlib_corpus.SPLITS  # ("train", "eval")
CORPUS_KEYS = ("name", "title", "licence", "source")  # What `write` is told about the corpus.
COLUMNS = {"input_ids": "ndarray:uint16", "name": "str"}  # uint16: vocab_size <= 2**16.
MAX_VOCAB = 2**16
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


def check_eval_fraction(eval_fraction) -> None:
  if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) or not (
      0 < eval_fraction < 1):
    raise DocumentsError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")


def plan(docs: list[tuple[str, bytes]], eval_fraction: float, corpus: dict,
         tokenizer: str) -> tuple[dict, dict[str, list[tuple[str, np.ndarray]]]]:
  """(the manifest `write` would write, {split: (name, token ids) of its documents in order});
  checks everything `write` needs, so a caller can compare against a directory without writing.
  `tokenizer` is the text of the tokenizer.json (hybrid_nope.data.tokenization.bpe) that encodes them."""
  check_eval_fraction(eval_fraction)
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
  encoder = bpe.Tokenizer(tokenizer, "the tokenizer given to documents.write")
  if encoder.vocab_size > MAX_VOCAB:
    raise DocumentsError(f"the tokenizer has {encoder.vocab_size} ids; the shards hold uint16, "
                         f"at most {MAX_VOCAB}")
  splits = {s: [d for d in docs if is_eval(d[0], eval_fraction) == (s == "eval")]
            for s in SPLITS}
  for split, chosen in splits.items():
    if not chosen:
      raise DocumentsError(f"eval_fraction={eval_fraction} leaves the {split!r} split of "
                           f"{len(docs)} documents empty")
  manifest = {"format": FORMAT, **{k: corpus[k] for k in CORPUS_KEYS},
              "split_rule": SPLIT_RULE, "eval_fraction": float(eval_fraction),
              "vocab_size": encoder.vocab_size, "sha1": _sha1(docs),
              "tokenizer": {"file": TOKENIZER, "bos_id": encoder.bos_id,
                            "eos_id": encoder.eos_id,
                            "sha1": hashlib.sha1(tokenizer.encode("utf-8")).hexdigest()},
              "splits": {s: {"documents": len(d), "bytes": sum(len(x) for _, x in d)}
                         for s, d in splits.items()}}
  encoded = {s: [(name, encoder.encode_document(data)) for name, data in d]
             for s, d in splits.items()}
  for s, d in encoded.items():
    manifest["splits"][s]["tokens"] = sum(ids_L.size for _, ids_L in d)  # With BOS and EOS.
  return manifest, encoded


def write(out: str, docs: list[tuple[str, bytes]], eval_fraction: float, corpus: dict,
          tokenizer: str) -> dict:
  """Writes the new directory `out` (module docstring) from (name, bytes) documents encoded
  with `tokenizer` (a tokenizer.json's text, saved as TOKENIZER); returns its manifest.
  `corpus` gives CORPUS_KEYS. Written under a temporary name and renamed, so a failed write
  leaves no `out` behind."""
  manifest, splits = plan(docs, eval_fraction, corpus, tokenizer)
  out = os.path.normpath(out)
  if os.path.lexists(out):
    raise DocumentsError(f"{out} already exists; write() makes a new directory")
  parent = os.path.dirname(out) or "."
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
  try:
    for split, chosen in splits.items():
      mds.write_mds(os.path.join(tmp, split), COLUMNS,
                    ({"input_ids": ids_L.astype(np.uint16), "name": name}
                     for name, ids_L in chosen))
    with open(os.path.join(tmp, TOKENIZER), "w", encoding="utf-8") as f:
      f.write(tokenizer)
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
                         f"hybrid_nope.data.sources.documents.write (e.g. launch/prepare_prose.py: "
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
          f"format {FORMAT!r} (hybrid_nope.data.sources.documents.write's corpus.json)")
  require(all(isinstance(manifest.get(k), str) and manifest[k] for k in CORPUS_KEYS),
          f"non-empty strings {list(CORPUS_KEYS)}")
  fraction = manifest.get("eval_fraction")
  require(isinstance(fraction, float) and 0 < fraction < 1, "eval_fraction, a float in (0, 1)")
  if isinstance(manifest, dict) and "tokenizer" not in manifest:
    raise DocumentsError(f"{path} holds byte-tokenised documents prepared before "
                         f"{TOKENIZER} existed (its {MANIFEST} names no tokenizer): remove it and "
                         f"prepare it again (`make prose` for the prose corpus)")
  vocab = manifest.get("vocab_size")
  require(type(vocab) is int and bpe.MIN_VOCAB <= vocab <= MAX_VOCAB,
          f"vocab_size, an int in [{bpe.MIN_VOCAB}, {MAX_VOCAB}]")
  about = manifest.get("tokenizer")
  require(isinstance(about, dict) and about.get("file") == TOKENIZER
          and isinstance(about.get("sha1"), str) and all(
              type(about.get(k)) is int and 0 <= about[k] < vocab for k in ("bos_id", "eos_id")),
          f"tokenizer {{file: {TOKENIZER!r}, sha1, bos_id, eos_id (ids below vocab_size)}}")
  splits = manifest.get("splits")
  require(isinstance(splits, dict) and sorted(splits) == sorted(SPLITS) and all(
      isinstance(s, dict) and sorted(s) == sorted(COUNTS)
      and all(type(s[k]) is int and s[k] > 0 for k in COUNTS) for s in splits.values()),
          f"splits {list(SPLITS)}, each with positive int {list(COUNTS)}")
  return manifest


def read_tokenizer(path: str) -> bpe.Tokenizer:
  """The directory's TOKENIZER, checked against its corpus.json (sha1, BOS, EOS, size)."""
  manifest = read_manifest(path)
  file = os.path.join(path, TOKENIZER)
  try:
    with open(file, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise DocumentsError(f"{file} cannot be read ({e.__class__.__name__}): the tokenizer of "
                         f"{os.path.join(path, MANIFEST)}; prepare the directory again") from None
  about = manifest["tokenizer"]
  if hashlib.sha1(text.encode("utf-8")).hexdigest() != about["sha1"]:
    raise DocumentsError(f"{file} is not the tokenizer {os.path.join(path, MANIFEST)} names "
                         f"(sha1 {about['sha1']}): the directory is from two writes")
  tokenizer = bpe.Tokenizer(text, file)
  found = (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id)
  want = (manifest["vocab_size"], about["bos_id"], about["eos_id"])
  if found != want:
    raise DocumentsError(f"{file} has (vocab_size, BOS, EOS) {found}, but "
                         f"{os.path.join(path, MANIFEST)} says {want}")
  return tokenizer


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
  read_tokenizer(path)  # Present and the one corpus.json names.
  bos, eos = manifest["tokenizer"]["bos_id"], manifest["tokenizer"]["eos_id"]
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
    if not (ids_L.size >= 3 and ids_L[0] == bos and ids_L[-1] == eos
            and ids_L.max() < manifest["vocab_size"]):
      raise DocumentsError(f"{ds.describe(i)}: expected BOS ({bos}), at least one id below "
                           f"vocab_size {manifest['vocab_size']} and EOS ({eos}), got "
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
  from hybrid_nope.data.sources.textbook_chapters import chapter_row  # pylint: disable=g-import-not-at-top
  rows = [chapter_row(ids_L, seq_len) for ids_L in _read(path, "eval", verify_hashes)]
  return _frozen({k: np.stack([r[k] for r in rows]) for k in packing.ROW_KEYS})


def eval_rows(path: str, seq_len: int, *, verify_hashes: bool = True) -> dict[str, np.ndarray]:
  """One eval document per row from its first token, seq_len + 1 tokens at most, padded
  (segment 0, weight 0) when shorter: packing.ROW_KEYS, each [N documents, seq_len], read-only."""
  return _eval_rows(os.path.abspath(path), seq_len, verify_hashes)
