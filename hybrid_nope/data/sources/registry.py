"""The data sources by name: the one place `data.source` is read and dispatched on.

Each entry of `SOURCES` says, for one `data.source`, how its rows are read (`rows`), what
identifies them at a resume (`fingerprint`), which tokenizer.json files it carries
(`tokenizer_files`), which of its own config keys are checked and how (`check_keys`), which
path keys it reads at start (`path_keys`), and what kind of token ids it holds. Everything else
(the loader, the fingerprint, validate, the data check, export, analysis, the launch checks)
asks this module; no other module compares `data.source` with a name.

  stdlib     the embedded demo corpus, byte-tokenised, in memory (sources/stdlib_corpus.py)
  mds        ProLong's mixture of MDS domains (sources/prolong.py), evaluated on
             TextbookChapters at eval.path (sources/textbook_chapters.py)
  documents  a prepared directory of tokenised documents with its own tokenizer.json
             (sources/documents.py; e.g. the prose corpus of sources/prose.py)
  jsonl, parquet, hf
             text files tokenised on the fly with data.tokenizer (sources/text_rows.py)

Source modules are imported where a reader runs, so asking for a name costs no grain import.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Callable, Union

import numpy as np

from hybrid_nope import config_values
from hybrid_nope.run import storage
from hybrid_nope.config_values import positive_int, require
from hybrid_nope.data.tokenization import bpe

# name -> fn(config, split, num_rows_key) -> rows: a dict of in-memory [S, T] arrays, or (train)
# an infinite grain.MapDataset of row dicts that is already shuffled.
Rows = Union[dict[str, np.ndarray], "grain.MapDataset"]  # noqa: F821


@dataclasses.dataclass(frozen=True)
class Source:
  """One `data.source`: its readers and what its token ids are."""
  name: str
  rows: Callable[..., Rows]                   # (config, split, num_rows_key) -> Rows
  fingerprint: Callable[[object], dict]       # config -> {name: JSON scalar} of its train data
  tokenizer_files: Callable[[object], list]   # config -> the tokenizer.json files it carries
  check_keys: Callable[[object, bool], None]  # (config, check_paths): its own keys, checked
  path_keys: tuple[str, ...] = ("data.path",)  # the path keys it reads at start
  byte_tokens: bool = False   # its ids are the byte tokenizer's, whatever data.tokenizer says
  text: bool = False          # text tokenised on the fly with data.tokenizer (text_rows)
  mds_mixture: bool = False   # MDS domains mixed by data.domains (samples named by shard)
  prepared: bool = False      # a prepared documents directory (corpus.json, tokenizer.json)
  eos_token: str | None = None  # the end-of-document token of the tokenizer it carries
  # Where its data comes from (data/check.py ends its message with it): the section of
  # docs/reproduce.md that says how to fetch and prepare it, and its dataset ids.
  origin: tuple[str, str] = ("Data", "")


def named(config) -> Source:
  """The Source config.data.source names; a ConfigError listing the names otherwise."""
  return SOURCES[config_values.one_of(config, "data.source", NAMES)]


def lookup(name) -> Source | None:
  """The Source of that name, or None for a name that is none (whoever asks says so)."""
  return SOURCES.get(name)


def packed_rows(config, split: str, num_rows_key: str | None = None) -> Rows:
  """Rows of `split` ("train" or "eval") from config.data.source; a source that reads eval rows
  one by one reads at most the int at `num_rows_key` of them (fewer where the split has fewer),
  or by default the eval batches' rows."""
  return named(config).rows(config, split, num_rows_key)


def byte_tokenised(config) -> bool:
  """Whether the run's token ids are the byte tokenizer's: a byte source, or a text source
  read with data.tokenizer="byte"."""
  source = named(config)
  return source.byte_tokens or (source.text and config_values.text_tokenizer(config)
                                == config_values.BYTE_TOKENIZER)


def exclude_samples(config) -> tuple[str, ...]:
  """data.exclude_samples, each entry checked (config_values.exclude_samples); empty unless
  the source names its samples by MDS shard."""
  excluded = config_values.exclude_samples(config)
  require(not excluded or named(config).mds_mixture, "data.exclude_samples", excluded,
          "() unless data.source='mds' (it names samples of MDS shards)")
  return excluded


def _check_split(split: str) -> None:
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


def _data_path(config, allowed: str) -> str:
  return config_values.string(config, "data.path", allowed, nonempty=True)


# ---- stdlib: the embedded corpus -------------------------------------------------------------

@functools.lru_cache(maxsize=4)  # ~0.5 GB per full-corpus train entry; tests reuse one seq_len
def _stdlib_packed(split: str, seq_len: int, eval_fraction: float) -> dict[str, np.ndarray]:
  from hybrid_nope.data.pipeline import packing  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.sources import stdlib_corpus  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.tokenization.tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
  tokenizer = ByteTokenizer()
  docs = stdlib_corpus.documents(split, eval_fraction)
  rows = packing.pack_documents([tokenizer.encode(data) for _, data in docs], seq_len)
  for array in rows.values():
    array.flags.writeable = False  # shared by every caller through the cache
  return rows


def _stdlib_rows(config, split: str, num_rows_key: str | None = None) -> dict[str, np.ndarray]:
  del num_rows_key  # The whole split is in memory; callers take the rows they need.
  return _stdlib_packed(split, positive_int(config, "data.seq_len"),
                        config_values.eval_fraction(config))


def _stdlib_keys(config, check_paths: bool) -> None:
  del check_paths  # Nothing to fetch.
  config_values.eval_fraction(config)


def _in_memory_fingerprint(config) -> dict:
  """The rows themselves identify an in-memory source."""
  rows = packed_rows(config, "train")
  return {"train.rows": len(rows["inputs"]),
          "train.tokens_sha1": sha1(rows["inputs"], rows["segment_ids"])}


def _stdlib_fingerprint(config) -> dict:
  return {**_in_memory_fingerprint(config), "data.eval_fraction": config.data.eval_fraction}


# ---- documents: a prepared directory ---------------------------------------------------------

def _documents_rows(config, split: str, num_rows_key: str | None = None):
  """The prepared directory at data.path: train documents packed as stdlib's, eval documents
  one per row (hybrid_nope.data.sources.documents); all in memory."""
  del num_rows_key
  from hybrid_nope.data.sources import documents  # pylint: disable=g-import-not-at-top
  path = _data_path(config, "a prepared documents directory")
  seq_len = positive_int(config, "data.seq_len")
  verify = config_values.verify_hashes(config)
  _check_split(split)
  read = documents.train_rows if split == "train" else documents.eval_rows
  return read(path, seq_len, verify_hashes=verify)


def _documents_tokenizer(config) -> list[str]:
  from hybrid_nope.data.sources import documents  # pylint: disable=g-import-not-at-top
  found = storage.join(_data_path(config, "a prepared documents directory"), documents.TOKENIZER)
  return [found] if storage.exists(found) else []


def _documents_keys(config, check_paths: bool) -> None:
  if check_paths:
    from hybrid_nope.data.sources import documents  # pylint: disable=g-import-not-at-top
    path = config.data.path
    require(bool(path) and os.path.isfile(os.path.join(path, documents.MANIFEST)),
            "data.path", path, f"a directory prepared by launch/prepare_prose.py (with "
            f"{documents.MANIFEST}, train/ and eval/): run `make prose`, or pass "
            f"--config.data.path=")


# ---- mds: ProLong's mixture, TextbookChapters eval -------------------------------------------

def train_mixture(config):
  """The ProLong mixture (`prolong.build_mixture`) of config.data's domains: a
  `mixture.Mixture` whose `domains` are `prolong.DomainRows` (data/check.py reports them)."""
  from hybrid_nope.data.sources import prolong  # pylint: disable=g-import-not-at-top
  cache_dir = config_values.string(config, "data.cache_dir", "a path or '' (the default cache)")
  return prolong.build_mixture(
      config_values.value(config, "data.path"), config_values.value(config, "data.domains"),
      seq_len=positive_int(config, "data.seq_len"),
      document_masking=config_values.boolean(config, "data.document_masking"),
      vocab_size=positive_int(config, "model.vocab_size"), seed=config_values.data_seed(config),
      cache_dir=cache_dir or None, verify_hashes=config_values.verify_hashes(config),
      exclude_samples=exclude_samples(config))


def _mds_rows(config, split: str, num_rows_key: str | None = None):
  """Train split: the ProLong mixture, an infinite grain MapDataset of rows (element k is the
  k-th row of the global stream). Eval split: TextbookChapters rows, in memory (the first rows
  of a fixed order: as many as the eval batches need, or at most the int at `num_rows_key`)."""
  _check_split(split)
  if split == "train":
    import grain  # pylint: disable=g-import-not-at-top
    return grain.MapDataset.source(train_mixture(config))
  from hybrid_nope.data.sources import textbook_chapters  # pylint: disable=g-import-not-at-top
  seq_len = positive_int(config, "data.seq_len")
  vocab_size = positive_int(config, "model.vocab_size")
  path = config_values.string(config, "eval.path", "the prepared TextbookChapters directory",
                              nonempty=True)
  if num_rows_key is None:
    num_rows = positive_int(config, "eval.batch_size") * positive_int(config, "eval.num_batches")
    return textbook_chapters.eval_rows(path, seq_len=seq_len, num_rows=num_rows,
                                       vocab_size=vocab_size)
  return textbook_chapters.eval_rows(path, seq_len=seq_len,
                                     num_rows=positive_int(config, num_rows_key),
                                     vocab_size=vocab_size, at_most=True)


def _mds_tokenizer(config) -> list[str]:
  """The tokenizer.json in data.path (put there by whoever prepared the domains) and in the
  prepared eval directory (textbook_chapters copies the --tokenizer it tokenised with)."""
  from hybrid_nope.data.sources import textbook_chapters  # pylint: disable=g-import-not-at-top
  places = [_data_path(config, "a directory")]
  eval_path = config_values.string(config, "eval.path",
                                   "the prepared TextbookChapters directory", nonempty=True)
  places.append(textbook_chapters.dataset_dir(eval_path))
  return [p for p in (storage.join(d, "tokenizer.json") for d in places) if storage.exists(p)]


def _mds_fingerprint(config) -> dict:
  return {"data.document_masking": config.data.document_masking, "eval.path": config.eval.path,
          **mds_domains(config)}


def mds_domains(config) -> dict:
  """Per domain read: the sha1 of its index.json (shard names, sizes, hashes, sample counts)
  and its sample count; the samples data.exclude_samples skips."""
  from hybrid_nope.data.formats import mds  # pylint: disable=g-import-not-at-top
  from hybrid_nope.data.pipeline import mixture  # pylint: disable=g-import-not-at-top
  out = {"data.path": absolute(config.data.path)}
  excluded = exclude_samples(config)
  if excluded:  # Absent when empty, as in fingerprints written before the key existed.
    out["data.exclude_samples"] = ",".join(sorted(excluded))
  for spec in mixture.parse_domains(config.data.domains):
    if spec.weight == 0:
      continue
    raw = storage.read_bytes(storage.join(config.data.path, spec.name, mds.INDEX_BASENAME))
    out[f"domain.{spec.name}.weight"] = spec.weight
    out[f"domain.{spec.name}.index_sha1"] = hashlib.sha1(raw).hexdigest()
    out[f"domain.{spec.name}.samples"] = sum(int(s.get("samples", 0))
                                             for s in json.loads(raw).get("shards", []))
  return out


def _mds_keys(config, check_paths: bool) -> None:
  from hybrid_nope.data.pipeline import mixture  # pylint: disable=g-import-not-at-top
  mixture.parse_domains(config_values.value(config, "data.domains"))
  if check_paths:
    d = config.data
    require(bool(d.path) and storage.isdir(d.path), "data.path", d.path,
            "an existing directory of MDS training data (e.g. ProLong); pass --config.data.path=")
    require(bool(config.eval.path) and os.path.exists(config.eval.path), "eval.path",
            config.eval.path, "an existing TextbookChapters eval set; pass --config.eval.path=")


# ---- jsonl, parquet, hf: text tokenised on the fly -------------------------------------------

def _text_rows(config, split: str, num_rows_key: str | None = None):
  from hybrid_nope.data.sources import text_rows  # pylint: disable=g-import-not-at-top
  return text_rows.text_rows(config, split, num_rows_key)


def _text_fingerprint(config) -> dict:
  from hybrid_nope.data.sources import text_rows  # pylint: disable=g-import-not-at-top
  d = config.data
  return {"data.document_masking": d.document_masking, "data.eval_fraction": d.eval_fraction,
          "data.path": absolute(d.path), **text_rows.corpus(config).fingerprint()}


def _text_tokenizer(config) -> list[str]:
  return [] if byte_tokenised(config) else [config_values.text_tokenizer(config)]


def _text_keys(config, check_paths: bool) -> None:
  del check_paths  # The files are listed when the corpus opens (text_files names the path).
  config_values.eval_fraction(config)
  config_values.string(config, "data.text_field",
                       "the field holding each document's text, e.g. 'text'", nonempty=True)
  config_values.text_tokenizer(config)
  d = config.data
  require(bool(d.path), "data.path", d.path, f"a file, glob or directory of data.source="
          f"{d.source} files (local or a URL); pass --config.data.path=")


def _none(config) -> list:
  del config
  return []


_TEXT = dict(rows=_text_rows, fingerprint=_text_fingerprint, tokenizer_files=_text_tokenizer,
             check_keys=_text_keys, text=True)
SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("stdlib", _stdlib_rows, _stdlib_fingerprint, _none, _stdlib_keys, path_keys=(),
           byte_tokens=True),
    Source("mds", _mds_rows, _mds_fingerprint, _mds_tokenizer, _mds_keys,
           path_keys=("data.path", "eval.path"), mds_mixture=True, origin=(
               "Data", "ProLong is princeton-nlp/prolong-data-64K (data.path), TextbookChapters "
               "princeton-nlp/TextbookChapters prepared by "
               "hybrid_nope.data.sources.textbook_chapters (eval.path), the tokenizer.json a "
               "Llama-3 one such as meta-llama/Meta-Llama-3-8B's")),
    Source("documents", _documents_rows, _in_memory_fingerprint, _documents_tokenizer,
           _documents_keys, prepared=True, eos_token=bpe.EOS_TOKEN,
           origin=("A second corpus: English prose",
                   "`make prose` prepares it (launch/prepare_prose.py)")),
    *(Source(name, **_TEXT) for name in ("jsonl", "parquet", "hf")))}
NAMES = tuple(SOURCES)


def sha1(*arrays: np.ndarray) -> str:
  h = hashlib.sha1()
  for a in arrays:
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def absolute(path: str) -> str:
  """A local path made absolute (a relative one names other data from another directory)."""
  return path if storage.is_url(path) else os.path.abspath(path)
